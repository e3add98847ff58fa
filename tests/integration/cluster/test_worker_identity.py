"""A worker speaks only for itself, attacked over real signed WebSocket sessions.

Each test plays an attacker holding its own (valid) worker key: it registers another worker's id,
or reports results for attempts it was never given (another worker's task, a stale attempt, a
task not submitted yet). Each is refused and counted; the victim's session and outcomes stand,
and nothing planted shows in ``/api/v1/results``."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from distributed_testing.cli import dt
from distributed_testing.protocol import messages as m
from distributed_testing.protocol.signing import Channel, derive_session_key
from distributed_testing.testing import Cluster, next_message, raw_worker, run_cluster, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
TTL = 60.0  # the raw workers send no heartbeats


def task(task_id: str, tag: str, max_retries: int = 0) -> dict[str, Any]:
    return {"task_id": task_id, "type": "custom", "config": {"name": "noop"}, "max_retries": max_retries,
            "requirements": {"tags": [tag]}}


def results(*refs: tuple[str, int, str], **output: Any) -> m.Results:
    now = time.time()
    return m.Results([m.TaskResult(task_id=t, attempt=a, status=s, started_at=now - 1, finished_at=now,  # type: ignore[arg-type]
                                   output=dict(output)) for t, a, s in refs])


async def send(ws: aiohttp.ClientWebSocketResponse, msg: m.Message) -> None:
    await ws.send_bytes(ws._dt_channel.seal(msg, time.time()))  # type: ignore[attr-defined]


async def result_rows(c: Cluster, task_id: str) -> list[tuple[int, str, str]]:
    status, body = await c.request("GET", "/api/v1/results", params={"task_id": task_id})
    assert status == 200, body
    return sorted((r["attempt"], r["worker_id"], r["status"]) for r in body["results"])


async def refused_reply(ws: aiohttp.ClientWebSocketResponse, ref: m.TaskRef) -> None:
    """The attacker's refused result is settled (acknowledged) and explained (an error)."""
    acked, errors = False, []
    while not (acked and errors):
        msg = await next_message(ws)
        if isinstance(msg, m.ResultAck):
            acked = acked or ref in msg.tasks
        elif isinstance(msg, m.ErrorMsg):
            errors.append(msg)
    assert errors[0].code == "result_refused" and not errors[0].fatal and ref.task_id in errors[0].detail


@contextlib.asynccontextmanager
async def register_as(base_url: str, credential: str, worker_id: str) -> AsyncIterator[m.Message]:
    """Open a session with ``credential`` and register ``worker_id``; yield the coordinator's reply."""
    async with aiohttp.ClientSession() as http, http.ws_connect(
            base_url.replace("http://", "ws://") + "/ws/worker",
            headers={"Authorization": f"Bearer {credential}"}) as ws:
        ch = Channel(derive_session_key(credential, ws._response.headers["X-DT-Session"]))
        await ws.send_bytes(ch.seal(m.Register(worker_id=worker_id, name="impostor", protocol_version=m.PROTOCOL_VERSION,
                                               hardware={}, capabilities=["cpu"], tags=["victim"], max_concurrent=4),
                                    time.time()))
        frame = await ws.receive(timeout=10)
        assert frame.type == aiohttp.WSMsgType.BINARY, frame
        yield ch.open(frame.data, time.time())
        closed = await ws.receive(timeout=10)
        assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), closed


