"""The code-execution routes of issue 27 (items 1 and 2), performed over real sockets against a
real coordinator and a real worker process (``run_worker_example.py``):

* a dotted model path walking out of an allowed module (``mymodels:torch.os.system``), and
  names an allowed module merely imports (``mymodels:system`` after ``from os import system``);
* ``--`` then ``-p`` (pytest scans every token for ``-p``, even after ``--``);
* the project's own pytest plugin in test tasks: ``--dt-coordinator``/``--dt-api-key`` in
  ``test_args`` or in an inherited ``PYTEST_ADDOPTS`` making the worker send requests anywhere.

Every attack asserts its effect is absent: the marker file never appears, the listener never
receives a connection.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from flags_support import ROOT, Procs

from distributed_testing.testing import Cluster, hidden_accelerators, run_cluster, wait_for

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

FAST_BENCH = {"warmup": 1, "iterations": 2, "min_duration_s": 0, "batch_sizes": [1], "input_shape": [4]}

MYMODELS = """
import torch
from os import system
from torch.nn import Linear


class Tiny(torch.nn.Module):
    input_shape = (4,)

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.linear(x)


def make():
    return Tiny()
"""

EVIL_PLUGIN = """
from pathlib import Path

Path({marker!r}).write_text("imported")
"""

PLUGIN_OFF_TEST = """
import pytest


@pytest.mark.dt(tags=["any"])  # the plugin's marker stays registered (--strict-markers below)
def test_plugin_off(pytestconfig):
    assert not pytestconfig.pluginmanager.has_plugin("distributed_testing")
