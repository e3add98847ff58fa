"""Results the worker has produced and the coordinator has not yet acknowledged.

``add`` registers the result as unacknowledged at once and returns a future that completes once
it is durable (with ``--db-path``: in the worker's journal, then checkpointed into its DuckDB
file); ``unacked`` lists what must be (re)sent after a reconnect;
``ack`` forgets what the coordinator has on disk; ``settled`` records results acknowledged before
they were added (with ``--db-path``, for the file's history). Without a database path the store lives in
memory: it survives reconnects, not a worker crash.
"""

from __future__ import annotations

import asyncio
from typing import NamedTuple, Protocol

from ..protocol import messages as m


class RunningRecord(NamedTuple):
    """A task that was running when the worker stopped without finishing it (``--recover``)."""

    task_id: str
    attempt: int
    started_at: float


class ResultStore(Protocol):
    def add(self, result: m.TaskResult) -> asyncio.Future[None]: ...

    def ack(self, refs: list[m.TaskRef]) -> None: ...

    def settled(self, results: list[m.TaskResult]) -> asyncio.Future[None]:
        """Record results the coordinator acknowledged before they were added (history only: they
        are never re-sent); the future completes as ``add``'s does."""
        ...

    async def unacked(self) -> list[m.TaskResult]: ...

    def unacked_refs(self) -> list[m.TaskRef]:
        """The attempts whose results wait for an acknowledgement (for ``Register.finished``)."""
        ...

    async def close(self) -> None: ...

    # running-task records: what was running when the worker died (see ``--recover``)

    def running_started(self, refs: list[m.TaskRef]) -> None:
        """Record that these attempts are running (in order, without blocking; written at once,
        on disk by the next checkpoint)."""

    def running_finished(self, refs: list[m.TaskRef]) -> None:
        """Forget the records of these attempts (finished, handed back or stopped on purpose)."""

    async def take_interrupted(self) -> list[RunningRecord]:
        """Records an earlier run left behind (it died while they ran); they are then forgotten."""


class MemoryResultStore:
    def __init__(self) -> None:
        self._pending: dict[tuple[str, int], m.TaskResult] = {}

    def add(self, result: m.TaskResult) -> asyncio.Future[None]:
        self._pending[(result.task_id, result.attempt)] = result
        return _done()

    def ack(self, refs: list[m.TaskRef]) -> None:
        for r in refs:
            self._pending.pop((r.task_id, r.attempt), None)

    def settled(self, results: list[m.TaskResult]) -> asyncio.Future[None]:
        return _done()  # in memory only the unacknowledged are kept: nothing to record

    async def unacked(self) -> list[m.TaskResult]:
        return list(self._pending.values())

    def unacked_refs(self) -> list[m.TaskRef]:
        return [m.TaskRef(task_id, attempt) for task_id, attempt in self._pending]

    async def close(self) -> None:
        return None

    # in memory nothing survives a crash, so there is nothing to record
    def running_started(self, refs: list[m.TaskRef]) -> None:
        return None

    def running_finished(self, refs: list[m.TaskRef]) -> None:
        return None

    async def take_interrupted(self) -> list[RunningRecord]:
        return []


def _done() -> asyncio.Future[None]:
    """A future already complete: in memory a write is durable as soon as it is made."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    done.set_result(None)
    return done