async def test_another_key_cannot_register_a_workers_id(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=0, worker_ttl_s=TTL) as c:
        victim_key, impostor_key = await c.create_key("worker"), await c.create_key("worker")
        async with raw_worker(c.base_url, victim_key, "victim", tags=["victim"]) as (victim, _):
            session = c.runtime.sessions["victim"]
            (tid,) = await c.submit(task("job", "victim"))
            await wait_for(lambda: c.runtime.state.tasks[tid].worker_id == "victim", what="the job on the victim")
            async with register_as(c.base_url, impostor_key, "victim") as reply:
                assert isinstance(reply, m.ErrorMsg) and reply.fatal and reply.code == "worker_id_taken"
                assert "bound to another key" in reply.detail
            assert c.runtime.stats["refused_register"] == 1
            assert c.runtime.sessions["victim"] is session and not session.closing  # still open
            await send(victim, results((tid, 1, "succeeded"), by="victim"))
            out = await c.wait(tid)
            assert out["state"] == "succeeded" and out["outcome"]["worker_id"] == "victim"
            assert await result_rows(c, tid) == [(1, "victim", "succeeded")]
        # the owning key comes back with the same id (a restarted worker)
        async with raw_worker(c.base_url, victim_key, "victim") as (_, again):
            assert again.worker_id == "victim"


async def test_results_for_attempts_never_held_are_refused_and_plant_nothing(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=0, worker_ttl_s=TTL) as c:
        victim_key, attacker_key = await c.create_key("worker"), await c.create_key("worker")
        async with (raw_worker(c.base_url, victim_key, "victim", tags=["victim"]) as (victim, _),
                    raw_worker(c.base_url, attacker_key, "mallory", autoping=False) as (mallory, _)):
            # another worker's task
            (other,) = await c.submit(task("other", "victim"))
            await wait_for(lambda: c.runtime.state.tasks[other].worker_id == "victim", what="the task on the victim")
            await send(mallory, results((other, 1, "succeeded"), planted=True))
            await refused_reply(mallory, m.TaskRef(other, 1))
            # a task that does not exist yet, and attempts of it nobody holds
            await send(mallory, results(("future", 1, "succeeded"), ("future", 0, "succeeded"), planted=True))
            await refused_reply(mallory, m.TaskRef("future", 1))
            assert c.runtime.stats["refused_result"] == 3
            assert c.runtime.state.tasks[other].outcome is None and await result_rows(c, other) == []
            await send(victim, results((other, 1, "failed"), real=True))
            await c.wait(other)
            (future,) = await c.submit(task("future", "victim"))
            await wait_for(lambda: c.runtime.state.tasks[future].worker_id == "victim", what="future on the victim")
            await send(victim, results((future, 1, "failed"), real=True))
            for tid in (other, future):
                out = await c.wait(tid)
                assert (out["state"], out["outcome"]["worker_id"]) == ("failed", "victim")
                assert await result_rows(c, tid) == [(1, "victim", "failed")]
            assert c.runtime.stats["refused_result"] == 3


async def test_a_stale_attempt_is_refused_unless_its_worker_held_it(tmp_path: Path) -> None:
    """The victim holds attempt 1, disconnects, and the task moves to mallory as attempt 2.
    Mallory's report on attempt 1 is refused; the victim's own late attempt-1 result is kept as
    history; mallory's attempt 2 makes the outcome."""
    async with run_cluster(tmp_path, workers=0, worker_ttl_s=TTL, worker_grace_s=0.3) as c:
        victim_key, attacker_key = await c.create_key("worker"), await c.create_key("worker")
        async with raw_worker(c.base_url, victim_key, "victim", tags=["pool"]):
            (tid,) = await c.submit(task("job", "pool", max_retries=1))
            await wait_for(lambda: c.runtime.state.tasks[tid].worker_id == "victim", what="attempt 1 on the victim")
        async with raw_worker(c.base_url, attacker_key, "mallory", autoping=False, tags=["pool"]) as (mallory, _):
            assign = await next_message(mallory, m.AssignTasks)
            assert [(a.task_id, a.attempt) for a in assign.tasks] == [(tid, 2)]
            await send(mallory, results((tid, 1, "succeeded"), planted=True))
            await refused_reply(mallory, m.TaskRef(tid, 1))
            assert c.runtime.stats["refused_result"] == 1
            async with raw_worker(c.base_url, victim_key, "victim", autoping=False) as (victim, _):
                await send(victim, results((tid, 1, "cancelled")))
                ack = await next_message(victim, m.ResultAck)
                assert m.TaskRef(tid, 1) in ack.tasks
            assert c.runtime.state.tasks[tid].outcome is None  # history only
            await send(mallory, results((tid, 2, "succeeded")))
            out = await c.wait(tid)
            assert (out["state"], out["outcome"]["attempt"], out["outcome"]["worker_id"]) == ("succeeded", 2, "mallory")
            assert await result_rows(c, tid) == [(1, "victim", "cancelled"), (2, "mallory", "succeeded")]
            assert c.runtime.stats["refused_result"] == 1


