"""A busy worker holds finished results while its last ``results`` message waits for an ack, and
sends them in one message when the ack comes (or when the hold ends); an idle one sends at once.

A real WorkerAgent (real pool children, real signed WebSocket) talks to a hand-driven coordinator
endpoint, so the test decides when acks go out.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from distributed_testing.config import WorkerConfig
from distributed_testing.protocol import messages as m
from distributed_testing.protocol.signing import Channel, derive_session_key
from distributed_testing.testing import wait_for
from distributed_testing.worker import agent as agent_mod
from distributed_testing.worker.agent import SESSION_HEADER, WorkerAgent
from distributed_testing.worker.auth import Credentials
from distributed_testing.worker.executors import default_executors
from distributed_testing.worker.outbox import MemoryOutbox

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
KEY = "dt_test_key_for_a_hand_driven_coordinator"


@dataclass
class HandCoordinator:
    """The coordinator side of one worker session, driven by the test."""

    received: asyncio.Queue[m.Message] = field(default_factory=asyncio.Queue)
    ws: web.WebSocketResponse | None = None
    channel: Channel | None = None

    async def endpoint(self, request: web.Request) -> web.WebSocketResponse:
        session_id = secrets.token_urlsafe(8)
        ws = web.WebSocketResponse()
        ws.headers[SESSION_HEADER] = session_id
        await ws.prepare(request)
        self.ws, self.channel = ws, Channel(derive_session_key(KEY, session_id))
        async for frame in ws:
            msg = self.channel.open(frame.data, time.time())
            if isinstance(msg, m.Register):
                await self.send(m.Registered(worker_id=msg.worker_id, session_id=session_id,
                                             heartbeat_interval_s=60.0, server_time=time.time()))
            elif not isinstance(msg, m.Heartbeat | m.TaskStarted):
                await self.received.put(msg)
        return ws

    async def send(self, msg: m.Message) -> None:
        assert self.ws is not None and self.channel is not None
        await self.ws.send_bytes(self.channel.seal(msg, time.time()))

    async def assign(self, *task_ids: str) -> None:
        await self.send(m.AssignTasks([m.TaskAssignment(task_id=t, attempt=1, type="custom", config={"name": "noop"})
                                       for t in task_ids]))

    async def results(self) -> list[str]:
        msg = await asyncio.wait_for(self.received.get(), 10)
        assert isinstance(msg, m.Results), msg
        return sorted(r.task_id for r in msg.results)

    async def ack(self, *task_ids: str) -> None:
        await self.send(m.ResultAck([m.TaskRef(t, 1) for t in task_ids]))


@contextlib.asynccontextmanager
async def hand_session(tmp_path: Path) -> AsyncIterator[tuple[HandCoordinator, WorkerAgent]]:
    coord = HandCoordinator()
    app = web.Application()
    app.router.add_get("/ws/worker", coord.endpoint)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    config = WorkerConfig(coordinator_url=url, api_key=KEY, name="w", worker_id="w", max_concurrent_tasks=4,
                          heartbeat_interval_s=60.0, reconnect_interval_s=0.1, test_root=tmp_path)
    agent = WorkerAgent(config, default_executors(4, cache_dir=tmp_path / "cache"), MemoryOutbox(), {}, ["cpu"],
                        Credentials(url, api_key=KEY))
    run = asyncio.create_task(agent.run())
    try:
        await wait_for(agent.registered.is_set, what="the worker to register")
        yield coord, agent
    finally:
        agent.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(run, 10)
        await runner.cleanup()


async def test_results_wait_for_the_previous_ack_and_go_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_mod, "RESULT_HOLD_S", 30.0)  # only the ack can end the hold here
    async with hand_session(tmp_path) as (coord, agent):
        await coord.assign("a")
        assert await coord.results() == ["a"]  # nothing unacknowledged: sent at once
        await coord.assign("b", "c", "d")
        # "not agent.running" would also hold before the worker has read the assignment
        await wait_for(lambda: len(agent.outbox.unacked_refs()) == 4, what="b, c and d to finish")
        assert coord.received.empty()  # finished, but held: "a" is not acknowledged yet
        await coord.ack("a")
        assert await coord.results() == ["b", "c", "d"]  # one message
        await coord.ack("b", "c", "d")
        await coord.assign("e")
        assert await coord.results() == ["e"]  # idle again: at once


async def test_a_missing_ack_delays_results_only_until_the_hold_ends(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_mod, "RESULT_HOLD_S", 0.3)
    async with hand_session(tmp_path) as (coord, agent):
        await coord.assign("a")
        assert await coord.results() == ["a"]
        await coord.assign("b")
        assert await coord.results() == ["b"]  # "a" never acknowledged: sent when the hold ended
        assert agent.outbox.unacked_refs() == [m.TaskRef("a", 1), m.TaskRef("b", 1)]
