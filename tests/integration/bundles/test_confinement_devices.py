"""The GPU device nodes reach every confined child of the operator's tasks (worker/confine.py):
a pytest run and a custom pool child, as the benchmark child and training ranks already had them.
Without them CUDA is unavailable in the child and an operator's GPU tests skip silently.

This machine has no GPU, so the device list (``sandbox.gpu_devices``, ``/dev/nvidia*`` and
``/dev/dri`` where they exist) is replaced by one naming ``/dev/nvidia0`` and a character device
this host does have but bwrap's fresh ``/dev`` does not: inside the real confined child, bwrap's
own command line (``/proc/1/cmdline``, PID 1 of the child's namespace) shows the bind requested,
and the host's device is there. With an empty list (a machine without GPU nodes) it is not,
which shows the probe is not vacuous."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest

from distributed_testing.config import WorkerConfig
from distributed_testing.worker import confine
from distributed_testing.worker.executors import CustomExecutor, TaskContext, TestExecutor
from distributed_testing.worker.executors import pool as pool_module
from distributed_testing.worker.executors import test as test_module
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

HOST_DEVICE = next((d for d in ("/dev/fuse", "/dev/kvm", "/dev/loop-control", "/dev/vsock") if Path(d).exists()), None)

PROBE = '''
import os

def probe():
    argv = open("/proc/1/cmdline", "rb").read().decode().split("\\0")
    binds = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--dev-bind-try"]
    return {{"binds": binds, "present": os.path.exists({device!r})}}
'''
TEST = PROBE + '''
def test_gpu_nodes_are_bound():
    seen = probe()
    assert seen == {{"binds": {binds!r}, "present": {present!r}}}, seen
'''
HANDLER = PROBE + '''
def run(parameters, ctx):
    return probe()
'''


def _devices(monkeypatch: pytest.MonkeyPatch, devices: Sequence[str]) -> None:
    for module in (test_module, pool_module):
        monkeypatch.setattr(module, "gpu_devices", lambda: list(devices))


def _confinement(tmp_path: Path) -> confine.Confinement:
    (tmp_path / "state").mkdir(exist_ok=True)
    config = WorkerConfig(worker_id="w0", db_path=tmp_path / "state" / "outbox.duckdb", test_root=tmp_path / "root")
    confinement = confine.for_worker(config, tmp_path / "state" / "cache")
    assert confinement is not None
    return confinement


@pytest.mark.skipif(HOST_DEVICE is None, reason="no character device here to stand for a GPU node")
@pytest.mark.parametrize("gpu", [True, False], ids=["gpu-nodes", "none"])
async def test_a_confined_pytest_run_gets_the_gpu_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        gpu: bool) -> None:
    assert HOST_DEVICE is not None
    devices = ["/dev/nvidia0", HOST_DEVICE] if gpu else []
    _devices(monkeypatch, devices)
    root = tmp_path / "root"
    root.mkdir()
    (root / "test_gpu_probe.py").write_text(textwrap.dedent(TEST.format(device=HOST_DEVICE, binds=devices,
                                                                        present=gpu)))
    ex = TestExecutor(extra_env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}, confinement=_confinement(tmp_path))
    ctx = TaskContext("t1", 1, "test", {"test_file": "test_gpu_probe.py"}, timeout_s=60, test_root=root)
    outcome = await ex.run(ctx)
    assert outcome.status == "succeeded", outcome.output.get("stdout_tail")


@pytest.mark.skipif(HOST_DEVICE is None, reason="no character device here to stand for a GPU node")
async def test_a_confined_custom_handler_gets_the_gpu_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert HOST_DEVICE is not None
    handlers = tmp_path / "handlers"
    handlers.mkdir()
    (handlers / "op_gpu.py").write_text(HANDLER.format(device=HOST_DEVICE))
    (tmp_path / "root").mkdir()
    confinement = _confinement(tmp_path)
    outputs = {}
    for name, devices in (("gpu", ["/dev/nvidia0", HOST_DEVICE]), ("none", [])):
        _devices(monkeypatch, devices)
        ex = CustomExecutor(1, handlers={"gpu": "op_gpu:run"}, pythonpath=[handlers], use_entry_points=False,
                            confinement=confinement)
        await ex.start()
        try:
            outcome = await ex.run(TaskContext("t1", 1, "custom", {"name": "gpu"}, timeout_s=60))
        finally:
            await ex.close()
        assert outcome.status == "succeeded", outcome
        outputs[name] = outcome.output
    assert outputs["gpu"] == {"binds": ["/dev/nvidia0", HOST_DEVICE], "present": True}
    assert outputs["none"] == {"binds": [], "present": False}
