"""End to end through the launchers: run_coordinator.py, two run_worker_example.py processes and
the dt CLI, with the worker guide's test and custom tasks; then a coordinator restart on the same
DuckDB file finds every task and result, and the workers reconnect on their own."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from distributed_testing.cli.demo import CONFTEST, TEST_BERT
from distributed_testing.testing import Procs, Rest, free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(240)

GUIDE_TASKS = [
    {"task_id": "test-bert-001", "type": "test",
     "config": {"test_file": "test_bert.py", "test_args": ["--batch-size", "4"]}},
    {"task_id": "custom-001", "type": "custom",
     "config": {"name": "setup_environment", "parameters": {"clear_cache": True, "prepare_models": ["bert", "vit"]}}},
]


def dt(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "distributed_testing.cli.dt", *args], cwd=ROOT, env={**os.environ, **env},
                          input=stdin, capture_output=True, text=True, timeout=120)


def wait_until(pred, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def start_coordinator(procs: Procs, port: int, db: Path) -> subprocess.Popen[bytes]:
    p = procs.start(["run_coordinator.py", "--port", str(port), "--db-path", str(db)], procs.tmp / "coordinator.log")

    def up() -> bool:
        assert p.poll() is None, (procs.tmp / "coordinator.log").read_text()[-3000:]
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return False

    wait_until(up, 30, "the coordinator to listen")
    return p


def ready_workers(env: dict[str, str]) -> int:
    out = dt(env, "workers").stdout
    return sum(1 for line in out.splitlines()[1:] if " ready " in f" {line} ")


def ready_over_rest(env: dict[str, str]) -> int:
    """What ``ready_workers`` counts, asked in this process: the wait polls every 0.1 s, and a
    ``dt`` process per poll cost a second of start-up each (``dt workers`` is checked once after)."""
    try:
        workers = Rest(env["DT_COORDINATOR_URL"], env["DT_API_KEY"], timeout=5).workers()
    except (OSError, AssertionError):
        return 0
    return sum(1 for w in workers.values() if w["state"] == "ready")


def test_guide_tasks_through_launchers_survive_restart(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text(CONFTEST)
    (tests / "test_bert.py").write_text(TEST_BERT)
    (tests / "test_broken.py").write_text("def test_ok():\n    pass\n\ndef test_bad():\n    assert 1 == 2, 'math'\n")
    procs = Procs(tmp_path, cwd=ROOT)
    port, db = free_port(), tmp_path / "state" / "coordinator.duckdb"
    try:
        coord = start_coordinator(procs, port, db)
        admin_key_file = db.parent / "admin.key"
        assert oct(admin_key_file.stat().st_mode & 0o777) == "0o600"
        env = {"DT_COORDINATOR_URL": f"http://127.0.0.1:{port}", "DT_API_KEY": admin_key_file.read_text().strip()}
        for i in (1, 2):
            created = dt(env, "keys", "create", "--role", "worker", "--name", f"e2e-{i}")
            assert created.returncode == 0, created.stderr
            key = created.stdout.strip()
            assert key.startswith("dtk_") and "\n" not in key
            procs.start(["run_worker_example.py", "--worker-id", f"e2e-{i}", "--test-root", str(tests),
                         "--heartbeat-interval", "1", "--reconnect-interval", "0.2", "--reconnect-attempts", "50"],
                        tmp_path / f"worker-{i}.log", env={"DT_COORDINATOR_URL": env["DT_COORDINATOR_URL"], "DT_API_KEY": key,
                                                "DT_WORKER_NAME": f"env-name-{i}", "DT_DB_PATH": str(tmp_path / f"w{i}.duckdb")})
        wait_until(lambda: ready_over_rest(env) == 2, 90, "two workers to register")
        assert ready_workers(env) == 2
        listing = dt(env, "workers").stdout
        assert "env-name-1" in listing and "env-name-2" in listing  # DT_WORKER_NAME reached the coordinator
        assert (tmp_path / "w1.duckdb").exists()  # DT_DB_PATH reached the worker

        (tmp_path / "tasks.json").write_text(json.dumps(GUIDE_TASKS))
        sub = dt(env, "submit", str(tmp_path / "tasks.json"), "--wait", "--timeout", "150",
                 "--junit", str(tmp_path / "report.xml"), "--json", str(tmp_path / "out.json"))
        assert sub.returncode == 0, sub.stdout + sub.stderr
        assert sub.stdout.split() == ["test-bert-001", "custom-001"]
        cases = [(tc.get("classname"), tc.get("name")) for tc in ET.parse(tmp_path / "report.xml").iter("testcase")]
        assert ("test_bert", "test_output_shape") in cases and ("dt.custom", "custom-001") in cases
        out = json.loads((tmp_path / "out.json").read_text())
        test_result = next(t for t in out["tasks"] if t["task_id"] == "test-bert-001")["result"]["output"]
        assert (test_result["passed"], test_result["failed"]) == (3, 0)

        failing = dt(env, "submit", "-", "--wait", "--timeout", "120")
        assert failing.returncode == 2  # empty stdin is not valid JSON
        assert "not valid JSON" in failing.stderr
        (tmp_path / "bad.json").write_text(json.dumps({"task_id": "fails-1", "type": "test", "config": {"test_file": "test_broken.py"}}))
        failed = dt(env, "submit", str(tmp_path / "bad.json"), "--wait", "--timeout", "120")
        assert failed.returncode == 1, failed.stderr
        assert "1 of 2" in dt(env, "status", "fails-1").stdout
        (tmp_path / "invalid.json").write_text(json.dumps({"type": "test", "config": {}, "priority": "high"}))
        invalid = dt(env, "submit", str(tmp_path / "invalid.json"))
        assert invalid.returncode == 2 and "config" in invalid.stderr and "priority" in invalid.stderr

        procs.stop(coord, signal.SIGKILL)
        start_coordinator(procs, port, db)
        status = json.loads(dt(env, "status", "test-bert-001").stdout)
        assert status["state"] == "succeeded" and status["result"]["output"]["passed"] == 3
        results = dt(env, "results", "--format", "json")
        assert {r["task_id"] for r in json.loads(results.stdout)} >= {"test-bert-001", "custom-001", "fails-1"}
        wait_until(lambda: ready_over_rest(env) == 2, 60, "workers to reconnect after the restart")
        assert ready_workers(env) == 2
        again = dt(env, "submit", str(tmp_path / "tasks.json"), "--wait", "--timeout", "60")
        assert again.returncode == 0  # idempotent resubmission of finished tasks
    finally:
        procs.close()
