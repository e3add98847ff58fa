"""The pending tasks in dispatch order. Pure: no I/O, no clock.

One priority heap per requirement key (see :mod:`.placement`), ordered by (-priority, submission
sequence): higher priority first, FIFO within a priority. Dispatch takes the best head among keys
that still have an eligible worker with a free slot, so a task nobody can run never blocks tasks
others can. A task waiting out its retry backoff waits apart until its ``not_before``. Entries
leave lazily: a task cancelled while queued is dropped when it reaches a head.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Mapping

from .entities import Task
from .placement import ReqKey


class Queues:
    """The queued tasks of one state machine (gang tasks wait in :class:`~.gang.Gangs` instead);
    ``tasks`` is the state's map of the tasks in memory, read to skip those no longer pending."""

    def __init__(self, tasks: Mapping[str, Task]) -> None:
        self.tasks = tasks
        self.heaps: dict[ReqKey, list[tuple[int, int, str]]] = defaultdict(list)
        self.delayed: list[tuple[float, str]] = []  # (not_before, task id), soonest first

    def waiting(self) -> bool:
        """Whether any heap may hold a pending task."""
        return bool(self.heaps)

    def push(self, t: Task) -> None:
        heapq.heappush(self.heaps[t.key], (-t.spec.priority, t.seq, t.task_id))

    def delay(self, t: Task) -> None:
        """``t`` waits until its ``not_before`` (:meth:`due` hands it back then)."""
        heapq.heappush(self.delayed, (t.not_before, t.task_id))

    def due(self, now: float) -> list[Task]:
        """The delayed tasks whose backoff has passed by ``now``, their ``not_before`` cleared:
        the caller queues them."""
        out: list[Task] = []
        while self.delayed and self.delayed[0][0] <= now:
            _, task_id = heapq.heappop(self.delayed)
            t = self.tasks.get(task_id)  # gone: cancelled while it waited, and retired since
            if t is not None and t.state == "pending" and t.not_before:
                t.not_before = 0.0
                out.append(t)
        return out

    def best_head(self, blocked: set[ReqKey]) -> tuple[ReqKey, Task] | None:
        """The first task in dispatch order among the heads of keys not in ``blocked``."""
        best: tuple[tuple[int, int], ReqKey, Task] | None = None
        for key in list(self.heaps):
            if key in blocked:
                continue
            q = self.heaps[key]
            while q and ((queued := self.tasks.get(q[0][2])) is None or queued.state != "pending"):
                heapq.heappop(q)  # cancelled while queued (and maybe retired since)
            if not q:
                del self.heaps[key]
                continue
            order = (q[0][0], q[0][1])
            if best is None or order < best[0]:
                best = (order, key, self.tasks[q[0][2]])
        return None if best is None else (best[1], best[2])

    def batch_group(self, key: ReqKey, head: Task, now: float, batch_max: int, batch_wait_s: float) -> list[Task]:
        """``head`` plus the pending tasks that can share its model load (at most ``batch_max``);
        empty while a lone benchmark task is still within its batching wait."""
        if head.batch_key is None or batch_max <= 1:
            return [head]
        queued = (self.tasks.get(e[2]) for e in self.heaps.get(key, []) if e[2] != head.task_id)
        mates = sorted((t for t in queued if t is not None and t.state == "pending" and t.batch_key == head.batch_key),
                       key=lambda t: (-t.spec.priority, t.seq))
        group = [head, *mates[: batch_max - 1]]
        if len(group) < batch_max and now - head.submitted_at < batch_wait_s:
            return []
        return group
