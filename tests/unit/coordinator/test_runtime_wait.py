"""``?wait`` answers only with outcomes that are on disk: an outcome already set in memory whose
records are still being written is waited for, not returned."""

from __future__ import annotations

import asyncio

import pytest

from distributed_testing.config import CoordinatorConfig
from distributed_testing.coordinator.runtime import Runtime
from distributed_testing.coordinator.store.base import Record
from distributed_testing.coordinator.store.memory import MemoryStore
from distributed_testing.protocol import messages as m
from distributed_testing.tasks.spec import parse_tasks


class GatedStore(MemoryStore):
    """A MemoryStore whose appends complete only when the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gated = False
        self.held: list[asyncio.Future[None]] = []

    def append(self, records: list[Record]) -> asyncio.Future[None]:
        if not self.gated:
            return super().append(records)
        super().append(records)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.held.append(fut)
        return fut

    def release(self) -> None:
        for fut in self.held:
            fut.set_result(None)
        self.held.clear()


@pytest.mark.asyncio
async def test_wait_does_not_answer_with_an_outcome_still_being_written() -> None:
    store = GatedStore()
    await store.open()
    rt = Runtime(CoordinatorConfig(), store, clock=lambda: 100.0)
    reg = m.Register(worker_id="w", name="w", protocol_version=m.PROTOCOL_VERSION, hardware={},
                     capabilities=["cpu"], tags=[], max_concurrent=1)
    await rt.execute(rt.state.register(reg, "s1", 100.0))
    _, cmds = rt.state.submit(parse_tasks({"task_id": "t1", "type": "custom", "config": {"name": "noop"}}), 100.0)
    await rt.execute(cmds)

    store.gated = True
    result = m.Results([m.TaskResult("t1", 1, "succeeded", 100.0, 100.5)])
    written = rt.execute(rt.state.results("w", result, 100.5))
    assert rt.state.tasks["t1"].outcome is not None  # set in memory, not yet on disk
    waiting = asyncio.ensure_future(rt.wait_terminal(["t1"], 10.0))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done(), "?wait answered before the outcome was durable"

    store.release()
    await asyncio.wait_for(waiting, 5)
    await written
    await asyncio.wait_for(rt.wait_terminal(["t1"], 10.0), 1)  # durable now: answers at once
    assert not rt._undurable and not rt._waiters
