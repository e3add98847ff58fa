"""Recovery: the state machine rebuilt after a restart, a worker's tasks reconciled when it
registers again, and the tasks of a worker lost. Pure: no I/O, no clock.

After a restart the coordinator knows its active tasks from the store's snapshot, not from its
workers: pending tasks are queued again; tasks that were assigned or running wait for their worker
to register within the grace period and announce them (``Register.running``). A registering worker
(after a restart on either side, or a lost connection) keeps the tasks it still runs or has
finished, and the others are requeued, lost or cancelled (:meth:`Recovery.reconcile`). A worker
silent past its TTL is disconnected; one that does not come back within the grace period is lost,
and its tasks with it (:meth:`Recovery.lost`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Protocol

from ...protocol import messages as m
from ...tasks.states import ACTIVE, is_terminal
from .commands import CloseWorker, Command, Save, Send
from .entities import Task, Worker
from .gang import Gangs
from .placement import WorkerView
from .policy import Policy
from .quota import KeyQuota, payload_size
from .rows import FORGOTTEN, Snapshot, TaskRow


class Host(Protocol):
    """What :class:`Recovery` needs of the state machine that owns it (``CoordinatorState``)."""

    policy: Policy
    tasks: dict[str, Task]
    workers: dict[str, Worker]
    counts: dict[str, int]
    quota: KeyQuota
    gangs: Gangs
    seq: int

    def schedule(self, t: Task, now: float) -> None: ...
    def disconnect(self, worker_id: str, session_id: str, now: float) -> list[Command]: ...
    def drop_worker(self, worker_id: str) -> None: ...
    def load(self, rows: Iterable[TaskRow]) -> None: ...
    def free_slot(self, t: Task) -> None: ...
    def requeue(self, t: Task, cause: str, now: float, *, count: bool) -> list[Command]: ...
    def lose(self, t: Task, cause: str, now: float) -> list[Command]: ...


class Recovery:
    """Restore and reconcile for one state machine. ``unsent``: attempts restored as assigned
    that the worker may never have been sent (the coordinator stopped right after dispatching)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.unsent: set[tuple[str, int]] = set()

    def restore(self, snap: Snapshot, now: float) -> None:
        """Rebuild from a store snapshot (see ``CoordinatorState.restore``)."""
        h = self.host
        counted: dict[str, int] = defaultdict(int)
        finished: list[TaskRow] = []
        for row in sorted(snap.tasks, key=lambda r: (r.seq, r.submitted_at)):
            counted[row.state] += 1
            if is_terminal(row.state):
                finished.append(row)
                continue
            t = Task.from_row(row)
            h.seq = t.seq = max(h.seq + 1, row.seq)
            h.tasks[t.task_id] = t
            t.payload_bytes = payload_size(t.spec_dict)
            h.quota.add(t.submitted_by, t.payload_bytes)
            if t.state == "assigned":
                self.unsent.add((t.task_id, t.attempt))
            if t.gang is not None:
                h.gangs.restore(t, now)
            if t.state == "pending":
                h.schedule(t, now)
        h.seq = max(h.seq, snap.max_seq)
        h.counts = defaultdict(int, snap.task_counts or counted)
        self.note_baselines(finished)
        h.load(finished[-h.policy.finished_cache:] if h.policy.finished_cache else [])
        for wr in snap.workers:
            if wr.state == FORGOTTEN:  # a store that kept the deleting record
                continue
            view = WorkerView(wr.worker_id, frozenset(wr.capabilities), frozenset(wr.tags),
                              float(wr.hardware.get("memory_gb", 0.0)), 0)
            h.workers[wr.worker_id] = Worker(view=view, name=wr.name, hardware=wr.hardware, session_id=None,
                                             first_seen=wr.first_seen, last_seen=wr.last_seen,
                                             connected=False, disconnected_at=now, key_id=wr.key_id or "")

    def note_baselines(self, rows: Iterable[TaskRow]) -> None:
        """The succeeded single-node training runs among ``rows`` are scaling baselines again;
        other rows are ignored."""
        for row in rows:
            summary = (row.outcome or {}).get("training") if row.state == "succeeded" else None
            if isinstance(summary, dict) and {"model", "global_batch", "precision", "nnodes",
                                              "global_samples_per_s"} <= summary.keys():
                self.host.gangs.baselines.record(row.task_id, row.attempt, summary, row.updated_at)

    def reconcile(self, w: Worker, announced: dict[str, int], finished: dict[str, int], now: float,
                  abandoned: set[tuple[str, int]]) -> list[Command]:
        """Keep tasks the worker still runs or has finished (their results follow the
        registration); requeue ours it no longer has; cancel the rest."""
        h = self.host
        cmds: list[Command] = []
        for t in h.tasks.values():
            if t.worker_id == w.worker_id and t.state in ACTIVE and t.gang is None:
                if announced.get(t.task_id) == t.attempt:
                    w.view.hold(t.slot or t.task_id, exclusive=not t.pipelined, started=t.state == "running")
                elif finished.get(t.task_id) == t.attempt:
                    h.free_slot(t)  # done there; the re-sent result makes the outcome
                elif (t.task_id, t.attempt) in abandoned:
                    # sent provisionally; the session ended before the confirm, so the worker
                    # stopped it without reporting anything: it costs no retry
                    cmds += h.requeue(t, "assignment abandoned: its session ended before it was confirmed",
                                      now, count=False)
                elif (t.task_id, t.attempt) in self.unsent and t.state == "assigned":
                    # dispatched just before a coordinator crash and never heard of: the assign
                    # message may never have left, so the attempt costs no retry
                    cmds += h.requeue(t, "assignment lost in a coordinator restart", now, count=False)
                else:
                    cmds += h.lose(t, "worker restarted without this task", now)
                self.unsent.discard((t.task_id, t.attempt))
        for t in list(h.gangs.active.values()):
            assert t.gang is not None
            if (t.task_id, t.attempt) in abandoned and w.worker_id in t.gang.members and w.worker_id not in t.gang.held:
                # the member stopped it unconfirmed: end the attempt now (the other ranks wait on
                # it), at no retry cost. A member whose result is held here finished it: its
                # result, sent before the confirm, stands (we still hold it, so we did not crash)
                cmds += h.gangs.end(t, now, status="error", culprit=w.worker_id, retry=True, count=False,
                                    cause=f"node assignment abandoned by {w.worker_id}: its session ended "
                                          "before it was confirmed")
                continue
            h.gangs.rejoined(t, w, announced, now)
        for task_id, attempt in announced.items():
            known = h.tasks.get(task_id)
            mine = known is not None and (w.worker_id in known.gang.members if known.gang is not None
                                          else known.worker_id == w.worker_id)
            if known is None or known.attempt != attempt or not mine or known.state not in ACTIVE:
                cmds.append(Send(w.worker_id, m.Cancel(m.TaskRef(task_id, attempt), "superseded or unknown attempt")))
        return cmds

    def lost(self, now: float) -> list[Command]:
        """Disconnect workers silent for longer than their own TTL (``Worker.liveness``); lose the
        tasks of those disconnected for longer than the grace; forget those gone for longer than
        the retention."""
        h = self.host
        cmds: list[Command] = []
        for w in list(h.workers.values()):
            if w.connected and now - w.last_seen > w.liveness.ttl_s:
                cmds.append(CloseWorker(w.worker_id, w.session_id or "", f"nothing heard for {now - w.last_seen:.1f}s "
                                        f"(its TTL is {w.liveness.ttl_s:g}s)"))
                cmds += h.disconnect(w.worker_id, w.session_id or "", now)
            if not w.connected and w.disconnected_at is not None and now - w.disconnected_at >= h.policy.worker_grace_s:
                w.disconnected_at = None
                cause = f"worker {w.worker_id} lost (no reconnect within {h.policy.worker_grace_s:g}s)"
                for t in [t for t in h.tasks.values() if t.worker_id == w.worker_id and t.state in ACTIVE and t.gang is None]:
                    cmds += self._lose_held(t, cause, now)
                cmds += h.gangs.member_lost(w.worker_id, cause, now)
                w.view.release_all()
        return cmds + self._forget_gone(now)

    def _lose_held(self, t: Task, cause: str, now: float) -> list[Command]:
        """A lost worker's task: one that only waited ahead of its slots (sent ahead, never reported
        started) is requeued once without using a retry (a crash with a deep window would otherwise
        end dozens of innocent tasks; a task that itself kills workers uses its retries the next
        time); any other is lost as usual (``lose``)."""
        if t.sent_ahead and t.state == "assigned" and not t.spared:
            t.spared = True
            return self.host.requeue(t, f"{cause}; it was waiting ahead of the worker's slots: requeued without a "
                                        "retry", now, count=False)
        return self.host.lose(t, cause, now)

    def _forget_gone(self, now: float) -> list[Command]:
        """Forget workers disconnected, past their grace and not heard from for
        ``worker_retention_s`` (0: never): their entry, listing and key binding go; the tasks and
        results they ran stay. A worker some unfinished task still names is kept."""
        h = self.host
        keep = h.policy.worker_retention_s
        gone = [w for w in h.workers.values() if keep and not w.connected and w.disconnected_at is None
                and now - w.last_seen >= keep]
        if not gone:
            return []
        named = {t.worker_id for t in h.tasks.values() if t.state in ACTIVE} | {
            wid for t in h.gangs.active.values() if t.gang is not None for wid in t.gang.members}
        cmds: list[Command] = []
        for w in gone:
            if w.worker_id in named:
                continue
            h.drop_worker(w.worker_id)
            cmds.append(Save(w.row(FORGOTTEN)))
        return cmds
