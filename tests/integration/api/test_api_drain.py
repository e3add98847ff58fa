"""``POST /api/v1/workers/{worker_id}/drain`` and ``dt workers drain`` against real workers.

The coordinator marks the worker as taking no new work and sends it ``drain``; the worker runs the
same graceful stop as on SIGTERM with the coordinator's deadline: a task that finishes in time is
completed there, one that does not is handed back and requeued (as a new attempt, without using a
retry) onto another worker, and the drained worker says goodbye and disconnects.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from distributed_testing.cli import dt
from distributed_testing.protocol import messages as m
from distributed_testing.testing import Cluster, raw_worker, run_cluster, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]


def sleep(task_id: str, seconds: float) -> dict[str, Any]:
    return {"task_id": task_id, "type": "custom", "config": {"name": "sleep", "parameters": {"seconds": seconds}},
            "requirements": {"tags": ["pool"]}}


@pytest_asyncio.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with run_cluster(tmp_path, workers=0) as c:
        yield c


async def test_drain_completes_short_tasks_hands_back_long_ones_and_disconnects(cluster: Cluster) -> None:
    c = cluster
    leaving = await c.add_worker(worker_id="leaving", name="leaving", tags=("pool",), max_concurrent_tasks=2,
                                 drain_timeout_s=600.0)  # the coordinator's deadline must be the one used
    await c.submit([sleep("short", 0.5), sleep("long", 120)])
    tasks = c.runtime.state.tasks
    await wait_for(lambda: tasks["short"].state == tasks["long"].state == "running", timeout=30, what="both running")

    status, body = await c.request("POST", "/api/v1/workers/leaving/drain", json={"deadline_s": 4, "reason": "kernel upgrade"})
    assert status == 202, body
    assert body == {"worker_id": "leaving", "state": "draining", "deadline_s": 4.0, "reason": "kernel upgrade"}
    w = c.runtime.state.workers["leaving"]
    assert (w.health, w.health_reason, w.view.accepting) == ("draining", "kernel upgrade", False)

    await c.add_worker(worker_id="stays", name="stays", tags=("pool",), max_concurrent_tasks=2)

    short = await c.wait("short")
    assert (short["state"], short["outcome"]["worker_id"], short["outcome"]["attempt"]) == ("succeeded", "leaving", 1)
    await wait_for(lambda: tasks["long"].worker_id == "stays" and tasks["long"].state == "running", timeout=30,
                   what="the handed-back task to run on the other worker")
    assert (tasks["long"].attempt, tasks["long"].retries_used) == (2, 0)
    causes = [h["cause"] for h in tasks["long"].history]
    assert "handed back by leaving: drain timeout after 4s (kernel upgrade)" in causes, causes

    await asyncio.wait_for(c.agent_tasks[0], 30)  # the drained agent stopped by itself
    assert leaving.draining and not leaving.running
    await wait_for(lambda: "leaving" not in c.runtime.sessions and not c.runtime.state.workers["leaving"].connected,
                   what="the drained worker to disconnect")
    status, listed = await c.request("GET", "/api/v1/workers")
    assert {x["worker_id"]: x["state"] for x in listed["workers"]}["leaving"] == "disconnected"
    await c.request("POST", "/api/v1/tasks/long/cancel")


async def test_dt_workers_drain_with_an_idle_worker(cluster: Cluster) -> None:
    c = cluster
    await c.add_worker(worker_id="idle", name="idle")
    argv = ["--coordinator", c.base_url, "--api-key", c.admin_key, "workers", "drain", "idle", "--deadline", "2",
            "--reason", "rebalancing"]
    assert await asyncio.to_thread(dt.main, argv) == 0
    await asyncio.wait_for(c.agent_tasks[0], 30)  # nothing to finish: it leaves at once
    await wait_for(lambda: not c.runtime.state.workers["idle"].connected, what="the worker to disconnect")
    # drained and gone: draining it again is a conflict, and dt says so with exit code 2
    assert await asyncio.to_thread(dt.main, argv) == 2
    status, body = await c.request("POST", "/api/v1/workers/idle/drain", json={})
    assert status == 409 and body["error"] == "Conflict", body


async def test_unknown_worker_is_404_and_a_submitter_is_403(cluster: Cluster) -> None:
    status, body = await cluster.request("POST", "/api/v1/workers/nobody/drain", json={"deadline_s": 1})
    assert status == 404 and body["error"] == "NotFound", body
    status, body = await cluster.request("POST", "/api/v1/workers/nobody/drain", json={"deadline_s": 1},
                                         key=await cluster.create_key("submitter"))
    assert status == 403 and "workers:manage" in body["message"], body


@pytest.mark.parametrize(("doc", "fields"), [
    ({"deadline_s": 0}, {"deadline_s"}),
    ({"deadline_s": -1}, {"deadline_s"}),
    ({"deadline_s": "30"}, {"deadline_s"}),
    ({"deadline_s": True}, {"deadline_s"}),
    ({"deadline_s": 10**400}, {"deadline_s"}),
    ({"deadline_s": 86401}, {"deadline_s"}),
    ({"reason": 5}, {"reason"}),
    ({"reason": ""}, {"reason"}),
    ({"deadline_s": 1, "force": True}, {"force"}),
    ([1, 2], {"(body)"}),
])
async def test_bad_bodies_are_400_naming_each_field_and_change_nothing(cluster: Cluster, doc: Any,
                                                                        fields: set[str]) -> None:
    async with raw_worker(cluster.base_url, await cluster.create_key("worker"), "probe"):
        status, body = await cluster.request("POST", "/api/v1/workers/probe/drain", json=doc)
        assert status == 400, body
        assert {e["field"] for e in body["errors"]} == fields
        w = cluster.runtime.state.workers["probe"]
        assert (w.health, w.view.accepting) == ("ready", True)


async def test_defaults_and_nothing_new_is_dispatched_to_a_drained_worker(cluster: Cluster) -> None:
    async with raw_worker(cluster.base_url, await cluster.create_key("worker"), "raw", autoping=False) as (ws, _):
        status, body = await cluster.request("POST", "/api/v1/workers/raw/drain")  # no body: the defaults
        assert status == 202, body
        assert body["deadline_s"] == 30.0 and body["reason"].startswith("drain requested by ")
        while True:
            frame = await ws.receive(timeout=10)
            assert frame.type == aiohttp.WSMsgType.BINARY, frame
            msg = ws._dt_channel.open(frame.data, time.time())  # type: ignore[attr-defined]
            if isinstance(msg, m.Drain):
                break
        assert (msg.deadline_s, msg.reason) == (30.0, body["reason"])
        [tid] = await cluster.submit({"type": "custom", "config": {"name": "noop"}})
        assert cluster.runtime.state.tasks[tid].state == "pending"  # dispatch ran during the submit
        status, task = await cluster.request("GET", f"/api/v1/tasks/{tid}")
        assert task["state"] == "pending" and task["worker_id"] is None, task
