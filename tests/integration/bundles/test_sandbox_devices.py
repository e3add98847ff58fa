"""Shipped code gets the GPU as the operator's code does: a bundle's pytest run and its custom
handler run in the bundle sandbox (worker/sandbox.py) with the GPU device nodes bound into their
fresh ``/dev`` and the worker's GPU choice (``CUDA_VISIBLE_DEVICES``) in their scrubbed
environment. Without them CUDA is unavailable inside and a submitter's GPU tests skip silently,
or see every GPU of the machine.

As in test_confinement_devices.py, this machine has no GPU: the device list is replaced by one
naming ``/dev/nvidia0`` and a character device this host has but bwrap's fresh ``/dev`` does not,
and the real sandboxed child reports bwrap's command line (PID 1 of its namespace), whether the
host's device is there, and its ``CUDA_VISIBLE_DEVICES``. With an empty list the device is absent,
which shows the probe is not vacuous."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest

from distributed_testing.worker.executors import CustomExecutor, TaskContext, TestExecutor
from distributed_testing.worker.executors import custom as custom_module
from distributed_testing.worker.executors import test as test_module
from distributed_testing.worker.sandbox import Sandbox, available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

HOST_DEVICE = next((d for d in ("/dev/fuse", "/dev/kvm", "/dev/loop-control", "/dev/vsock") if Path(d).exists()), None)
needs_device = pytest.mark.skipif(HOST_DEVICE is None, reason="no character device here to stand for a GPU node")

PROBE = '''
import os

def probe():
    argv = open("/proc/1/cmdline", "rb").read().decode().split("\\0")
    binds = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--dev-bind-try"]
    return {{"binds": binds, "present": os.path.exists({device!r}),
             "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}}
'''
TEST = PROBE + '''
def test_gpu_nodes_are_bound():
    seen = probe()
    assert seen == {expected!r}, seen
'''
HANDLER = PROBE + '''
def run(parameters, ctx):
    return probe()
'''


def _shipped(tmp_path: Path, name: str, files: dict[str, str], type_: str, config: dict[str, object]) -> TaskContext:
    root = tmp_path / name / "bundle"
    root.mkdir(parents=True)
    for file, text in files.items():
        (root / file).write_text(text)
    scratch = tmp_path / name / "scratch"
    scratch.mkdir()
    return TaskContext(f"t-{name}", 1, type_, config, timeout_s=60, test_root=root, bundle_root=root,
                       scratch_dir=scratch, sandbox=Sandbox())


def _devices(monkeypatch: pytest.MonkeyPatch, devices: Sequence[str]) -> None:
    for module in (test_module, custom_module):
        monkeypatch.setattr(module, "gpu_devices", lambda: list(devices))


@needs_device
@pytest.mark.parametrize("gpu", [True, False], ids=["gpu-nodes", "none"])
async def test_a_shipped_pytest_run_gets_the_gpu_nodes_and_the_workers_gpu_choice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu: bool) -> None:
    assert HOST_DEVICE is not None
    devices = ["/dev/nvidia0", HOST_DEVICE] if gpu else []
    _devices(monkeypatch, devices)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # the worker's choice, read when the executor is made
    expected = {"binds": devices, "present": gpu, "visible": "1"}
    ctx = _shipped(tmp_path, "t", {"test_gpu_probe.py": textwrap.dedent(TEST.format(device=HOST_DEVICE,
                                                                                    expected=expected))},
                   "test", {"test_file": "test_gpu_probe.py"})
    ex = TestExecutor(extra_env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    outcome = await ex.run(ctx)
    assert outcome.status == "succeeded", outcome.output.get("stdout_tail")


@needs_device
async def test_a_shipped_custom_handler_gets_the_gpu_nodes_and_the_workers_gpu_choice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert HOST_DEVICE is not None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    ex = CustomExecutor(1, use_entry_points=False)
    outputs = {}
    for name, devices in (("gpu", ["/dev/nvidia0", HOST_DEVICE]), ("none", [])):
        _devices(monkeypatch, devices)
        ctx = _shipped(tmp_path, name, {"op_gpu.py": HANDLER.format(device=HOST_DEVICE)}, "custom",
                       {"name": "op_gpu:run"})
        outcome = await ex.run(ctx)
        assert outcome.status == "succeeded", outcome
        outputs[name] = outcome.output
    assert outputs["gpu"] == {"binds": ["/dev/nvidia0", HOST_DEVICE], "present": True, "visible": "0"}
    assert outputs["none"] == {"binds": [], "present": False, "visible": "0"}
