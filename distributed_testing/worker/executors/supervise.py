"""Per-task limits every executor enforces: wall-clock timeout and process-tree memory.

:func:`run_limited` awaits a task's main awaitable (a child's exit, a pool reply) while enforcing
``timeout_s`` and, optionally, a :class:`MemoryWatch`. It never kills anything itself: it reports
which limit fired and the caller kills the child's process group, because only the caller knows
what else must be cleaned up (a pool slot to replace, a temp dir to remove).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import psutil

from distributed_testing.worker.executors.proc import process_tree_rss

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_POLL_INTERVAL_S = 0.2
_MB = 1024 * 1024


class MemoryWatch:
    """Polls the memory of a process tree (RSS plus its own tmpfs: :func:`.proc.process_tree_rss`)
    and reports when it exceeds ``limit_mb``.

    ``peak_bytes`` holds the largest tree RSS seen so far and stays readable after the watch ends.
    Sampling runs in a thread (psutil reads /proc), so the event loop is never blocked.
    """

    def __init__(self, pid: int, limit_mb: int, interval_s: float = DEFAULT_POLL_INTERVAL_S) -> None:
        if limit_mb <= 0:
            raise ValueError(f"memory limit must be positive, got {limit_mb} MB")
        self.pid = pid
        self.limit_mb = limit_mb
        self.interval_s = interval_s
        self.peak_bytes = 0

    @property
    def peak_mb(self) -> float:
        return round(self.peak_bytes / _MB, 1)

    def describe_exceeded(self) -> str:
        return (f"memory limit of {self.limit_mb} MB exceeded: peak RSS {self.peak_mb} MB (with the files in its own "
                "/dev/shm and /tmp)")

    async def wait_exceeded(self) -> bool:
        """Return True as soon as the tree's RSS exceeds the limit, False once ``pid`` is gone."""
        limit_bytes = self.limit_mb * _MB
        while True:
            try:
                rss = await asyncio.to_thread(process_tree_rss, self.pid)
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                return False
            self.peak_bytes = max(self.peak_bytes, rss)
            if rss > limit_bytes:
                logger.info("pid %d tree: %s", self.pid, self.describe_exceeded())
                return True
            await asyncio.sleep(self.interval_s)


@dataclass(frozen=True)
class Limited(Generic[T]):
    """What :func:`run_limited` saw: the awaitable finished, or a limit fired first."""

    verdict: Literal["done", "timed_out", "memory"]
    value: T | None = None


async def run_limited(
    main: Awaitable[T], *, timeout_s: float | None, watch: MemoryWatch | None = None
) -> Limited[T]:
    """Await ``main`` under a timeout and an optional memory watch.

    Returns ``Limited("done", result)`` if ``main`` finished first (its exception propagates),
    otherwise ``Limited("timed_out")`` or ``Limited("memory")`` after cancelling ``main``. If the
    caller is cancelled, ``main`` and the watch are cancelled and CancelledError propagates.
    """
    if watch is None:
        return await _run_with_timeout(main, timeout_s)
    main_task = asyncio.ensure_future(main)
    guard: asyncio.Future[bool] | None = asyncio.ensure_future(watch.wait_exceeded())
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while True:
            pending: set[asyncio.Future[Any]] = {main_task}
            if guard is not None:
                pending.add(guard)
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, _ = await asyncio.wait(pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            if main_task in done:
                return Limited("done", main_task.result())
            if guard is not None and guard in done:
                if guard.result():
                    return await _abandon(main_task, "memory")
                guard = None  # process gone: keep waiting for main without a watch
                continue
            return await _abandon(main_task, "timed_out")
    finally:
        for task in (main_task, guard):
            if task is not None and not task.done():
                task.cancel()


async def _run_with_timeout(main: Awaitable[T], timeout_s: float | None) -> Limited[T]:
    """The common case, without a memory watch: a timeout scope, no extra task (cheaper per task)."""
    scope = asyncio.timeout(timeout_s)
    try:
        async with scope:
            return Limited("done", await main)
    except TimeoutError:
        if scope.expired():
            return Limited("timed_out")
        raise


async def _abandon(main_task: asyncio.Future[T], verdict: Literal["timed_out", "memory"]) -> Limited[T]:
    """Cancel ``main_task`` and wait for it; if it finished in the meantime, report it as done."""
    main_task.cancel()
    await asyncio.wait({main_task})
    if not main_task.cancelled():
        return Limited("done", main_task.result())
    return Limited(verdict)