async def test_the_binding_survives_a_coordinator_restart(tmp_path: Path) -> None:
    db = str(tmp_path / "coordinator.duckdb")
    async with run_cluster(tmp_path, workers=0, db_path=db, worker_ttl_s=TTL) as c:
        victim_key, impostor_key = await c.create_key("worker"), await c.create_key("worker")
        async with raw_worker(c.base_url, victim_key, "victim"):
            pass
    async with run_cluster(tmp_path, workers=0, db_path=db, worker_ttl_s=TTL) as c:
        async with register_as(c.base_url, impostor_key, "victim") as reply:
            assert isinstance(reply, m.ErrorMsg) and reply.code == "worker_id_taken"
        assert c.runtime.stats["refused_register"] == 1
        async with raw_worker(c.base_url, victim_key, "victim") as (_, again):
            assert again.worker_id == "victim"


async def test_an_admin_releases_a_disconnected_worker_id_for_a_new_key(tmp_path: Path) -> None:
    """Key rotation: the worker id stays bound to the old key (revoked or not) until an admin
    releases it (never while connected); then the new key takes it and the old one is refused."""
    async with run_cluster(tmp_path, workers=0, worker_ttl_s=TTL) as c:
        old_key, new_key = await c.create_key("worker"), await c.create_key("worker")
        release = "/api/v1/workers/victim/release"
        async with raw_worker(c.base_url, old_key, "victim"):
            status, body = await c.request("POST", release)
            assert status == 409 and "connected" in body["message"], body
        await wait_for(lambda: not c.runtime.state.workers["victim"].connected, what="the worker to disconnect")
        status, body = await c.request("POST", release, key=await c.create_key("submitter"))
        assert status == 403 and "workers:manage" in body["message"], body
        status, body = await c.request("POST", "/api/v1/workers/nobody/release")
        assert status == 404, body
        status, body = await c.request("POST", release, json={"force": True})
        assert status == 400 and body["errors"][0]["field"] == "(body)", body
        async with register_as(c.base_url, new_key, "victim") as reply:
            assert isinstance(reply, m.ErrorMsg) and reply.code == "worker_id_taken"
        argv = ["--coordinator", c.base_url, "--api-key", c.admin_key, "workers", "release", "victim"]
        assert await asyncio.to_thread(dt.main, argv) == 0
        assert c.runtime.state.workers["victim"].key_id == ""
        async with raw_worker(c.base_url, new_key, "victim") as (_, reply):
            assert reply.worker_id == "victim"
        async with register_as(c.base_url, old_key, "victim") as reply:
            assert isinstance(reply, m.ErrorMsg) and reply.code == "worker_id_taken"
        assert c.runtime.stats["refused_register"] == 2
        assert await asyncio.to_thread(dt.main, [*argv[:-1], "nobody"]) == 2  # unknown worker: dt says so


async def test_a_real_workers_refused_result_is_settled_in_its_outbox(tmp_path: Path) -> None:
    """A result the coordinator will never take (its task is unknown there: say the coordinator
    lost its state) is acknowledged when the worker re-sends it at registration, so its outbox
    forgets it instead of re-sending it at every reconnect."""
    async with run_cluster(tmp_path, workers=1) as c:
        agent = c.agents[0]
        now = time.time()
        await agent.result_store.add(m.TaskResult("ghost", 3, "succeeded", now - 1, now))
        assert [r.task_id for r in await agent.result_store.unacked()] == ["ghost"]
        sessions = agent.sessions
        c.runtime.sessions["w0"].close("test: reconnect")  # the worker re-sends its outbox on registering
        await wait_for(lambda: agent.sessions > sessions and not agent.result_store.unacked_refs(),
                       what="the refused result to be settled")
        assert c.runtime.stats["refused_result"] == 1
        assert await result_rows(c, "ghost") == []
        (tid,) = await c.submit({"type": "custom", "config": {"name": "noop"}})
        assert (await c.wait(tid))["state"] == "succeeded"  # the session carries on


