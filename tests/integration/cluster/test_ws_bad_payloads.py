"""Signed frames found by fuzzing the worker endpoint (tests/fuzz), on a real coordinator with a
DuckDB store: each is refused as ``malformed`` and the session goes on. Before, a str that is not
UTF-8 ended the session with an unhandled exception, and an extension type, an odd map key or an
attempt beyond 64 bits was accepted and then crashed the store's checkpointer, after which every
write (submissions, results, registrations) failed."""

from __future__ import annotations

import hashlib
import hmac
import time
from pathlib import Path

import msgspec
import pytest

from distributed_testing.protocol import messages as m
from distributed_testing.protocol.signing import Channel
from distributed_testing.testing import next_message, raw_worker, run_cluster

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


def signed(ch: Channel, msg: dict[str, object]) -> bytes:
    ch.send_seq += 1
    payload = msgspec.msgpack.encode([ch.send_seq, time.time(), msg])
    return hmac.new(ch.key, payload, hashlib.sha256).digest() + payload


def result(**over: object) -> dict[str, object]:
    r = {"task_id": "t", "attempt": 1, "status": "succeeded", "started_at": 0.0, "finished_at": 1.0, **over}
    return {"type": "results", "results": [r]}


async def test_each_is_malformed_and_the_store_keeps_working(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=1, db_path=str(tmp_path / "c.duckdb"), max_violations=10) as c:
        async with raw_worker(c.base_url, await c.create_key("worker"), "fuzzed", autoping=False) as (ws, _):
            ch: Channel = ws._dt_channel  # type: ignore[attr-defined]
            not_utf8 = signed(ch, {"type": "goodbye", "reason": "x"})
            not_utf8 = not_utf8[:32] + not_utf8[32:].replace(b"\xa1x", b"\xa1\xff")
            not_utf8 = hmac.new(ch.key, not_utf8[32:], hashlib.sha256).digest() + not_utf8[32:]
            frames = [not_utf8, signed(ch, result(output={"x": msgspec.msgpack.Ext(1, b"")})),
                      signed(ch, result(output={"x": {None: 1}})), signed(ch, result(attempt=2**64 - 1))]
            for frame in frames:
                await ws.send_bytes(frame)
                reply = await next_message(ws)
                assert isinstance(reply, m.ErrorMsg) and (reply.code, reply.fatal) == ("malformed", False), reply
            await ws.send_bytes(ch.seal(m.Results([m.TaskResult("ok", 1, "succeeded", 0.0, 1.0)]), time.time()))
            reply = await next_message(ws, m.ResultAck)  # settled (refused: there is no task "ok")
            assert reply == m.ResultAck([m.TaskRef("ok", 1)])  # the session still works
        await c.runtime.store.checkpoint()
        ids = await c.submit({"type": "custom", "config": {"name": "noop"}})
        assert (await c.wait(ids[0]))["state"] == "succeeded"  # and so does everything else