"""


def start_worker(procs: Procs, tmp_path: Path, c: Cluster, key: str, *extra: str,
                 env: dict[str, str] | None = None, torch: bool = True) -> Any:
    """The worker process, ``modules`` on its path; without ``torch`` (its tasks need none) torch
    and openvino are hidden from it, so its probes do not import them (seconds of CPU)."""
    modules = tmp_path / "modules"
    rest = os.environ.get("PYTHONPATH", "") if torch else hidden_accelerators(tmp_path)["PYTHONPATH"]
    path = os.pathsep.join([str(modules), rest])
    return procs.start(
        [str(ROOT / "run_worker_example.py"), "--coordinator", c.base_url, "--api-key", key,
         "--worker-id", "w", "--reconnect-interval", "0.1", *extra],
        tmp_path / "worker.log", env={"PYTHONPATH": path, **(env or {})})


async def registered(c: Cluster, worker: Any, tmp_path: Path) -> None:
    await wait_for(lambda: "w" in c.runtime.sessions or worker.poll() is not None, timeout=90,
                   what="the worker process to register")
    assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]


def bench(model: str, marker: Path) -> dict[str, Any]:
    return {"type": "benchmark", "config": {"model": model, "model_config": {"command": f"touch {marker}"},
                                            **FAST_BENCH}}


def training(model: str) -> dict[str, Any]:
    return {"type": "training", "config": {"model": model, "nodes": 1, "nproc_per_node": 1, "batch_size": 2,
                                           "steps": 1, "warmup_steps": 0}}


# ------------------------------------------------------------------ item 1: dotted callables


@pytest.mark.asyncio
async def test_a_model_must_be_one_name_defined_in_the_allowed_module(tmp_path: Path, procs: Procs) -> None:
    marker = tmp_path / "pwned"
    (tmp_path / "modules").mkdir()
    (tmp_path / "modules" / "mymodels.py").write_text(MYMODELS)
    async with run_cluster(tmp_path, workers=0) as c:
        worker = start_worker(procs, tmp_path, c, await c.create_key("worker"), "--allow-model-modules", "mymodels")
        await registered(c, worker, tmp_path)
        # a path after the colon is refused at submit, for benchmarks and training alike
        for doc in (bench("mymodels:torch.os.system", marker),
                    training("mymodels:torch.os.system")):
            status, body = await c.request("POST", "/api/v1/tasks", json=doc)
            assert status == 400, body
            text = json.dumps(body)
            assert "config.model" in text and "one name" in text, text
        # one name, but not defined in mymodels: the worker refuses it before calling anything
        ids = [(await c.submit(bench(name, marker)))[0] for name in ("mymodels:system", "mymodels:Linear")]
        (train,) = await c.submit(training("mymodels:system"))
        for tid in [*ids, train]:
            task = await c.wait(tid, 120)
            error = json.dumps(task["outcome"])
            assert task["state"] in ("failed", "error"), task
            assert "is not defined in an allowed module" in error, error
        # a class or function defined in the allowed module still runs
        (ok,) = await c.submit({"type": "benchmark", "config": {"model": "mymodels:make", **FAST_BENCH}})
        task = await c.wait(ok, 120)
        assert task["state"] == "succeeded", task["outcome"]
    assert not marker.exists()


def test_the_benchmark_child_refuses_a_dotted_path_by_itself(tmp_path: Path) -> None:
    """Defence in depth: a coordinator that sent such a task anyway gets an error from the child."""
    marker = tmp_path / "pwned"
    (tmp_path / "mymodels.py").write_text(MYMODELS)
    request = json.dumps({"id": 1, "configs": [bench("mymodels:torch.os.system", marker)["config"]]}) + "\n"
    child = subprocess.run([sys.executable, "-m", "distributed_testing.bench.child", "--allow-model-modules",
                            "mymodels"], input=request, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                           env={**os.environ, "PYTHONPATH": str(tmp_path)})
    (entry,) = json.loads(child.stdout.splitlines()[0])["results"]
    assert "one name" in entry["error"]["message"], entry
    assert not marker.exists()


# ------------------------------------------------------------------ item 2: pytest arguments


class Listener:
    """A local HTTP listener that records every connection and answers 500."""

    def __init__(self) -> None:
        self.hits: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Listener:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.read(4096)
        self.hits.append(head)
        writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()


def make_root(tmp_path: Path, marker: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    (root / "test_ok.py").write_text("def test_ok():\n    pass\n")
    (root / "test_plugin_off.py").write_text(PLUGIN_OFF_TEST)
    (tmp_path / "modules").mkdir()
    (tmp_path / "modules" / "dt_evil_plugin.py").write_text(EVIL_PLUGIN.format(marker=str(marker)))
    return root


def pytest_task(*args: str, test_file: str = "test_ok.py") -> dict[str, Any]:
    return {"type": "test", "config": {"test_file": test_file, "test_args": list(args)}}


@pytest.mark.asyncio
async def test_pytest_arguments_are_read_as_pytest_reads_them(tmp_path: Path, procs: Procs) -> None:
    marker = tmp_path / "plugin-imported"
    root = make_root(tmp_path, marker)
    async with Listener() as listener, run_cluster(tmp_path, workers=0) as c:
        # an operator's shell may carry the plugin's options for their own runs: no task inherits them
        addopts = f"--dt-coordinator={listener.url} --dt-api-key=dtk_addopts_secret"
        worker = start_worker(procs, tmp_path, c, await c.create_key("worker"), "--test-root", str(root),
                              env={"PYTEST_ADDOPTS": addopts, "PYTEST_PLUGINS": "dt_evil_plugin"}, torch=False)
        await registered(c, worker, tmp_path)
        # our plugin's options are refused at submit
        dt_args = [f"--dt-coordinator={listener.url}", "--dt-api-key=dtk_stolen_secret"]
        status, body = await c.request("POST", "/api/v1/tasks", json=pytest_task(*dt_args))
        assert status == 400 and "config.test_args" in json.dumps(body) and "--dt-coordinator" in json.dumps(body), body
        # '-p' after '--' is still '-p' to pytest: the worker refuses it as it refuses '-p' anywhere
        attacks = [["--", "-pdt_evil_plugin"], ["--", "-p", "dt_evil_plugin"], ["-x", "--", "-pdt_evil_plugin"]]
        ids = [(await c.submit(pytest_task(*args)))[0] for args in attacks]
        for args, tid in zip(attacks, ids, strict=True):
            task = await c.wait(tid, 120)
            assert task["state"] in ("failed", "error"), (args, task)
            assert "--allow-test-options -p" in (task["outcome"]["error"] or ""), (args, task["outcome"])
        # a plain test task runs with our plugin disabled, and without the inherited variables
        (ok,) = await c.submit(pytest_task("-q", "--strict-markers", test_file="test_plugin_off.py"))
        task = await c.wait(ok, 120)
        assert task["state"] == "succeeded", task["outcome"]
        assert listener.hits == []
    assert not marker.exists()


@pytest.mark.asyncio
async def test_the_worker_refuses_plugin_options_a_coordinator_sent_anyway(tmp_path: Path) -> None:
    """Defence in depth: a test task that bypassed submit validation (an older or a hostile
    coordinator) with ``--dt-coordinator`` is refused by the executor, and contacts nobody."""
    from distributed_testing.errors import ExecutionError
    from distributed_testing.worker.executors.base import TaskContext
    from distributed_testing.worker.executors.test import TestExecutor

    marker = tmp_path / "plugin-imported"
    root = make_root(tmp_path, marker)
    async with Listener() as listener:
        ctx = TaskContext(task_id="t", attempt=1, type="test", test_root=root, work_dir=tmp_path,
                          config=pytest_task(f"--dt-coordinator={listener.url}", "--dt-api-key=dtk_x_y")["config"])
        with pytest.raises(ExecutionError, match="--dt-coordinator"):
            await TestExecutor().run(ctx)
        assert listener.hits == []
