"""History is served from the store, not from memory, over a real coordinator process on DuckDB.

A worker process runs a few hundred tasks (and a hand-driven worker one more); the coordinator is
restarted; its snapshot brought back only the tasks still pending, yet every finished task is
still there for every reader: by id (with its result), in filtered pages, in ``/results``, in the
overview; a resubmission of a finished task's id is answered ``created: false`` (or 409 with
another body), a cancel of one changes nothing, and the hand-driven worker's re-sent result for
its finished task is acknowledged, not refused."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import pytest

from distributed_testing.protocol import messages as m
from distributed_testing.testing import (
    Procs,
    Rest,
    hidden_accelerators,
    next_message,
    raw_worker,
    start_coordinator_process,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(240)
N = 240


def noop(task_id: str, tag: str) -> dict[str, Any]:
    return {"task_id": task_id, "type": "custom", "config": {"name": "noop"}, "requirements": {"tags": [tag]}}





def finished(api: Rest) -> int:
    counts = api.ok("GET", "/healthz")["tasks_by_state"]
    return sum(counts.get(s, 0) for s in ("succeeded", "failed", "error", "timed_out", "cancelled"))


async def run_by_hand(url: str, key: str) -> m.TaskResult:
    """The hand-driven worker (tag ``hand``) runs the one task it is given; its result."""
    async with raw_worker(url, key, "hand", autoping=False, tags=["hand"]) as (ws, _):
        (a,) = (await next_message(ws, m.AssignTasks)).tasks
        r = m.TaskResult(task_id=a.task_id, attempt=a.attempt, status="succeeded", started_at=0.0, finished_at=1.0)
        await ws.send_bytes(ws._dt_channel.seal(m.Results([r]), time.time()))  # type: ignore[attr-defined]
        assert m.TaskRef(a.task_id, a.attempt) in (await next_message(ws, m.ResultAck)).tasks
        return r


async def resend_by_hand(url: str, key: str, r: m.TaskResult) -> list[m.Message]:
    """The hand-driven worker comes back and re-sends that result: what it hears up to the ack."""
    async with raw_worker(url, key, "hand", autoping=False, tags=["hand"]) as (ws, _):
        await ws.send_bytes(ws._dt_channel.seal(m.Results([r]), time.time()))  # type: ignore[attr-defined]
        heard: list[m.Message] = []
        while not (heard and isinstance(heard[-1], m.ResultAck)):
            heard.append(await next_message(ws))
        return heard


def test_finished_tasks_are_served_from_the_store_after_a_restart(tmp_path: Path, procs: Procs) -> None:
    db = tmp_path / "coordinator.duckdb"
    coord, port = start_coordinator_process(procs, db, log=tmp_path / "first.log")
    url = f"http://127.0.0.1:{port}"
    api = Rest(url, (tmp_path / "admin.key").read_text().strip())
    worker_key, hand_key = api.create_key("worker"), api.create_key("worker")
    procs.start(["run_worker_example.py", "--coordinator", url, "--api-key", worker_key, "--worker-id", "w1",
                 "--tags", "even,odd", "--max-concurrent-tasks", "8", "--db-path", str(tmp_path / "w1.duckdb"),
                 "--reconnect-interval", "0.2", "--reconnect-attempts", "1000"],
                tmp_path / "w1.log", env=hidden_accelerators(tmp_path))
    hand = asyncio.run(_hand_task(api, url, hand_key))
    api.submit([noop(f"old-{i:03d}", "even" if i % 2 == 0 else "odd") for i in range(N)])
    api.submit([{"task_id": "broken", "type": "custom", "config": {"name": "sleep", "parameters": {"seconds": -1}},
                 "requirements": {"tags": ["odd"]}}])
    api.submit([noop("waits-1", "nobody"), noop("waits-2", "nobody")])  # no worker has the tag: stays pending
    wait_until(lambda: finished(api) == N + 2, 120, "every runnable task to finish")
    before = {t: api.ok("GET", f"/api/v1/tasks/{t}") for t in ("old-000", "broken")}

    procs.stop(coord)
    coord, _ = start_coordinator_process(procs, db, port=port, log=tmp_path / "second.log")
    # the snapshot held the two pending tasks only; the counts cover everything stored
    line = next(x for x in (tmp_path / "second.log").read_text().splitlines() if "coordinator state:" in x)
    assert re.search(rf"coordinator state: 2 active tasks restored \({N + 4} stored in all\)", line), line
    health = api.ok("GET", "/healthz")
    assert health["tasks"] == N + 4 and health["tasks_by_state"] == {"succeeded": N + 1, "error": 1, "pending": 2}

    # one task, by id: from the store, with its result, as before the restart
    old = api.ok("GET", "/api/v1/tasks/old-000")
    assert {k: old[k] for k in ("state", "outcome", "history", "spec")} == \
        {k: before["old-000"][k] for k in ("state", "outcome", "history", "spec")}
    assert old["result"]["status"] == "succeeded" and old["result"]["worker_id"] == "w1"
    assert api.ok("GET", "/api/v1/tasks/old-000", params={"wait": 5})["state"] == "succeeded"  # at once
    assert api.request("GET", "/api/v1/tasks/never-submitted")[0] == 404
    # pages, filtered and counted by the store
    page = api.ok("GET", "/api/v1/tasks", params={"tag": "even", "state": "succeeded", "limit": 50, "offset": 10})
    assert page["total"] == N // 2 and len(page["tasks"]) == 50
    assert all(t["state"] == "succeeded" and t["task_id"].startswith("old-") for t in page["tasks"])
    assert [t["task_id"] for t in api.ok("GET", "/api/v1/tasks", params={"state": "pending"})["tasks"]] == \
        ["waits-2", "waits-1"]
    assert api.ok("GET", "/api/v1/tasks", params={"worker_id": "hand"})["tasks"][0]["task_id"] == hand.task_id
    assert len(api.results(status="succeeded", worker_id="w1")) == N
    # the overview's last hour and latest failure come from the store too
    overview = api.ok("GET", "/api/v1/overview")
    assert round(sum(overview["series"]["submitted_per_s"]) * 60) == N + 4
    assert [f["task_id"] for f in overview["recent_failures"]] == ["broken"]

    # a resubmission of a finished task is idempotent; another body under its id is refused
    status, body = api.request("POST", "/api/v1/tasks", json=noop("old-001", "odd"))
    assert (status, body["tasks"]) == (200, [{"task_id": "old-001", "created": False, "state": "succeeded"}])
    status, body = api.request("POST", "/api/v1/tasks", json=noop("old-001", "even"))
    assert status == 409 and "different body" in body["message"]
    status, body = api.request("POST", "/api/v1/tasks", params={"wait": 5}, json=noop("old-002", "even"))
    assert status == 200 and body["tasks"][0]["outcome"]["status"] == "succeeded"
    # a cancel of a finished task changes nothing
    assert api.ok("POST", "/api/v1/tasks/old-003/cancel")["state"] == "succeeded"

    # a worker re-sending the result of its finished task is acknowledged, not refused
    heard = asyncio.run(resend_by_hand(url, hand_key, hand))
    assert not [x for x in heard if isinstance(x, m.ErrorMsg)], heard
    assert [r["attempt"] for r in api.results(task_id=hand.task_id)] == [1]

    # new work continues after the stored history, newest first
    (new,) = api.submit(noop("new-1", "even"))
    wait_until(lambda: api.ok("GET", f"/api/v1/tasks/{new}")["state"] == "succeeded", 60, "the new task to run")
    assert api.ok("GET", "/api/v1/tasks", params={"limit": 1})["tasks"][0]["task_id"] == "new-1"
    assert api.ok("GET", "/healthz")["tasks_by_state"]["succeeded"] == N + 2
    procs.stop(coord)


async def _hand_task(api: Rest, url: str, key: str) -> m.TaskResult:
    run = asyncio.create_task(run_by_hand(url, key))  # the task waits for it, if submitted first
    await asyncio.to_thread(api.submit, noop("by-hand", "hand"))
    return await run
