"""``--worker-retention`` and ``dt workers --state`` between real processes: a coordinator (DuckDB
file) with a short retention, a worker started without ``--worker-id`` (a random id, as the issue
found the list filling with) that runs a task and stops, and one that stays. The stopped one is
listed as ``disconnected`` (the one word the CLI, REST and dashboard use), then forgotten after the
retention, also across a coordinator restart (its row is deleted from the store); its task and
result stay readable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from distributed_testing.testing import Procs, Rest, hidden_accelerators, start_coordinator_process, wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
RETENTION = 10.0  # long enough to see it disconnected on a loaded machine, short enough to wait for
NOOP = {"type": "custom", "config": {"name": "noop"}}


def dt(url: str, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "distributed_testing.cli.dt", "--coordinator", url, *args],
                          cwd=ROOT, env={**os.environ, "DT_API_KEY": key}, capture_output=True, text=True, timeout=120)


def listed(url: str, key: str, *args: str) -> list[list[str]]:
    """``dt workers ARGS`` as rows of cells (header dropped)."""
    out = dt(url, key, "workers", *args)
    assert out.returncode == 0, out.stderr
    return [line.split() for line in out.stdout.splitlines()[1:] if line.strip()]


def start_worker(procs: Procs, url: str, key: str, name: str, *args: str) -> subprocess.Popen[bytes]:
    return procs.start(["run_worker_example.py", "--coordinator", url, "--api-key", key, *args],
                       procs.tmp / f"{name}.log", env=hidden_accelerators(procs.tmp))


def test_a_stopped_worker_is_disconnected_then_forgotten_and_its_results_stay(procs: Procs, tmp_path: Path) -> None:
    db = tmp_path / "c.duckdb"
    flags = ["--log-level", "WARNING", "--worker-retention", str(RETENTION), "--worker-grace", "0"]
    coord, port = start_coordinator_process(procs, db, args=flags)
    url = f"http://127.0.0.1:{port}"
    admin_key = (tmp_path / "admin.key").read_text().strip()
    admin = Rest(url, admin_key)

    passing = start_worker(procs, url, admin.create_key("worker"), "passing")  # no --worker-id: a random one
    wait_until(lambda: len(admin.workers()) == 1, 120, "the first worker to register")
    (gone_id,) = admin.workers()
    (tid,) = admin.submit([NOOP])
    assert admin.ok("GET", f"/api/v1/tasks/{tid}", params={"wait": 60})["state"] == "succeeded"
    start_worker(procs, url, admin.create_key("worker"), "stays", "--worker-id", "stays")
    wait_until(lambda: admin.workers().get("stays", {}).get("state") == "ready", 120, "the staying worker")

    assert Procs.stop(passing) == 0  # SIGTERM: drains and says goodbye
    wait_until(lambda: admin.workers()[gone_id]["state"] == "disconnected", 30, "the stopped worker to disconnect")
    assert {r[0]: r[2] for r in listed(url, admin_key, "--state", "disconnected")} == {gone_id: "disconnected"}
    assert admin.workers()[gone_id]["state"] == "disconnected"  # still within the retention: the above saw it

    wait_until(lambda: gone_id not in admin.workers(), 60, f"{gone_id} to be forgotten after --worker-retention")
    assert [r[0] for r in listed(url, admin_key)] == ["stays"]
    assert [r[0] for r in listed(url, admin_key, "--state", "ready")] == ["stays"]
    assert listed(url, admin_key, "--state", "disconnected") == []
    (result,) = admin.results(task_id=tid)
    assert (result["worker_id"], result["status"]) == (gone_id, "succeeded")
    assert admin.ok("GET", f"/api/v1/tasks/{tid}")["outcome"]["worker_id"] == gone_id

    assert Procs.stop(coord) == 0  # its row was deleted from the store, not only from memory
    _, port = start_coordinator_process(procs, db, args=flags)
    admin = Rest(f"http://127.0.0.1:{port}", admin_key)
    assert gone_id not in admin.workers()
    assert admin.results(task_id=tid)[0]["worker_id"] == gone_id


def test_state_filter_names_the_states_it_accepts(procs: Procs, tmp_path: Path) -> None:
    _, port = start_coordinator_process(procs, tmp_path / "c.duckdb", args=["--log-level", "WARNING"])
    url = f"http://127.0.0.1:{port}"
    admin = Rest(url, (tmp_path / "admin.key").read_text().strip())
    status, body = admin.request("GET", "/api/v1/workers", params={"state": "gone"})
    assert status == 400 and "ready, constrained, draining, disconnected" in str(body), body
    out = dt(url, admin.key, "workers", "--state", "gone")
    assert out.returncode == 2 and "disconnected" in out.stderr
