"""The coordinator's per-session WebSocket writer: frames go out in queue order, and a ``confirm``
directly followed by a ``result_ack`` (both due after the same fsync) goes out as one frame."""

from __future__ import annotations

import time
from typing import Any

import pytest

from distributed_testing.config import CoordinatorConfig
from distributed_testing.coordinator import ws as ws_mod
from distributed_testing.coordinator.runtime import Runtime, Session
from distributed_testing.coordinator.store.memory import MemoryStore
from distributed_testing.protocol import messages as m
from distributed_testing.protocol.signing import Channel

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(10)]
KEY = b"k" * 32


class CapturingWs:
    """Stands in for the aiohttp WebSocketResponse: records the frames sent."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.closed = False

    async def send_bytes(self, data: bytes) -> None:
        self.frames.append(data)

    async def close(self, message: bytes = b"") -> None:
        self.closed = True


async def _sent(*queued: m.Message) -> list[m.Message]:
    s = Session(session_id="s", worker_id="w", key_id="k", channel=Channel(KEY))
    for msg in queued:
        s.send(msg)
    s.close("done")
    ws = CapturingWs()
    await ws_mod._writer(Runtime(CoordinatorConfig(), MemoryStore()), ws, s)  # type: ignore[arg-type]
    peer = Channel(KEY)
    return [peer.open(f, time.time()) for f in ws.frames]


ACK = m.ResultAck([m.TaskRef("a", 1)])


@pytest.mark.parametrize(("queued", "sent"), [
    ((m.Confirm(3), ACK), [m.ResultAck([m.TaskRef("a", 1)], confirm_upto=3)]),
    ((m.Confirm(3), m.Cancel(m.TaskRef("b", 1), "x"), ACK), [m.Confirm(3), m.Cancel(m.TaskRef("b", 1), "x"), ACK]),
    ((ACK, m.Confirm(3)), [ACK, m.Confirm(3)]),
    ((m.Confirm(2), m.Confirm(3), ACK), [m.Confirm(2), m.ResultAck([m.TaskRef("a", 1)], confirm_upto=3)]),
    ((m.Confirm(3),), [m.Confirm(3)]),
])
async def test_frames_keep_their_order_and_a_confirm_rides_on_the_next_ack(queued: Any, sent: Any) -> None:
    assert await _sent(*queued) == sent
