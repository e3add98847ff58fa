"""Take-back: tasks sent ahead to a worker that is stuck behind a long task go to an idle one.
Pure: no I/O, no clock.

A pipelined task may be sent ahead of a worker's slots (:mod:`.pipeline`). When every slot of
that worker is then held by a task that ran past its ``started`` delay, or by one that must run
alone (``WorkerView.stuck``), the tasks waiting there may wait long while other workers idle. The
state machine then asks the stuck worker for them (``TakeBack``), oldest first, one for each free
slot of an eligible idle worker not already promised one. A task moves only when the worker
answers that it had not started it (``TakenBack.dropped``); one it had started stays
(``TakenBack.kept``), and its result counts.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Protocol

from ...protocol import messages as m
from ...tasks.states import ACTIVE
from .commands import Command, Refused, Send
from .entities import Task, Worker
from .placement import WorkerView, unmet


class Host(Protocol):
    """What :class:`TakeBacks` needs of the state machine that owns it (``CoordinatorState``)."""

    tasks: dict[str, Task]
    workers: dict[str, Worker]

    def placeable(self) -> list[WorkerView]: ...
    def requeue(self, t: Task, cause: str, now: float, *, count: bool) -> list[Command]: ...


class TakeBacks:
    """The take-backs of one state machine. ``asked``: task id -> (worker holding it, attempt,
    idle worker it is meant for), at most one per task, each counting against its idle worker's
    slots until answered. ``ahead``: workers given tasks ahead of their slots (maybe holding some
    still)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.asked: dict[str, tuple[str, int, str]] = {}
        self.ahead: set[str] = set()

    def watching(self) -> bool:
        """Whether a dispatch round must look for tasks to take back (or answers to settle)."""
        return bool(self.asked or self.ahead)

    def ask(self) -> list[Command]:
        """Ask workers stuck behind a long or exclusive task (``WorkerView.stuck``) for the tasks
        they hold ahead of their slots, oldest first (priority, then FIFO), one for each free slot
        of an eligible worker not already promised one. Sends ``TakeBack``; the task moves only
        when the worker answers that it had not started it (:meth:`answered`)."""
        tasks, workers = self.host.tasks, self.host.workers
        for tid, (holder, attempt, _) in list(self.asked.items()):
            t = tasks.get(tid)
            if t is None or t.state != "assigned" or t.attempt != attempt or t.worker_id != holder:
                del self.asked[tid]  # settled otherwise (result, cancel, loss): no longer a claim
        waiting: list[Task] = []
        for wid in list(self.ahead):
            w = workers.get(wid)
            if w is None or len(w.view.running) <= w.view.max_concurrent:
                self.ahead.discard(wid)  # holds nothing ahead any more
            elif w.connected and w.view.stuck:
                held = sorted((t for tid in w.view.running if tid not in w.view.started
                               and (t := tasks.get(tid)) is not None and t.state == "assigned" and t.pipelined),
                              key=lambda t: (t.history[-1]["at"], t.seq))  # in the order the worker got them
                # the oldest fill the slots no started or exclusive task holds: likely running already
                busy = max(0, w.view.max_concurrent - len(w.view.started) - len(w.view.exclusive))
                waiting += [t for t in held[busy:] if t.task_id not in self.asked]
        if not waiting:
            return []
        placeable = self.host.placeable()  # someone waits behind a long task: find the idle workers
        idle = {v.worker_id: v.free_slots for v in placeable if v.free_slots > 0}
        for _, _, to in self.asked.values():
            if to in idle:
                idle[to] -= 1
        if not any(n > 0 for n in idle.values()):
            return []
        views = {v.worker_id: v for v in placeable}
        asks: dict[str, list[m.TaskRef]] = defaultdict(list)
        for t in sorted(waiting, key=lambda t: (-t.spec.priority, t.seq)):
            dest = next((i for i, n in idle.items() if n > 0 and i != t.worker_id and not unmet(t.key, views[i])), None)
            if dest is None:
                continue
            assert t.worker_id is not None
            idle[dest] -= 1
            self.asked[t.task_id] = (t.worker_id, t.attempt, dest)
            asks[t.worker_id].append(t.ref())
        return [Send(wid, m.TakeBack(refs)) for wid, refs in asks.items()]

    def answered(self, worker_id: str, msg: m.TakenBack, now: float) -> list[Command]:
        """The answer to a ``TakeBack``. A ``dropped`` attempt never started and never will on
        ``worker_id``: it is requeued (at no retry cost). A ``kept`` one had started: it stays.
        A drop of an attempt nobody asked this worker for is refused and changes nothing."""
        cmds: list[Command] = []
        for ref in msg.dropped:
            claim = self.asked.get(ref.task_id)
            if claim is None or claim[:2] != (worker_id, ref.attempt):
                cmds.append(Refused(worker_id, "taken_back", ref, "no take-back of this attempt was asked of this worker"))
                continue
            del self.asked[ref.task_id]
            t = self.host.tasks.get(ref.task_id)  # (a claim outlives a task that finished and left memory)
            if t is not None and t.state in ACTIVE and t.attempt == ref.attempt and t.worker_id == worker_id:
                cmds += self.host.requeue(t, f"taken back from {worker_id} before it started (waiting there while "
                                             f"{claim[2]} was idle)", now, count=False)
        for ref in msg.kept:
            claim = self.asked.get(ref.task_id)
            if claim is not None and claim[:2] == (worker_id, ref.attempt):
                del self.asked[ref.task_id]
        return cmds

    def forget(self, worker_id: str) -> None:
        """The session ``worker_id`` was asked on is gone: its answers never come."""
        for tid in [tid for tid, (holder, _, _) in self.asked.items() if holder == worker_id]:
            del self.asked[tid]
