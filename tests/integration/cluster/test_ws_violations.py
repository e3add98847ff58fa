"""Bad frames on a real worker WebSocket: each is refused with a typed error the peer is told
about and the coordinator counts; repeated violations close that connection only."""

import time

import aiohttp
import pytest

from distributed_testing.protocol import messages as m
from distributed_testing.testing import raw_worker, run_cluster

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


async def next_error(ws: aiohttp.ClientWebSocketResponse, channel) -> m.ErrorMsg:
    while True:
        frame = await ws.receive(timeout=10)
        assert frame.type == aiohttp.WSMsgType.BINARY, frame
        msg = channel.open(frame.data, time.time())
        if isinstance(msg, m.ErrorMsg):
            return msg


async def test_each_bad_frame_is_refused_counted_and_five_close_the_session(tmp_path):
    async with run_cluster(tmp_path, workers=1) as c:
        key = await c.create_key("worker")
        async with raw_worker(c.base_url, key, "mallory", autoping=False) as (ws, _registered):
            channel = ws._dt_channel  # the raw worker's own signing channel
            hb = m.Heartbeat(state="ready", running=[], cpu_percent=0, memory_percent=0, free_slots=1)
            good = channel.seal(hb, time.time())
            await ws.send_bytes(good)
            tampered = bytearray(channel.seal(hb, time.time()))
            tampered[-1] ^= 1
            cases = [(bytes(tampered), "bad_signature"), (good, "replayed_sequence"),
                     (channel.seal(hb, time.time() - 3600), "stale_timestamp"), (b"\x00" * 10, "malformed")]
            for frame, code in cases:
                await ws.send_bytes(frame)
                assert (await next_error(ws, channel)).code == code
            for code in ("bad_signature", "replayed_sequence", "stale_timestamp", "malformed"):
                assert c.runtime.stats[f"rejected_{code}"] >= 1
            await ws.send_bytes(b"garbage" * 10)  # the fifth violation: refused, then the session ends
            assert (await next_error(ws, channel)).code == "bad_signature"
            fatal = await next_error(ws, channel)
            assert fatal.code == "too_many_violations" and fatal.fatal
            closed = await ws.receive(timeout=10)
            assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        # the well-behaved worker never noticed
        ids = await c.submit({"type": "custom", "config": {"name": "noop"}})
        assert (await c.wait(ids[0]))["state"] == "succeeded"
