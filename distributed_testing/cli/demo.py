"""A real demo: coordinator + two worker processes + sample tasks of each kind, in about a minute.

``python -m distributed_testing.cli.demo`` (or ``bash scripts/demo.sh``) starts a coordinator on the
embedded DuckDB store in ``./demo-state``, creates worker keys through the API, starts two
workers through ``run_worker_example.py``, submits a pytest run, two small benchmarks and three
custom tasks, prints each state change and each benchmark configuration as it finishes
(``benchmark-cnn-001: cnn b4 fp32: 0.85 ms (2 of 3)``), then the results; then it restarts the
coordinator and shows that every task and result is still there. The long benchmark (bert-base at
five batch sizes) is an example task file: ``examples/benchmark-bert-base.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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

    def spawn(self, args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        log = open(self.state / log_name, "ab")  # noqa: SIM115 - closed with the process group
        p = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.procs.append(p)
        return p

    def start_coordinator(self) -> ApiClient:
        port_file = self.state / "coordinator.port"
        port_file.unlink(missing_ok=True)
        p = self.spawn(["run_coordinator.py", "--port", "0", "--port-file", str(port_file),
                        "--db-path", str(self.state / "coordinator.duckdb")], "coordinator.log")
        port = _wait_file(port_file, p)
        admin = _wait_file(self.state / "admin.key", p)
        return ApiClient(f"http://127.0.0.1:{port}", admin)

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


def run(state: Path) -> int:
    began = time.monotonic()
    shutil.rmtree(state, ignore_errors=True)
    (state / "tests").mkdir(parents=True)
    (state / "tests" / "conftest.py").write_text(CONFTEST)
    (state / "tests" / "test_bert.py").write_text(TEST_BERT)
    demo = Demo(state)
    try:
        api = demo.start_coordinator()
        print(f"coordinator up at {api.base_url} (state in {state}/, admin key in {state}/admin.key)")
        for i, tags in ((1, "cpu,transformers"), (2, "cpu")):
            key = api.post("/api/v1/keys", {"role": "worker", "name": f"demo-worker-{i}"})["key"]
            key_file = state / f"worker-{i}.key"  # not --api-key: ps shows a command line to every user
            key_file.touch(mode=0o600)
            key_file.write_text(key + "\n")
            demo.spawn(["run_worker_example.py", "--coordinator", api.base_url, "--api-key-file", str(key_file),
                        "--name", f"demo-worker-{i}", "--worker-id", f"demo-worker-{i}", "--tags", tags,
                        "--test-root", str(state / "tests"), "--db-path", str(state / f"worker-{i}.duckdb"),
                        "--max-concurrent-tasks", "2", "--heartbeat-interval", "2"], f"worker-{i}.log")
        deadline = time.monotonic() + 90
        while len([w for w in api.get("/api/v1/workers")["workers"] if w["state"] == "ready"]) < 2:
            dead = [p for p in demo.procs[1:] if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise SystemExit(f"demo: workers did not register ({len(dead)} exited); see {state}/worker-*.log")
            time.sleep(0.2)
        print("\nworkers:")
        print_table([{**w, "capabilities": ",".join(w["capabilities"]), "tags": ",".join(w["tags"])}
                     for w in api.get("/api/v1/workers")["workers"]], ["worker_id", "state", "capabilities", "tags"])
        print(f"\nsubmitting {len(TASKS)} tasks: {json.dumps([t['task_id'] for t in TASKS])}")
        api.post("/api/v1/tasks", TASKS)
        final = wait_tasks(api, [t["task_id"] for t in TASKS], 600, None, PlainProgress(sys.stdout)).tasks
        print("\nresults:")
        print_results(api.get("/api/v1/results")["results"], "table")
        test = next(t for t in final if t["task_id"] == "test-bert-001")
        if test.get("result"):
            print("\nper-test outcomes of test-bert-001:")
            print_table(test["result"]["output"].get("tests", []), ["nodeid", "outcome", "duration_s"])
        print("\nrestarting the coordinator on the same DuckDB file ...")
        demo.stop(demo.procs[0])
        api = demo.start_coordinator()
        again = api.get("/api/v1/tasks")["tasks"]
        print(f"after restart: {len(again)} tasks, states {sorted({t['state'] for t in again})}, "
              f"{len(api.get('/api/v1/results')['results'])} results")
        ok = all(t["state"] == "succeeded" for t in final)
        print(f"\nthe long benchmark (bert-base-uncased at five batch sizes, minutes on a CPU) is an example: "
              f"dt submit {LONG_EXAMPLE} --wait (README, 'Running it yourself')")
        print("\ndemo " + ("succeeded" if ok else "finished with failures") +
              f" in {time.monotonic() - began:.0f} s; logs in {state}/")
        return 0 if ok else 1
    finally:
        demo.stop_all()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m distributed_testing.cli.demo", description=__doc__)
    p.add_argument("--state-dir", type=Path, default=ROOT / "demo-state")
    return run(p.parse_args(argv).state_dir.resolve())


if __name__ == "__main__":
    sys.exit(main())
