"""Running attempts' output, in memory (docs/protocol.md, "Task output").

Workers send what their running attempts write in ``output`` messages; :meth:`TaskLogs.receive`
checks each chunk (only the worker the task's current attempt is assigned to may send it; of a
multi-node task, the node of rank 0; :func:`verdict`) and keeps it in the attempt's bounded
:class:`~..tasks.log.TaskLog`. Nothing of it is written to the store: when the attempt ends its
result carries the kept output (``output["log"]``), stored with the result, and
:meth:`TaskLogs.end` drops the copy here (``Runtime.execute``, once the outcome is durable).
Readers waiting for more (``GET /api/v1/tasks/{id}/logs?follow=1``) are woken by both.
Running attempts' ended tests (``reports`` messages) are kept alike, in :class:`TestReports`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import msgspec

from ..protocol import messages as m
from ..tasks.log import TaskLog
from ..tasks.states import ACTIVE
from .core.commands import Command, Refused
from .core.entities import Task
from .core.identity import held

log = logging.getLogger(__name__)


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


class _Watched:
    """Readers waiting for a task's kept data to grow or the task to end."""

    def __init__(self) -> None:
        self._waiters: defaultdict[str, list[asyncio.Future[None]]] = defaultdict(list)

    async def changed(self, task_id: str, timeout: float) -> None:
        """Return when what is kept of ``task_id`` grows or it ends, or after ``timeout`` seconds."""
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


class TaskLogs(_Watched):
    """The kept output of running attempts by task id, and the readers waiting for more."""

    def __init__(self) -> None:
        super().__init__()
        self._logs: dict[str, tuple[int, TaskLog]] = {}

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


REPORTS_KEPT_BYTES = 4 * 1024 * 1024  # of one attempt's streamed tests (the worker's own bound); the rest come with its result
REPORTS_TOTAL_BYTES = 256 * 1024 * 1024  # of all attempts' together; past it tests are dropped (their results bring them)


class KeptReports:
    """One attempt's tests as they ended there: each entry JSON-encoded, as it is served."""

    __slots__ = ("attempt", "bytes", "full", "tests", "tree")

    def __init__(self, attempt: int, tree: str) -> None:
        self.attempt, self.tree = attempt, tree
        self.tests: list[msgspec.Raw] = []
        self.bytes = 0
        self.full = False  # tests of it were dropped for the total bound (logged once)


class TestReports(_Watched):
    """Running attempts' tests as they end (``reports`` messages; docs/protocol.md, "Test
    reports"), kept as output is (:func:`verdict`: from the worker the attempt is assigned to)
    until the task's outcome is durable (:meth:`end`): then its result carries every test.
    ``GET /api/v1/tasks/{id}/reports`` serves them. Only a ``test`` task that a pytest session
    serves (a bundle and ``config.session``) streams them; at most :data:`REPORTS_KEPT_BYTES` of
    an attempt and ``total_bytes`` of all are kept (past it tests are dropped, counted in
    ``dropped`` and logged): the rest reach a reader with the result."""

    __test__ = False  # not a pytest test class

    def __init__(self, total_bytes: int = REPORTS_TOTAL_BYTES) -> None:
        super().__init__()
        self._kept: dict[str, KeptReports] = {}
        self.total_bytes = total_bytes
        self.bytes = 0  # kept of all attempts
        self.dropped = 0  # tests not kept for the total bound

    def receive(self, tasks: dict[str, Task], worker_id: str, msg: m.TaskReports) -> list[Command]:
        """Keep the tests ``worker_id`` may send; a ``Refused`` for each other chunk."""
        cmds: list[Command] = []
        for c in msg.chunks:
            t = tasks.get(c.task.task_id)
            what = verdict(t, worker_id, c.task.attempt)
            if what == "keep" and t is not None and not session_served(t):
                what = f"a {t.type} task that no pytest session serves streams no test reports"
            if what == "keep":
                self.put(c.task.task_id, c.task.attempt, c.tree, c.first, c.tests)
            elif what is not None:
                cmds.append(Refused(worker_id, "reports", c.task, what))
        return cmds

    def put(self, task_id: str, attempt: int, tree: str, first: int, tests: list[dict[str, Any]]) -> None:
        kept = self._kept.get(task_id)
        if kept is None or kept.attempt < attempt:  # a newer attempt starts its own
            self.bytes -= kept.bytes if kept is not None else 0
            kept = self._kept[task_id] = KeptReports(attempt, tree)
        elif kept.attempt > attempt:
            return
        if first > len(kept.tests):  # after a gap (tests past a bound): the result brings them
            return
        grew, start = False, len(kept.tests) - first
        for n, test in enumerate(tests[start:]):  # those kept already (a re-send after a reconnect) skipped
            raw = _encode(test)
            if kept.bytes + len(raw) > REPORTS_KEPT_BYTES:
                break
            if self.bytes + len(raw) > self.total_bytes:
                self.dropped += len(tests) - start - n
                if not kept.full:
                    kept.full = True
                    log.warning("task %s attempt %d: live test reports dropped: all attempts' kept reports would "
                                "exceed %d bytes (%d tests dropped so far); its result brings them", task_id, attempt,
                                self.total_bytes, self.dropped)
                break
            kept.tests.append(msgspec.Raw(raw))
            kept.bytes += len(raw)
            self.bytes += len(raw)
            grew = True
        if grew:
            self._wake(task_id)

    def get(self, task_id: str) -> KeptReports | None:
        return self._kept.get(task_id)

    def end(self, task_ids: Iterable[str]) -> None:
        """These tasks ended and their outcomes are durable: their results hold every test now."""
        for tid in task_ids:
            kept = self._kept.pop(tid, None)
            self.bytes -= kept.bytes if kept is not None else 0
            if kept is not None or tid in self._waiters:
                self._wake(tid)

    def __len__(self) -> int:
        return len(self._kept)


def session_served(t: Task) -> bool:
    """Whether a pytest session serves ``t`` (a ``test`` task with a bundle and ``config.session``:
    ``worker/executors/test_session.py``'s ``session_key``), the only tasks that stream test reports."""
    cfg = t.spec_dict.get("config")
    return (t.type == "test" and t.spec.bundle is not None and isinstance(cfg, dict)
            and isinstance(cfg.get("session"), str))


_encode = msgspec.json.Encoder().encode