async def test_a_non_member_cannot_report_for_a_gang_attempt(tmp_path: Path) -> None:
    """Before, a non-member's result for a running gang attempt was stored under that attempt,
    and (the first row per attempt is kept) stood in for the gang's own combined row."""
    training = {"task_id": "ddp", "type": "training", "requirements": {"tags": ["gang"]},
                "config": {"model": "mlp", "nodes": 2, "batch_size": 32, "steps": 3}}
    async with run_cluster(tmp_path, workers=0, worker_ttl_s=TTL) as c:
        keys = [await c.create_key("worker") for _ in range(3)]
        async with (raw_worker(c.base_url, keys[0], "ga", autoping=False, tags=["gang"]) as (ga, _),
                    raw_worker(c.base_url, keys[1], "gb", autoping=False, tags=["gang"]) as (gb, _),
                    raw_worker(c.base_url, keys[2], "mallory", autoping=False) as (mallory, _)):
            await c.submit(training)
            (a0,) = (await next_message(ga, m.AssignTasks)).tasks
            (a1,) = (await next_message(gb, m.AssignTasks)).tasks
            await send(mallory, results(("ddp", 1, "succeeded"), planted=True))
            await refused_reply(mallory, m.TaskRef("ddp", 1))
            await send(mallory, m.TaskStarted([m.TaskRef("ddp", 1)], time.time()))
            err = await next_message(mallory, m.ErrorMsg)
            assert err.code == "started_refused"
            await send(mallory, m.TaskProgress(m.TaskRef("ddp", 1), 0.5))
            err = await next_message(mallory, m.ErrorMsg)
            assert err.code == "progress_refused"
            assert (c.runtime.stats["refused_result"], c.runtime.stats["refused_started"],
                    c.runtime.stats["refused_progress"]) == (1, 1, 1)
            assert c.runtime.state.tasks["ddp"].state == "assigned" and await result_rows(c, "ddp") == []
            for ws, a in ((gb, a1), (ga, a0)):
                await send(ws, results(("ddp", a.attempt, "succeeded"), node_rank=a.gang.node_rank if a.gang else -1))
            out = await c.wait("ddp")
            assert out["state"] == "succeeded" and out["outcome"]["members"] == ["ga", "gb"]
            assert await result_rows(c, "ddp") == [(1, "ga", "succeeded")]
            status, body = await c.request("GET", "/api/v1/results", params={"task_id": "ddp"})
            assert "planted" not in body["results"][0]["output"]


async def test_only_the_holder_asked_for_a_task_back_can_give_it_back(tmp_path: Path) -> None:
    """``taken_back`` is the worker's answer to the coordinator's ``take_back``: a drop of a task
    nobody asked the sender for (another worker's, or its own unasked) is refused and moves
    nothing; ``take_back`` itself is the coordinator's message, refused from a worker."""
    async with run_cluster(tmp_path, workers=0, worker_ttl_s=TTL) as c:
        victim_key, attacker_key = await c.create_key("worker"), await c.create_key("worker")
        async with (raw_worker(c.base_url, victim_key, "victim", tags=["victim"]) as (_victim, _),
                    raw_worker(c.base_url, attacker_key, "mallory", autoping=False) as (mallory, _)):
            (tid,) = await c.submit(task("held", "victim"))
            await wait_for(lambda: c.runtime.state.tasks[tid].worker_id == "victim", what="the task on the victim")
            await send(mallory, m.TakenBack(dropped=[m.TaskRef(tid, 1)], kept=[]))
            err = await next_message(mallory, m.ErrorMsg)
            assert err.code == "taken_back_refused" and tid in err.detail and not err.fatal
            assert c.runtime.stats["refused_taken_back"] == 1
            t = c.runtime.state.tasks[tid]
            assert (t.state, t.worker_id, t.attempt) == ("assigned", "victim", 1)
            await send(mallory, m.TakeBack([m.TaskRef(tid, 1)]))
            err = await next_message(mallory, m.ErrorMsg)
            assert err.code == "protocol_error" and "TakeBack is not accepted from a worker" in err.detail
            assert (t.state, t.worker_id, t.attempt) == ("assigned", "victim", 1)


