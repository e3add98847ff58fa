"""``aio.wait_event``: the bounded wait of loops that must stop when cancelled. A cancel that
arrives in any event-loop turn after the event was set ends the loop; on Python 3.11 the same loop
around ``asyncio.wait_for`` goes on (it returns the event's result and drops the cancel), which
kept a worker's heartbeat loop, and so the worker process, alive for ever after SIGTERM."""

from __future__ import annotations

import asyncio

import pytest

from distributed_testing.process.aio import wait_event

pytestmark = pytest.mark.asyncio


async def test_it_says_whether_the_event_was_set() -> None:
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    event.set()
    assert await wait_event(event, 10) is True


@pytest.mark.parametrize("turns", range(5))
async def test_a_cancel_just_after_the_event_is_set_stops_the_loop(turns: int) -> None:
    event = asyncio.Event()
    laps = 0

    async def beats() -> None:  # the shape of the worker's heartbeat loop
        nonlocal laps
        while True:
            await wait_event(event, 60)
            event.clear()
            laps += 1

    task = asyncio.create_task(beats())
    await asyncio.sleep(0)  # waiting
    event.set()  # a drain wakes it...
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()  # ...as the session's end cancels it
    done, _ = await asyncio.wait({task}, timeout=5)
    assert task in done and task.cancelled()
    assert laps <= 1
