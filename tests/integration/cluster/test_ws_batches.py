"""``batch`` frames over a real signed session (coordinator/ws.py): what the coordinator has queued
for a worker at once goes out as one frame to a worker that reads batches, one frame per message to
one that does not; a worker's batch is handled message by message."""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp
import msgspec
import pytest

from distributed_testing.protocol import messages as m
from distributed_testing.protocol.codec import encode_envelope
from distributed_testing.testing import next_message, raw_worker, run_cluster, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


async def frames(ws: aiohttp.ClientWebSocketResponse, n: int) -> list[m.Message]:
    return [await next_message(ws) for _ in range(n)]


async def test_what_is_queued_at_once_goes_in_one_frame_to_a_worker_that_reads_batches(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=0, worker_ttl_s=60.0) as c:
        key = await c.create_key("worker")
        queued = [m.TakeBack([m.TaskRef("a", 1)]), m.Cancel(m.TaskRef("b", 1), "why"), m.Confirm(0)]
        async with raw_worker(c.base_url, key, "reads", autoping=False, batches=True) as (ws, reply):
            assert reply.batches  # this coordinator reads them too
            session = c.runtime.sessions["reads"]
            for msg in queued:
                session.send(msg)
            assert await frames(ws, 1) == [m.Batch(queued)]  # type: ignore[arg-type]
        async with raw_worker(c.base_url, key, "plain", autoping=False) as (ws, _):
            session = c.runtime.sessions["plain"]
            for msg in queued:
                session.send(msg)
            assert await frames(ws, 3) == queued


async def test_a_workers_batch_is_handled_message_by_message(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=0, worker_ttl_s=60.0) as c:
        key = await c.create_key("worker")
        async with raw_worker(c.base_url, key, "w", autoping=False, batches=True) as (ws, _):
            (tid,) = await c.submit({"type": "custom", "config": {"name": "noop"}})
            assign = await next_message(ws, m.AssignTasks)
            now = time.time()
            done = m.Results([m.TaskResult(task_id=tid, attempt=assign.tasks[0].attempt, status="succeeded",
                                           started_at=now, finished_at=now)])
            beat = m.Heartbeat("ready", [], 1.0, 1.0, 1)
            bad = m.AuthRenew("not a token")  # refused alone: the session ends, as for a single frame
            await ws.send_bytes(ws._dt_channel.seal(m.Batch([beat, done, bad]), now))  # type: ignore[attr-defined]
            assert (await c.wait(tid))["state"] == "succeeded"
            await wait_for(lambda: "w" not in c.runtime.sessions, what="the session to end at the bad token")


async def test_registered_says_batches_and_reports_only_to_a_worker_that_announced_them(tmp_path: Path) -> None:
    """A worker of protocol 11 built before ``registered.batches`` / ``.reports`` refuses unknown
    fields: a worker that did not announce them gets a ``registered`` without them."""
    old = msgspec.defstruct("Registered", [("worker_id", str), ("session_id", str), ("heartbeat_interval_s", float),
                                           ("server_time", float), ("worker_ttl_s", float)],
                            forbid_unknown_fields=True)
    async with run_cluster(tmp_path, workers=0, worker_ttl_s=60.0) as c:
        key = await c.create_key("worker")
        async with raw_worker(c.base_url, key, "new", autoping=False, batches=True, reports=True) as (_, reply):
            assert reply.batches and reply.reports
        async with raw_worker(c.base_url, key, "old", autoping=False) as (_, reply):
            assert not reply.batches and not reply.reports
            payload = msgspec.msgpack.decode(encode_envelope(1, 0.0, reply))[2]
            assert "batches" not in payload and "reports" not in payload, payload
            del payload["type"]
            msgspec.convert(payload, old)  # what such a worker reads: accepted
