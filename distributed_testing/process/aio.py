"""The event loop of the long-running processes (coordinator, worker).

uvloop where it is installed (a dependency on Linux and macOS), else asyncio's own loop. Measured
with ``python benchmarks/dispatch.py`` on the 2-core CI machine, uvloop raises dispatch throughput
from about 2,900 to 3,400 tasks/s and takes 0.1–0.3 ms off each HTTP and WebSocket hop.
``DT_EVENT_LOOP=asyncio`` selects asyncio's loop anyway (for its debug mode, or to rule the loop
out when chasing a bug); ``DT_EVENT_LOOP=uvloop`` insists on uvloop and fails if it is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ..errors import ConfigError

log = logging.getLogger(__name__)
T = TypeVar("T")
CHOICES = ("auto", "uvloop", "asyncio")
HELP = "DT_EVENT_LOOP=asyncio|uvloop picks the event loop (default: uvloop when installed)."  # --help epilog


def loop_choice() -> str:
    """The loop ``run`` uses: ``uvloop`` or ``asyncio``, from ``DT_EVENT_LOOP`` (default ``auto``)."""
    want = os.environ.get("DT_EVENT_LOOP", "auto").strip().lower() or "auto"
    if want not in CHOICES:
        raise ConfigError(f"DT_EVENT_LOOP={want!r}: expected one of {', '.join(CHOICES)}")
    if want == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError as exc:
        if want == "uvloop":
            raise ConfigError(f"DT_EVENT_LOOP=uvloop but uvloop cannot be imported: {exc}") from exc
        return "asyncio"
    return "uvloop"


def wake_within(event: asyncio.Event, timer: asyncio.TimerHandle | None,
                delay_s: float) -> asyncio.TimerHandle | None:
    """Have ``event`` set within ``delay_s`` seconds (at once when ``delay_s`` <= 0): how a group
    commit writer is woken for an append that may wait to share the next write. The earliest
    deadline asked for wins. ``timer`` is the one pending from earlier calls (or None); returns
    the one pending now, for the writer to cancel when it takes the queue anyway."""
    if delay_s <= 0:
        event.set()
        return timer
    if event.is_set():
        return timer
    loop = asyncio.get_running_loop()
    due = loop.time() + delay_s
    if timer is None or due < timer.when():
        if timer is not None:
            timer.cancel()
        timer = loop.call_at(due, event.set)
    return timer


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``event`` is set, for at most ``timeout_s``; returns whether it is set.

    This, or ``asyncio.timeout``, is how the package bounds a wait, never ``asyncio.wait_for``
    (ruff bans it: TID251 in pyproject.toml). On Python 3.11 ``wait_for`` drops a cancel that
    arrives while the awaited thing completes (it returns the result instead), so a loop around
    it can outlive its cancel for ever: the worker's heartbeat loop did when a drain woke it just
    as the session ended, and the worker process never exited after SIGTERM. ``asyncio.timeout``
    passes such a cancel on."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
    return event.is_set()


def run(main: Coroutine[Any, Any, T], loop: str | None = None) -> T:
    """``asyncio.run(main)`` on ``loop`` (``uvloop`` or ``asyncio``; default: ``loop_choice()``)."""
    loop = loop or loop_choice()
    log.info("event loop: %s", loop)
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


__all__ = ["run", "loop_choice", "wake_within", "wait_event", "CHOICES", "HELP"]


async def thread_to_end(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``asyncio.to_thread(fn, ...)`` whose cancellation waits for the thread to end before it
    propagates: a thread cannot be stopped, so a cancelled caller's cleanup (removing the folder
    the thread writes into, building the same tree again) would otherwise race it."""
    job = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await job  # its own outcome does not matter any more: the cancel does
        raise
