"""Running attempts' output, in memory (docs/protocol.md, "Task output").

Workers send what their running attempts write in ``output`` messages; :meth:`TaskLogs.receive`
checks each chunk (only the worker the task's current attempt is assigned to may send it; of a
multi-node task, the node of rank 0; :func:`verdict`) and keeps it in the attempt's bounded
:class:`~..tasks.log.TaskLog`. Nothing of it is written to the store: when the attempt ends its
result carries the kept output (``output["log"]``), stored with the result, and
:meth:`TaskLogs.end` drops the copy here (``Runtime.execute``, once the outcome is durable).
Readers waiting for more (``GET /api/v1/tasks/{id}/logs?follow=1``) are woken by both.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable

from ..protocol import messages as m
from ..tasks.log import TaskLog
from ..tasks.states import ACTIVE
from .core.commands import Command, Refused
from .core.entities import Task
from .core.identity import held


def verdict(t: Task | None, worker_id: str, attempt: int) -> str | None:
    """What becomes of ``worker_id``'s output for ``attempt`` of ``t``: ``"keep"`` (the task's
    current, running attempt on this worker; of a gang, its node of rank 0), ``None`` (dropped
    silently: a task no longer in memory, an attempt of this worker's that ended or was superseded,
    a gang node of another rank: a race, not a fault), or why it is refused (an attempt this
    worker was never given)."""
    if t is None:
        return None
    if not held(t.history, worker_id, attempt):
        if attempt == t.attempt and t.state in ACTIVE:
            return f"attempt {attempt} is assigned to another worker"
        return f"attempt {attempt} was never assigned to this worker (the task is at attempt {t.attempt})"
    speaker = t.gang.members[0] if t.gang is not None and t.gang.members else t.worker_id
    return "keep" if attempt == t.attempt and t.state in ACTIVE and worker_id == speaker else None


class TaskLogs:
    """The kept output of running attempts by task id, and the readers waiting for more."""

    def __init__(self) -> None:
        self._logs: dict[str, tuple[int, TaskLog]] = {}
        self._waiters: defaultdict[str, list[asyncio.Future[None]]] = defaultdict(list)

    def receive(self, tasks: dict[str, Task], worker_id: str, msg: m.TaskOutput) -> list[Command]:
        """Keep the chunks ``worker_id`` may send; a ``Refused`` for each other."""
        cmds: list[Command] = []
        for c in msg.chunks:
            what = verdict(tasks.get(c.task.task_id), worker_id, c.task.attempt)
            if what == "keep":
                self.put(c.task.task_id, c.task.attempt, c.offset, c.data)
            elif what is not None:
                cmds.append(Refused(worker_id, "output", c.task, what))
        return cmds

    def put(self, task_id: str, attempt: int, offset: int, data: bytes) -> None:
        held = self._logs.get(task_id)
        if held is None or held[0] < attempt:  # a newer attempt starts its own log
            held = self._logs[task_id] = (attempt, TaskLog())
        elif held[0] > attempt:
            return
        held[1].put(offset, data)
        self._wake(task_id)

    def get(self, task_id: str) -> tuple[int, TaskLog] | None:
        """(attempt, its log) of ``task_id`` while it is kept here."""
        return self._logs.get(task_id)

    def end(self, task_ids: Iterable[str]) -> None:
        """These tasks ended and their outcomes are durable: their results hold their output now."""
        for tid in task_ids:
            if self._logs.pop(tid, None) is not None or tid in self._waiters:
                self._wake(tid)

    def __len__(self) -> int:
        return len(self._logs)

    async def changed(self, task_id: str, timeout: float) -> None:
        """Return when ``task_id``'s output grows or it ends, or after ``timeout`` seconds."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[task_id].append(fut)
        try:
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError:
            pass
        finally:
            waiting = self._waiters.get(task_id)
            if waiting is not None and fut in waiting:
                waiting.remove(fut)
                if not waiting:
                    del self._waiters[task_id]

    def _wake(self, task_id: str) -> None:
        for fut in self._waiters.pop(task_id, ()):
            if not fut.done():
                fut.set_result(None)
