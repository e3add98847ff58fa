"""Results the worker has produced and the coordinator has not yet acknowledged.

``add`` returns once the result is durable (with ``--db-path``: in the worker's journal, then
checkpointed into its DuckDB file); ``unacked`` lists what must be (re)sent after a reconnect;
``ack`` forgets what the coordinator has on disk. Without a database path the outbox lives in
memory: it survives reconnects, not a worker crash.
"""

from __future__ import annotations

from typing import Protocol

from ..protocol import messages as m


class Outbox(Protocol):
    async def add(self, result: m.TaskResult) -> None: ...

    def ack(self, refs: list[m.TaskRef]) -> None: ...

    async def unacked(self) -> list[m.TaskResult]: ...

    async def close(self) -> None: ...


class MemoryOutbox:
    def __init__(self) -> None:
        self._pending: dict[tuple[str, int], m.TaskResult] = {}

    async def add(self, result: m.TaskResult) -> None:
        self._pending[(result.task_id, result.attempt)] = result

    def ack(self, refs: list[m.TaskRef]) -> None:
        for r in refs:
            self._pending.pop((r.task_id, r.attempt), None)

    async def unacked(self) -> list[m.TaskResult]:
        return list(self._pending.values())

    async def close(self) -> None:
        return None
