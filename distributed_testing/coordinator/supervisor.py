"""Fail hard: the coordinator's background tasks and its one fatal failure.

A write the store could not make leaves memory ahead of the disk, and a background task that died
(the ticker, the store's journal writer or checkpointer) leaves the coordinator half working. In
both cases the process must stop rather than go on (dask's ``fail_hard``): the restart replays the
journal, so what is in memory again is exactly what was durable. :meth:`Supervisor.fail` records
the first such failure, logs it once with its traceback and completes :attr:`Supervisor.failed`;
the entry point (``cli/coordinator.py``) waits on that next to the signals, shuts down and exits
with :data:`EXIT_FATAL`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from .group import LeadershipLost

log = logging.getLogger(__name__)

EXIT_FATAL = 3  # the exit status after a fatal failure while running (documented in docs/operations.md)


def demoted(failure: Failure | None) -> bool:
    """Whether the term ended because this group member lost the leadership (not a failure: the
    coordinator starts a new standby term, ``cli/coordinator.py``)."""
    return failure is not None and isinstance(failure.error, LeadershipLost)


@dataclass(frozen=True)
class Failure:
    """What stopped the coordinator: a sentence naming it, and the exception."""

    what: str
    error: BaseException

    def __str__(self) -> str:
        return f"{self.what}: {self.error}"


class Supervisor:
    """Owns background tasks (``spawn``) and records the first fatal failure (``fail``).

    Create it inside the running loop. A spawned task that ends in any way other than being
    cancelled by :meth:`stop` is a failure: it was meant to run as long as the coordinator.
    """

    def __init__(self) -> None:
        self.failed: asyncio.Future[Failure] = asyncio.get_running_loop().create_future()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping = False

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if self._stopping and task.cancelled():
            return
        if task.cancelled():
            error: BaseException = asyncio.CancelledError(f"{task.get_name()} was cancelled")
        else:
            error = task.exception() or RuntimeError(f"{task.get_name()} returned")
        self.fail(f"background task {task.get_name()} stopped", error)

    def fail(self, what: str, error: BaseException) -> None:
        """Record a fatal failure: the first one is logged (with traceback) and completes
        ``failed``; later ones, usually consequences of the first, are logged in one line."""
        if self.failed.done():
            log.info("also failed after the fatal failure: %s: %s", what, error)
            return
        if isinstance(error, LeadershipLost):  # not a failure of this process: a new standby term follows
            log.warning("%s: %s; ending this term", what, error)
            self.failed.set_result(Failure(what, error))
            return
        log.critical("fatal: %s: %s; stopping the coordinator (a restart replays the journal)", what, error,
                     exc_info=error)
        self.failed.set_result(Failure(what, error))

    @property
    def failure(self) -> Failure | None:
        return self.failed.result() if self.failed.done() else None

    async def stop(self) -> None:
        """Cancel every spawned task and wait for them; a task's own error is a failure too."""
        self._stopping = True
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks)
