"""A real demo: coordinator + two worker processes + sample tasks of each kind, in about a minute.

``python -m distributed_testing.cli.demo`` (or ``bash scripts/demo.sh``) starts a coordinator on the
embedded DuckDB store in ``./demo-state`` and a dashboard for it, creates worker keys through the
API, starts two workers through ``run_worker_example.py``, submits a pytest run, two small
benchmarks and three custom tasks as one run (its dashboard link printed), prints each state
change and each benchmark configuration as it finishes (``benchmark-cnn-001: cnn b4 fp32: 0.85 ms
(2 of 3)``), then the results; then it restarts the coordinator on the same port and DuckDB file
and shows that every task and result is still there. ``--keep-running`` leaves everything up until
SIGINT or SIGTERM. The long benchmark (bert-base at five batch sizes) is an example task file:
``examples/benchmark-bert-base.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import runs
from .http import ApiClient
from .progress import PlainProgress
from .report import print_results, print_table
from .submit import wait_tasks

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = '''
def pytest_addoption(parser):
    parser.addoption("--batch-size", type=int, default=1, help="batch size for the model tests")
'''

TEST_BERT = '''
"""Checks a small BERT-style encoder (torch) at the batch size given by --batch-size."""
import pytest
import torch


@pytest.fixture
def batch_size(request):
    return request.config.getoption("--batch-size")


@pytest.fixture(scope="module")
def encoder():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
    return torch.nn.TransformerEncoder(layer, num_layers=2).eval()


def test_output_shape(encoder, batch_size):
    x = torch.randn(batch_size, 16, 64)
    with torch.inference_mode():
        assert encoder(x).shape == (batch_size, 16, 64)


def test_batch_rows_independent(encoder, batch_size):
    x = torch.randn(batch_size, 16, 64)
    with torch.inference_mode():
        full = encoder(x)
        first = encoder(x[:1])
    assert torch.allclose(full[:1], first, atol=1e-5)


def test_deterministic(encoder, batch_size):
    x = torch.randn(batch_size, 16, 64)
    with torch.inference_mode():
        assert torch.equal(encoder(x), encoder(x))
'''

# Quick real work (the demo ends in about a minute on two cores): a pytest run, two small benchmarks
# that report each batch size as it finishes, three custom handlers. The long benchmark (bert-base
# at five batch sizes) is examples/benchmark-bert-base.json.
QUICK_BENCH = {"tiny": True, "device": "cpu", "warmup": 2, "iterations": 20, "min_duration_s": 0.5}
TASKS: list[dict[str, Any]] = [
    {"task_id": "benchmark-cnn-001", "type": "benchmark",
     "config": {"model": "cnn", "batch_sizes": [1, 4, 8], "precision": "fp32", **QUICK_BENCH}},
    {"task_id": "benchmark-mlp-int8", "type": "benchmark",
     "config": {"model": "mlp", "batch_sizes": [1, 32], "precision": "int8", **QUICK_BENCH}},
    {"task_id": "test-bert-001", "type": "test",
     "config": {"test_file": "test_bert.py", "test_args": ["--batch-size", "4"]}},
    {"task_id": "custom-001", "type": "custom",
     "config": {"name": "setup_environment", "parameters": {"clear_cache": True, "prepare_models": ["bert", "vit"]}}},
    {"task_id": "custom-sleep-001", "type": "custom", "config": {"name": "sleep", "parameters": {"seconds": 0.5}}},
    {"task_id": "custom-noop-001", "type": "custom", "config": {"name": "noop"}, "priority": 5},
]
LONG_EXAMPLE = "examples/benchmark-bert-base.json"


def _wait_file(path: Path, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise SystemExit(f"demo: {proc.args!r} exited with {proc.returncode}; see its log")
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: {path} did not appear within {timeout}s")
        time.sleep(0.05)
    return path.read_text().strip()


class Demo:
    def __init__(self, state: Path) -> None:
        self.state = state
        self.procs: list[subprocess.Popen[bytes]] = []
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []

    def spawn(self, args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        log = open(self.state / log_name, "ab")  # noqa: SIM115 - closed with the process group
        p = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.procs.append(p)
        return p

    def start_coordinator(self, port: int = 0) -> ApiClient:
        """The coordinator on ``port`` (0: any free one); a client with the admin key."""
        port_file = self.state / "coordinator.port"
        port_file.unlink(missing_ok=True)
        self.coordinator = self.spawn(["run_coordinator.py", "--port", str(port), "--port-file", str(port_file),
                                       "--db-path", str(self.state / "coordinator.duckdb")], "coordinator.log")
        bound = _wait_file(port_file, self.coordinator)
        admin = _wait_file(self.state / "admin.key", self.coordinator)
        return ApiClient(f"http://127.0.0.1:{bound}", admin)

    def start_dashboard(self, coordinator_url: str) -> str:
        """The dashboard on a free port, for ``coordinator_url``; its URL."""
        port_file = self.state / "dashboard.port"
        p = self.spawn(["dashboard_server.py", "--coordinator", coordinator_url, "--port", "0",
                        "--port-file", str(port_file)], "dashboard.log")
        return f"http://127.0.0.1:{_wait_file(port_file, p)}"

    def start_workers(self, api: ApiClient) -> None:
        """Two workers with keys of their own; returns once both are ready."""
        for i, tags in ((1, "cpu,transformers"), (2, "cpu")):
            key = api.post("/api/v1/keys", {"role": "worker", "name": f"demo-worker-{i}"})["key"]
            key_file = self.state / f"worker-{i}.key"  # not --api-key: ps shows a command line to every user
            key_file.touch(mode=0o600)
            key_file.write_text(key + "\n")
            self.workers.append(self.spawn(
                ["run_worker_example.py", "--coordinator", api.base_url, "--api-key-file", str(key_file),
                 "--name", f"demo-worker-{i}", "--worker-id", f"demo-worker-{i}", "--tags", tags,
                 "--test-root", str(self.state / "tests"), "--db-path", str(self.state / f"worker-{i}.duckdb"),
                 "--max-concurrent-tasks", "2", "--heartbeat-interval", "2"], f"worker-{i}.log"))
        deadline = time.monotonic() + 90
        while len([w for w in api.get("/api/v1/workers")["workers"] if w["state"] == "ready"]) < 2:
            dead = [p for p in self.workers if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise SystemExit(f"demo: workers did not register ({len(dead)} exited); see {self.state}/worker-*.log")
            time.sleep(0.2)

    def stop(self, p: subprocess.Popen[bytes]) -> None:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def stop_all(self) -> None:
        """SIGTERM to every process at once (each drains on its own), then wait for each."""
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            self.stop(p)


def _show_results(api: ApiClient, final: list[dict[str, Any]]) -> None:
    print("\nresults:")
    print_results(api.get("/api/v1/results")["results"], "table")
    test = next(t for t in final if t["task_id"] == "test-bert-001")
    if test.get("result"):
        print("\nper-test outcomes of test-bert-001:")
        print_table(test["result"]["output"].get("tests", []), ["nodeid", "outcome", "duration_s"])


def run(state: Path, keep_running: bool = False) -> int:
    began = time.monotonic()
    shutil.rmtree(state, ignore_errors=True)
    (state / "tests").mkdir(parents=True)
    (state / "tests" / "conftest.py").write_text(CONFTEST)
    (state / "tests" / "test_bert.py").write_text(TEST_BERT)
    demo = Demo(state)
    try:
        api = demo.start_coordinator()
        dashboard = demo.start_dashboard(api.base_url)
        print(f"coordinator up at {api.base_url} (state in {state}/, admin key in {state}/admin.key)")
        print(f"dashboard at {dashboard} (sign in with the admin key)")
        demo.start_workers(api)
        print("\nworkers:")
        print_table([{**w, "capabilities": ",".join(w["capabilities"]), "tags": ",".join(w["tags"])}
                     for w in api.get("/api/v1/workers")["workers"]], ["worker_id", "state", "capabilities", "tags"])
        demo_run = runs.create_run(api, "demo", {})
        print(f"\nsubmitting {len(TASKS)} tasks: {json.dumps([t['task_id'] for t in TASKS])}")
        print(runs.run_line(demo_run, dashboard, api.base_url))
        api.post("/api/v1/tasks", [{**t, "run_id": demo_run["run_id"]} for t in TASKS])
        final = wait_tasks(api, [t["task_id"] for t in TASKS], 600, None, PlainProgress(sys.stdout)).tasks
        _show_results(api, final)
        print("\nrestarting the coordinator on the same DuckDB file ...")
        assert demo.coordinator is not None
        demo.stop(demo.coordinator)
        api = demo.start_coordinator(int(api.base_url.rsplit(":", 1)[1]))  # same port: the dashboard follows
        again = api.get("/api/v1/tasks")["tasks"]
        print(f"after restart: {len(again)} tasks, states {sorted({t['state'] for t in again})}, "
              f"{len(api.get('/api/v1/results')['results'])} results")
        ok = all(t["state"] == "succeeded" for t in final)
        print(f"\nthe long benchmark (bert-base-uncased at five batch sizes, minutes on a CPU) is an example: "
              f"dt submit {LONG_EXAMPLE} --wait (README, 'Running it yourself')")
        print("\ndemo " + ("succeeded" if ok else "finished with failures") +
              f" in {time.monotonic() - began:.0f} s; logs in {state}/", flush=True)
        if keep_running:
            _wait_for_interrupt(runs.run_url(demo_run["run_id"], dashboard, api.base_url))
        return 0 if ok else 1
    finally:
        demo.stop_all()


def _wait_for_interrupt(url: str) -> None:
    stop = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # taken by sigwait below, not by a handler
    print(f"\nstill running (--keep-running): the run's page is {url}; Ctrl-C stops everything", flush=True)
    signal.sigwait(stop)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m distributed_testing.cli.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state-dir", type=Path, default=ROOT / "demo-state",
                   help="where the demo keeps its databases, keys and logs (emptied first; default ./demo-state)")
    p.add_argument("--keep-running", action="store_true",
                   help="leave the coordinator, workers and dashboard running at the end until Ctrl-C or SIGTERM, "
                        "to look at the run on the dashboard")
    ns = p.parse_args(argv)
    return run(ns.state_dir.resolve(), ns.keep_running)


if __name__ == "__main__":
    sys.exit(main())
