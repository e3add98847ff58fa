"""Pipelining between real processes: a coordinator and two workers started with default flags
(one slot each, the default ``--pipeline-depth``, 256). Short tasks are sent ahead of the workers'
slots; a long task followed by many short ones does not hold the short ones up: those queued
behind it are taken back for the other worker, and every task runs exactly once."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import pytest

from distributed_testing.testing import Procs, Rest, hidden_accelerators, start_coordinator_process, wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(240)
NOOP = {"type": "custom", "config": {"name": "noop"}}





def start_worker(procs: Procs, url: str, key: str, worker_id: str) -> subprocess.Popen[bytes]:
    """A worker with default flags but its identity."""
    return procs.start(["run_worker_example.py", "--coordinator", url, "--api-key", key, "--worker-id", worker_id],
                       procs.tmp / f"{worker_id}.log", env=hidden_accelerators(procs.tmp))


@pytest.mark.serial  # the window opens only while no-op tasks take under 20 ms: no other test beside it
def test_short_tasks_are_not_stuck_behind_a_long_one_and_each_runs_once(procs: Procs, tmp_path: Path) -> None:
    _, port = start_coordinator_process(procs, tmp_path / "c.duckdb", args=["--log-level", "WARNING"])
    url = f"http://127.0.0.1:{port}"
    admin = Rest(url, (tmp_path / "admin.key").read_text().strip())
    for wid in ("wa", "wb"):
        start_worker(procs, url, admin.create_key("worker"), wid)
    wait_until(lambda: sum(w["state"] == "ready" for w in admin.workers().values()) == 2, 120, "both workers")

    # short tasks on both workers first: what they report opens their windows
    warm = admin.submit([NOOP] * 60)
    for tid in warm:
        assert admin.ok("GET", f"/api/v1/tasks/{tid}", params={"wait": 60})["state"] == "succeeded"
    windows = {wid: w["pipeline"] for wid, w in admin.workers().items()}
    assert all(p["depth"] == 256 and p["window"] > 0 for p in windows.values()), windows

    # The long one goes to a worker's free slot; the short ones ahead to the worker with the most
    # room (its window: 256 after a quiet warm-up, less if a slow no-op just closed it a little).
    # More than the other worker can hold (1 slot + 256), so some land behind the long one
    # whatever the two windows are.
    long_id, *short = admin.submit([{"type": "custom", "config": {"name": "sleep", "parameters": {"seconds": 120}}},
                                    *[NOOP] * (1 + 256 + 40)])
    for tid in short:
        assert admin.ok("GET", f"/api/v1/tasks/{tid}", params={"wait": 60})["state"] == "succeeded"
    long = admin.ok("GET", f"/api/v1/tasks/{long_id}")
    assert long["state"] in ("assigned", "running"), long  # every short one finished while it still runs
    holder = long["worker_id"]

    views = {tid: admin.ok("GET", f"/api/v1/tasks/{tid}") for tid in short}
    behind = [tid for tid, v in views.items()
              if any(h["to"] == "assigned" and h["worker_id"] == holder and h["attempt"] == 1 for h in v["history"])]
    taken = [tid for tid, v in views.items() if any("taken back" in h["cause"] for h in v["history"])]
    assert behind, "some short tasks were sent ahead to the worker that got the long one"
    for tid in behind:  # a one-slot worker busy for 120 s could not have run them: they moved
        assert tid in taken and views[tid]["outcome"]["worker_id"] != holder, views[tid]["history"]

    results = admin.results()
    runs = Counter(r["task_id"] for r in results if r["task_id"] in views)
    assert runs == Counter(short)  # exactly one result each: a dropped attempt never ran
    for r in results:
        if r["task_id"] in views:
            assert r["attempt"] == views[r["task_id"]]["outcome"]["attempt"] and r["status"] == "succeeded"
    assert all(views[tid]["outcome"]["attempt"] == 2 for tid in taken)  # a new attempt, at no retry cost
    assert all(views[tid]["retries_used"] == 0 for tid in short)

    admin.ok("POST", f"/api/v1/tasks/{long_id}/cancel")
    assert admin.ok("GET", f"/api/v1/tasks/{long_id}", params={"wait": 60})["state"] == "cancelled"