@pytest.mark.parametrize("version", [m.PROTOCOL_VERSION - 1, m.PROTOCOL_VERSION + 1])
async def test_a_worker_of_another_protocol_version_is_refused_with_the_version_error(
        tmp_path: Path, version: int) -> None:
    """Version 8 added pipelining (``take_back``): a version 7 worker would never answer one, so it
    is refused at registration like any other mismatch, naming the version this coordinator speaks."""
    async with run_cluster(tmp_path, workers=0) as c:
        key = await c.create_key("worker")
        async with aiohttp.ClientSession() as http, http.ws_connect(
                c.base_url.replace("http://", "ws://") + "/ws/worker", headers={"Authorization": f"Bearer {key}"}) as ws:
            ch = Channel(derive_session_key(key, ws._response.headers["X-DT-Session"]))  # type: ignore[union-attr]
            await ws.send_bytes(ch.seal(m.Register(worker_id="old", name="old", protocol_version=version, hardware={},
                                                   capabilities=["cpu"], tags=[], max_concurrent=1), time.time()))
            frame = await ws.receive(timeout=10)
            reply = ch.open(frame.data, time.time())
            assert isinstance(reply, m.ErrorMsg) and reply.code == "bad_register" and reply.fatal
            assert f"protocol_version {m.PROTOCOL_VERSION}" in reply.detail
        assert "old" not in c.runtime.state.workers


async def test_a_result_batch_with_one_foreign_attempt_stores_only_the_senders_own(tmp_path: Path) -> None:
    """Several results in one signed frame (a batch of results messages) are checked one by one:
    the attempts the sender holds are stored, the one it slipped in for another worker's task is
    refused, acknowledged and not stored, and that task's own worker still makes its outcome."""
    async with run_cluster(tmp_path, workers=0, worker_ttl_s=TTL) as c:
        victim_key, attacker_key = await c.create_key("worker"), await c.create_key("worker")
        async with (raw_worker(c.base_url, victim_key, "victim", tags=["victim"]) as (victim, _),
                    raw_worker(c.base_url, attacker_key, "mallory", tags=["mallory"], autoping=False,
                               max_concurrent=2) as (mallory, _)):
            own = await c.submit([task("own-1", "mallory"), task("own-2", "mallory")])
            (other,) = await c.submit(task("other", "victim"))
            await wait_for(lambda: all(c.runtime.state.tasks[t].worker_id == "mallory" for t in own)
                           and c.runtime.state.tasks[other].worker_id == "victim", what="the three tasks placed")
            # one signed batch frame: a results message mixing its own and a foreign attempt, then another
            await send(mallory, m.Batch([results((own[0], 1, "succeeded"), (other, 1, "succeeded"), by="mallory"),
                                         results((own[1], 1, "succeeded"), by="mallory")]))
            await refused_reply(mallory, m.TaskRef(other, 1))
            for tid in own:
                assert (await c.wait(tid))["state"] == "succeeded"
                assert await result_rows(c, tid) == [(1, "mallory", "succeeded")]
            assert c.runtime.stats["refused_result"] == 1
            assert c.runtime.state.tasks[other].outcome is None and await result_rows(c, other) == []
            await send(victim, results((other, 1, "failed"), real=True))
            assert (await c.wait(other))["outcome"]["worker_id"] == "victim"
