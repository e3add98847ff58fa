"""A real WorkerAgent (real pool children, real signed WebSocket) talking to a hand-driven
coordinator endpoint, so a test decides what the coordinator sends and when. Imported as
``from hand_support import ...`` by the tests beside it."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from distributed_testing.config import WorkerConfig
from distributed_testing.protocol import messages as m
from distributed_testing.protocol.signing import SESSION_HEADER, Channel, derive_session_key
from distributed_testing.testing import wait_for
from distributed_testing.worker.agent import WorkerAgent
from distributed_testing.worker.auth import Credentials
from distributed_testing.worker.executors import default_executors
from distributed_testing.worker.result_store import MemoryResultStore

KEY = "dt_test_key_for_a_hand_driven_coordinator"


@dataclass
class HandCoordinator:
    """The coordinator side of one worker session, driven by the test."""

    received: asyncio.Queue[m.Message] = field(default_factory=asyncio.Queue)
    registers: list[m.Register] = field(default_factory=list)
    started: list[m.TaskRef] = field(default_factory=list)
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
                self.registers.append(msg)
                await self.send(m.Registered(worker_id=msg.worker_id, session_id=session_id,
                                             heartbeat_interval_s=60.0, server_time=time.time(),
                                             worker_ttl_s=180.0))
            elif isinstance(msg, m.TaskStarted):
                self.started += msg.tasks
            elif not isinstance(msg, m.Heartbeat):
                await self.received.put(msg)
        return ws

    async def send(self, msg: m.Message) -> None:
        assert self.ws is not None and self.channel is not None
        await self.ws.send_bytes(self.channel.seal(msg, time.time()))

    async def assign(self, *task_ids: str, attempt: int = 1, provisional: int = 0,
                     config: dict[str, Any] | None = None) -> None:
        await self.send(m.AssignTasks([m.TaskAssignment(task_id=t, attempt=attempt, type="custom",
                                                        config=config or {"name": "noop"}) for t in task_ids],
                                      provisional=provisional))

    async def drop(self) -> None:
        """End this session from the coordinator's side (the worker reconnects)."""
        assert self.ws is not None
        await self.ws.close()

    async def results(self) -> list[str]:
        msg = await asyncio.wait_for(self.received.get(), 10)
        assert isinstance(msg, m.Results), msg
        return sorted(r.task_id for r in msg.results)

    async def ack(self, *task_ids: str) -> None:
        await self.send(m.ResultAck([m.TaskRef(t, 1) for t in task_ids]))


@contextlib.asynccontextmanager
async def hand_session(tmp_path: Path, executors: dict[str, Any] | None = None, result_store: Any = None
                       ) -> AsyncIterator[tuple[HandCoordinator, WorkerAgent]]:
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
    agent = WorkerAgent(config, executors or default_executors(4, cache_dir=tmp_path / "cache"),
                        result_store or MemoryResultStore(), {}, ["cpu"],
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


