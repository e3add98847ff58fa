"""The coordinator's scheduling core: events in, commands out. Pure: no awaits, no clock, no I/O.

Every public method takes ``now`` and returns a list of commands for the transport to execute:
:class:`Save` records first (the transport makes them durable), then :class:`Send` /
:class:`CloseWorker` / :class:`Notify`. The transport executes sends only after the saves of the
same call are on disk, so nothing a peer is told can be lost by a crash.

Pending tasks wait in :mod:`.queues`, one priority heap per requirement key; dispatch takes the
best head among keys that still have an eligible worker with a free slot.

Gang tasks (multi-node training) wait in their own small list and compete with the queue heads
in the same order; :mod:`.gang` says how they are placed and ended.

Memory holds the active work, not the history. ``tasks`` holds every task that is pending,
assigned or running, the finished ones whose terminal record is not yet durable, and at most
``Policy.finished_cache`` finished ones whose record is (the transport calls :meth:`retire` once a
terminal record is on disk; the oldest retired task then leaves memory). Everything else lives in
the store: before an event that names a task no longer in memory (a worker's report on it, a
resubmission of its id, a cancel, a read), the transport reads its row from the store and hands it
to :meth:`load`, so the event is answered exactly as if the task had never left. ``counts``
counts every task, in memory or not.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict, defaultdict
from collections.abc import Iterable
from typing import Any

from ...errors import Conflict, NotFound, ValidationError
from ...protocol import messages as m
from ...tasks import spec as specs
from ...tasks.states import ACTIVE, check_transition, is_terminal
from .commands import CloseWorker, Command, Notify, Refused, Save, Send
from .entities import Task, Worker
from .gang import Gangs
from .identity import check_owner, held
from .pipeline import Pace
from .placement import (
    PlacementIndex,
    ReqKey,
    WorkerView,
    gang_pending_reason,
    pending_reason,
    pick_ahead,
    pick_worker,
    registered_view,
    unmet,
    unrunnable,
)
from .policy import Policy
from .queues import Queues
from .quota import KeyQuota, payload_size
from .recovery import Recovery
from .rows import ResultRow, Snapshot, TaskRow
from .takeback import TakeBacks


class CoordinatorState:
    """The scheduling state machine (module docstring). Its parts, each owning its own data and
    working through the primitives below: ``queues``, ``gangs``, ``take_backs``, ``recovery``."""

    def __init__(self, policy: Policy | None = None) -> None:
        self.policy = policy or Policy()
        self.tasks: dict[str, Task] = {}  # active, finished but not yet durable, and the finished cache
        self._finished: OrderedDict[str, None] = OrderedDict()  # the finished cache, oldest first
        self.workers: dict[str, Worker] = {}
        self._batches: dict[str, set[str]] = {}  # batch slot -> tasks still holding it
        self.seq = 0  # the submission sequence number last given
        self.counts: dict[str, int] = defaultdict(int)  # tasks per state, kept by transition
        self._index = PlacementIndex()  # the connected workers, ordered for placement (told of every gain)
        self._worker_ids: list[str] = []  # every key of self.workers, sorted (worker_ids)
        self.queues = Queues(self.tasks)  # pending tasks in dispatch order, and those in retry backoff
        self.quota = KeyQuota(self.policy.max_queued_per_key, self.policy.max_payload_bytes_per_key)
        self.gangs = Gangs(self)  # gang tasks pending and placed, their ports, the scaling baselines
        self.take_backs = TakeBacks(self)  # tasks asked back from workers stuck behind a long one
        self.recovery = Recovery(self)  # restore after a restart, reconcile a worker that registers

    # ----------------------------------------------------------------- tasks

    def submit(self, items: list[specs.TaskSpec], now: float,
               submitted_by: str | None = None) -> tuple[list[dict[str, Any]], list[Command]]:
        """Accept specs (ids assigned where missing). Raises Conflict, before changing anything,
        if an id already exists with a different body, and RateLimited when the new ones would
        take ``submitted_by`` past its quota (``quota.py``); an identical resubmission is a no-op."""
        prepared = [specs.with_id(s) for s in items]
        digested = [specs.spec_digest_and_size(s) for s in prepared]  # (digest, its JSON's length)
        for s, (d, _) in zip(prepared, digested, strict=True):
            old = self.tasks.get(s.task_id or "")
            if old is not None and old.digest != d:
                raise Conflict(f"task {s.task_id} already exists with a different body")
        errors = unrunnable(prepared, self.tasks, self._index.views(), strict=self.policy.strict)
        if errors:
            raise ValidationError(errors)
        dicts = {s.task_id: specs.spec_to_dict(s) for s in prepared if s.task_id not in self.tasks}
        sizes = {s.task_id: payload_size(dicts[s.task_id], n) for s, (_, n) in zip(prepared, digested, strict=True)
                 if s.task_id in dicts}
        self.quota.check(submitted_by, sizes.values())
        accepted: list[dict[str, Any]] = []
        cmds: list[Command] = []
        for s, (d, _) in zip(prepared, digested, strict=True):
            assert s.task_id is not None
            if s.task_id in self.tasks:
                accepted.append({"task_id": s.task_id, "created": False, "state": self.tasks[s.task_id].state})
                continue
            self.seq += 1
            t = Task(spec=s, spec_dict=dicts[s.task_id], task_id=s.task_id, type=specs.spec_type(s),
                     digest=d, seq=self.seq, submitted_at=now, updated_at=now, submitted_by=submitted_by,
                     payload_bytes=sizes[s.task_id])
            self.quota.add(submitted_by, t.payload_bytes)
            t.history.append({"at": now, "from": None, "to": "pending", "cause": "submitted", "attempt": 0})
            self.tasks[t.task_id] = t
            self.counts["pending"] += 1
            self.enqueue(t, now)
            cmds.append(Save(t.row()))
            accepted.append({"task_id": t.task_id, "created": True, "state": "pending"})
        return accepted, cmds + self.dispatch(now)

    def cancel(self, task_id: str, now: float, cause: str = "cancelled by request") -> list[Command]:
        t = self.get(task_id)
        if is_terminal(t.state):
            return []
        if t.gang is not None and t.state in ACTIVE:
            return self.gangs.end(t, now, status="cancelled", cause=cause, culprit=None, retry=False) + self.dispatch(now)
        self.gangs.pending.pop(t.task_id, None)
        cmds: list[Command] = []
        if t.state in ACTIVE and t.worker_id is not None:
            cmds.append(Send(t.worker_id, m.Cancel(t.ref(), cause)))
        self.transition(t, "cancelled", cause, now, outcome={"status": "cancelled", "error": cause})
        return [Save(t.row()), *cmds, Notify((t.task_id,))] + self.dispatch(now)

    def get(self, task_id: str) -> Task:
        """The task in memory; NotFound otherwise (it may be in the store: see :meth:`load`)."""
        t = self.tasks.get(task_id)
        if t is None:
            raise NotFound(f"no task {task_id!r}")
        return t

    def missing(self, task_ids: Iterable[str]) -> list[str]:
        """Those of ``task_ids`` not in memory (once each, in order): the ones to read from the
        store and :meth:`load` before an event that names them."""
        return [tid for tid in dict.fromkeys(task_ids) if tid not in self.tasks]

    def load(self, rows: Iterable[TaskRow]) -> None:
        """Finished tasks read back from the store join the finished cache, newest. A row of a
        task already in memory, or of an active one, changes nothing: memory is the authority for
        those (every active task is in memory)."""
        n = 0
        for row in rows:
            if row.task_id in self.tasks or not is_terminal(row.state):
                continue
            self.tasks[row.task_id] = Task.from_row(row)
            self._finished[row.task_id] = None
            n += 1
        self._trim(keep=n)

    def retire(self, task_ids: Iterable[str]) -> None:
        """The terminal records of these tasks are durable: they join the finished cache, and the
        oldest finished tasks beyond ``Policy.finished_cache`` leave memory. Ids of tasks not in
        memory or not finished are ignored."""
        for tid in task_ids:
            t = self.tasks.get(tid)
            if t is not None and is_terminal(t.state):
                self._finished[tid] = None
                self._finished.move_to_end(tid)
                self.recovery.unsent.discard((tid, t.attempt))
        self._trim()

    def _trim(self, keep: int = 0) -> None:
        """Evict the oldest cached finished tasks down to ``finished_cache`` (or ``keep``, so the
        ``keep`` just loaded stay for the event that needs them)."""
        bound = max(self.policy.finished_cache, keep)
        while len(self._finished) > bound:
            tid, _ = self._finished.popitem(last=False)
            del self.tasks[tid]

    @property
    def cached_finished(self) -> int:
        """How many finished tasks the cache holds now."""
        return len(self._finished)

    def why_pending(self, t: Task) -> str | None:
        if t.state != "pending":
            return None
        if t.not_before:
            return f"retry backoff until {t.not_before:.3f}"
        connected = [w.view for w in self.workers.values() if w.connected]
        if t.gang is None:
            return pending_reason(t.key, connected)
        reason = gang_pending_reason(t.key, t.gang.nodes, connected)
        if t.gang.protecting:
            reason += (f"; waited past the {self.policy.gang_max_wait_s:g}s gang bound, so its eligible workers "
                       "take no new work of lower or equal priority until it fits")
        return reason

    def unschedulable(self, t: Task) -> bool:
        """True while ``t`` is pending and fewer connected workers meet its requirements than it
        needs (one; a gang's ``nodes``): no free slot can start it until a fitting worker joins."""
        if t.state != "pending":
            return False
        need = 1 if t.gang is None else t.gang.nodes
        return sum(1 for w in self.workers.values() if w.connected and not unmet(t.key, w.view)) < need

    def worker_ids(self) -> list[str]:
        """Every known worker id, sorted (the order ``GET /api/v1/workers`` pages in); kept as ids
        are added rather than sorted per request. The caller must not change the list."""
        if len(self._worker_ids) != len(self.workers):  # ids added around register (restore): re-sort once
            self._worker_ids = sorted(self.workers)
        return self._worker_ids

    def gang_view(self, t: Task) -> dict[str, Any] | None:
        """A gang task's nodes and, while assigned or running, its members by node rank."""
        return None if t.gang is None else t.gang.view()

    # --------------------------------------------------------------- workers

    def register(self, reg: m.Register, session_id: str, now: float, *, key_id: str) -> list[Command]:
        """A session of key ``key_id`` registers ``reg.worker_id``. Raises ``PermissionDenied``,
        before changing anything, when that id is bound to another key (see :mod:`.identity`);
        otherwise binds an unbound id to ``key_id``, replaces an older session of the id and
        reconciles the tasks it announces. Raises ``ValidationError``, also before changing anything,
        for a heartbeat interval the policy refuses (:meth:`Policy.liveness`); the worker's
        contract is then ``self.workers[reg.worker_id].liveness``."""
        w = self.workers.get(reg.worker_id)
        check_owner(reg.worker_id, w.key_id if w is not None else "", key_id)
        liveness = self.policy.liveness(reg.heartbeat_interval_s)
        cmds: list[Command] = []
        if w is not None and w.connected and w.session_id != session_id and w.session_id:
            cmds.append(CloseWorker(w.worker_id, w.session_id, "replaced by a new session"))
        view = registered_view(reg)
        first = w.first_seen if w else now
        if w is None and len(self._worker_ids) == len(self.workers):
            bisect.insort(self._worker_ids, reg.worker_id)  # a new id: O(log n) to find, no re-sort
        w = Worker(view=view, name=reg.name, hardware=reg.hardware, session_id=session_id,
                   first_seen=first, last_seen=now, address=reg.address or reg.name, key_id=key_id,
                   liveness=liveness, pace=Pace(reg.pipeline_depth))
        self.workers[reg.worker_id] = w
        self.take_backs.forget(reg.worker_id)  # asked of an older session: that answer never comes
        cmds += self.recovery.reconcile(w, {r.task_id: r.attempt for r in reg.running},
                                {r.task_id: r.attempt for r in reg.finished}, now,
                                {(r.task_id, r.attempt) for r in reg.abandoned})
        if len(view.running) > view.max_concurrent:  # it still holds tasks sent ahead to its last session
            self.take_backs.ahead.add(reg.worker_id)
        self._index.add(view)
        cmds.append(Save(w.row()))
        return cmds + self.dispatch(now)

    def seen(self, worker_id: str, session_id: str, now: float) -> None:
        """A frame (any message, ping or pong) arrived on this session of the worker: it is alive.
        A frame on a session that was replaced proves nothing about the current one."""
        w = self.workers.get(worker_id)
        if w is not None and w.session_id == session_id:
            w.last_seen = now

    def heartbeat(self, worker_id: str, hb: m.Heartbeat, now: float) -> list[Command]:
        w = self.workers[worker_id]
        w.last_seen = now
        was = w.health
        w.health, w.health_reason = hb.state, hb.reason
        w.view.accepting = hb.state == "ready"
        w.view.available_memory_mb = hb.available_memory_mb
        w.load = {"cpu_percent": hb.cpu_percent, "memory_percent": hb.memory_percent}
        if hb.available_memory_mb is not None:
            w.load["available_memory_mb"] = hb.available_memory_mb
        if hb.gpu_percent is not None:
            w.load["gpu_percent"] = hb.gpu_percent
        if hb.swap_percent is not None:
            w.load["swap_percent"] = hb.swap_percent
        self._index.touch(worker_id)  # accepting again, or offering more memory
        if (was != "ready" and hb.state == "ready") or hb.available_memory_mb is not None or w.view.stuck:
            return self.dispatch(now)  # free slots again, or tasks held ahead it should not start now
        return []

    def disconnect(self, worker_id: str, session_id: str, now: float) -> list[Command]:
        w = self.workers.get(worker_id)
        if w is None or w.session_id != session_id or not w.connected:
            return []
        w.connected, w.disconnected_at = False, now
        self._index.remove(worker_id)
        self.take_backs.forget(worker_id)
        return [Save(w.row())]

    def goodbye(self, worker_id: str, msg: m.Goodbye, now: float) -> list[Command]:
        cmds: list[Command] = []
        for ref in msg.handed_back:
            t = self.tasks.get(ref.task_id)
            if t is not None and t.gang is not None:
                if t.attempt == ref.attempt and t.state in ACTIVE and worker_id in t.gang.members and worker_id not in t.gang.held:
                    cmds += self.gangs.end(t, now, status="error", cause=f"node {t.gang.members.index(worker_id)} "
                                           f"handed back by {worker_id}: {msg.reason}", culprit=worker_id,
                                           retry=True, count=False)
                continue
            if t is not None and t.attempt == ref.attempt and t.state in ACTIVE and t.worker_id == worker_id:
                cmds += self.requeue(t, f"handed back by {worker_id}: {msg.reason}", now, count=False)
        self.workers[worker_id].view.accepting = False
        return cmds + self.dispatch(now)

    def drain_worker(self, worker_id: str, reason: str, deadline_s: float, now: float) -> list[Command]:
        """Ask a connected worker to drain: nothing new is dispatched to it from now on, and it is
        told to finish its tasks within ``deadline_s`` and hand back the rest (its ``goodbye``
        requeues them). NotFound for an unknown worker, Conflict for a disconnected one."""
        w = self.workers.get(worker_id)
        if w is None:
            raise NotFound(f"no worker {worker_id!r}")
        if not w.connected:
            raise Conflict(f"worker {worker_id} is not connected")
        w.view.accepting = False  # until its next heartbeat, which says draining
        w.health, w.health_reason = "draining", reason
        return [Save(w.row()), Send(worker_id, m.Drain(reason, deadline_s))]

    def release_worker(self, worker_id: str, now: float) -> list[Command]:
        """An admin frees ``worker_id`` from its key (its key was revoked or replaced): the next
        key to register the id takes it. NotFound for an unknown worker, Conflict while it is
        connected (its session would keep speaking for the id under the old key)."""
        w = self.workers.get(worker_id)
        if w is None:
            raise NotFound(f"no worker {worker_id!r}")
        if w.connected:
            raise Conflict(f"worker {worker_id} is connected; drain or stop it before releasing its id")
        w.key_id = ""
        return [Save(w.row())]

    # --------------------------------------------------------------- results

    def _refusal(self, t: Task | None, worker_id: str, attempt: int) -> str | None:
        """Why ``worker_id`` may not report on ``attempt`` of ``t`` (None: it was given that
        attempt, current or superseded)."""
        if t is None:
            return "no such task"
        if (attempt == t.attempt and t.worker_id == worker_id) or held(t.history, worker_id, attempt):
            return None
        if attempt == t.attempt and t.state in ACTIVE:
            return f"attempt {attempt} is assigned to another worker"
        return f"attempt {attempt} was never assigned to this worker (the task is at attempt {t.attempt})"

    def started(self, worker_id: str, msg: m.TaskStarted, now: float) -> list[Command]:
        cmds: list[Command] = []
        for ref in msg.tasks:
            t = self.tasks.get(ref.task_id)
            why = self._refusal(t, worker_id, ref.attempt)
            if why is not None:
                cmds.append(Refused(worker_id, "started", ref, why))
            elif t is not None and t.attempt == ref.attempt and t.state == "assigned" and (
                    (worker_id in t.gang.members) if t.gang is not None else t.worker_id == worker_id):
                self.transition(t, "running", f"started on {worker_id}", now)
                cmds.append(Save(t.row()))
                if t.pipelined and (w := self.workers.get(worker_id)) is not None:
                    w.view.started.add(t.slot or t.task_id)  # ran past the started delay: nothing queues behind it
        w = self.workers.get(worker_id)
        if w is not None and w.view.stuck:  # tasks held ahead now wait behind a long one: maybe take them back
            cmds += self.dispatch(now)
        return cmds

    def progress(self, worker_id: str, msg: m.TaskProgress, now: float) -> list[Command]:
        """Keeps a running attempt's latest report (``Task.note_progress``); refuses one on an attempt never given."""
        why = self._refusal(t := self.tasks.get(msg.task.task_id), worker_id, msg.task.attempt)
        if why is None and t is not None:
            t.note_progress(msg.task.attempt, msg.fraction, msg.message, now)
        return [] if why is None else [Refused(worker_id, "progress", msg.task, why)]

    def results(self, worker_id: str, msg: m.Results, now: float) -> list[Command]:
        """Results of ``worker_id``. Only an attempt it was given is stored: the current one makes
        the outcome, a superseded one is kept as history. Any other is refused: acknowledged (so
        the worker's outbox settles it) but neither stored nor the outcome."""
        cmds: list[Command] = []
        notify: list[str] = []
        acked: list[m.TaskRef] = []
        w = self.workers.get(worker_id)
        for r in msg.results:
            t = self.tasks.get(r.task_id)
            why = self._refusal(t, worker_id, r.attempt)
            if why is not None or t is None:
                acked.append(m.TaskRef(r.task_id, r.attempt))
                cmds.append(Refused(worker_id, "result", m.TaskRef(r.task_id, r.attempt), why or "no such task"))
                continue
            if t.gang is not None:
                cmds += self.gangs.result(t, worker_id, r, now, acked)
                continue
            acked.append(m.TaskRef(r.task_id, r.attempt))
            if t.attempt == r.attempt and t.worker_id == worker_id:
                self.free_slot(t)
                if t.pipelined and w is not None:
                    w.view.window = w.pace.observe(r.finished_at - r.started_at, self.policy.pipeline_budget_s)
                    self._index.touch(worker_id)
            # positional, in ResultRow's field order (made for every result; keywords cost 3 times as much)
            cmds.append(Save(ResultRow(r.task_id, r.attempt, worker_id, r.status, r.started_at, r.finished_at, now,
                                       r.output, r.error, t.type)))
            if t.attempt != r.attempt or t.state not in ACTIVE or t.worker_id != worker_id:
                continue  # superseded attempt: stored and acknowledged, never the outcome
            if r.status == "error" and r.output.get("retryable") and t.retries_used < t.spec.max_retries:
                cmds += self.requeue(t, f"infrastructure error on {worker_id}: {r.error}", now, count=True)
                continue
            outcome = {"status": r.status, "attempt": r.attempt, "worker_id": worker_id,
                       "error": r.error, "duration_s": round(r.finished_at - r.started_at, 6)}
            self.transition(t, r.status, f"result from {worker_id}", now, outcome=outcome)
            cmds.append(Save(t.row()))
            notify.append(t.task_id)
        if notify:  # first: a client waiting on the outcome is answered before the ack is signed and sent
            cmds.append(Notify(tuple(notify)))
        if acked:
            cmds.append(Send(worker_id, m.ResultAck(acked)))
        return cmds + self.dispatch(now)

    # ------------------------------------------------------------- time based

    def tick(self, now: float) -> list[Command]:
        """Promote tasks whose retry backoff elapsed; lose workers silent for longer than their
        own TTL (``Worker.liveness``) or disconnected for longer than the grace, and forget those
        gone for longer than the retention (:meth:`.recovery.Recovery.lost`)."""
        cmds: list[Command] = []
        for t in self.queues.due(now):
            self.enqueue(t, now)
        cmds += self.recovery.lost(now)
        if self.gangs.active:
            cmds += self.gangs.deadlines(now)
        return cmds + self.dispatch(now)

    # --------------------------------------------------------------- dispatch

    def dispatch(self, now: float) -> list[Command]:
        """Assign as many pending tasks as eligible workers have free slots for, then pipelined
        ones ahead of the slots of workers whose window allows (:mod:`.pipeline`); then ask
        workers stuck behind a long task for the tasks they hold ahead, for the workers still
        idle (``TakeBack``)."""
        if not (self.queues.waiting() or self.gangs.pending or self.take_backs.watching()):
            return []  # nothing waits: no work proportional to the fleet (heartbeats of an idle fleet)
        cmds: list[Command] = []
        if self.gangs.pending:  # a gang needs the whole list of placeable workers (pick_gang, starvation)
            workers = self.placeable()
            if not workers:
                return []
            cmds = self._assign(workers, now)
        elif self.queues.waiting():
            cmds = self._assign(None, now)
        if self.take_backs.watching():
            cmds += self.take_backs.ask()
        return cmds

    def placeable(self) -> list[WorkerView]:
        """Connected workers with a free slot or room ahead of their slots, in registration order."""
        return [w.view for w in self.workers.values() if w.connected and (w.view.free_slots > 0 or w.view.ahead_room > 0)]

    def _assign(self, workers: list[WorkerView] | None, now: float) -> list[Command]:
        """Place queued tasks (and gangs) on ``workers``, or, when None, on the placement index
        (no gang pending: the same choices without a scan of the fleet)."""
        singles: dict[str, list[list[Task]]] = defaultdict(list)
        batched: dict[str, list[list[Task]]] = defaultdict(list)
        blocked: set[ReqKey] = set()
        gangs = self.gangs.order() if self.gangs.pending else []
        gang_cmds: list[Command] = []
        while True:
            best = self.queues.best_head(blocked)
            if gangs and (best is None or (-gangs[0].spec.priority, gangs[0].seq) < (-best[1].spec.priority, best[1].seq)):
                g = gangs.pop(0)
                assert workers is not None
                placed = self.gangs.place(g, workers, now)
                if placed is not None:
                    gang_cmds += placed
                elif self.gangs.starving(g, now):
                    workers[:] = [w for w in workers if unmet(g.key, w)]  # the rest of this round keeps off its workers
                continue
            if best is None:
                break
            key, t = best
            group = self.queues.batch_group(key, t, now, self.policy.batch_max, self.policy.batch_wait_s)
            w = (self._index.pick_worker(key) if workers is None else pick_worker(key, workers)) if group else None
            ahead = w is None and t.pipelined and len(group) == 1
            if ahead:
                w = self._index.pick_ahead(key) if workers is None else pick_ahead(key, workers)
                if w is not None:
                    self.take_backs.ahead.add(w.worker_id)
            if w is None:
                blocked.add(key)
                continue
            slot = t.task_id if len(group) == 1 else f"batch-{t.task_id}"
            for member in group:
                member.attempt += 1
                member.worker_id, member.slot, member.sent_ahead = w.worker_id, slot, ahead
                self.transition(member, "assigned", f"dispatched to {w.worker_id}"
                                 + (f" in {slot} of {len(group)}" if len(group) > 1 else "")
                                 + (" ahead of a free slot" if ahead else ""), now)
            w.hold(slot, exclusive=not t.pipelined)
            if len(group) > 1:
                self._batches[slot] = {member.task_id for member in group}
            if w.available_memory_mb is not None and key[3]:
                w.available_memory_mb -= key[3] * len(group)  # reserved until the next heartbeat says more
            (batched if len(group) > 1 else singles)[w.worker_id].append(group)
        cmds: list[Command] = [Save(t.row()) for d in (singles, batched) for gs in d.values() for g in gs for t in g]
        cmds += [Send(wid, m.AssignTasks([g[0].assignment() for g in gs])) for wid, gs in singles.items()]
        cmds += [Send(wid, m.AssignTasks([t.assignment() for t in g], batch_id=g[0].slot))
                 for wid, gs in batched.items() for g in gs]
        return cmds + gang_cmds if gang_cmds else cmds

    def taken_back(self, worker_id: str, msg: m.TakenBack, now: float) -> list[Command]:
        """The answer to a ``TakeBack`` (:mod:`.takeback`). A ``dropped`` attempt never started and
        never will on ``worker_id``: it is requeued (at no retry cost) and dispatched as a new
        attempt. A ``kept`` one had started: it stays, and its result counts. A drop of an attempt
        nobody asked this worker for is refused and changes nothing."""
        return self.take_backs.answered(worker_id, msg, now) + self.dispatch(now)

    # ------------------------------------------------------------- primitives
    # What the state's parts (``gangs``, ``take_backs``, ``recovery``) do through it; the
    # transport never calls these.

    def touch(self, worker_id: str) -> None:
        """The worker's free slots or memory changed: the placement index re-files it."""
        self._index.touch(worker_id)

    def drop_worker(self, worker_id: str) -> None:
        """Forget the worker entirely (``Policy.worker_retention_s``)."""
        del self.workers[worker_id]
        self._worker_ids = [wid for wid in self._worker_ids if wid != worker_id]

    def schedule(self, t: Task, now: float) -> None:
        """Queue pending ``t`` now, or once its retry backoff (``not_before``) has passed."""
        if t.not_before > now:
            self.queues.delay(t)
        else:
            t.not_before = 0.0
            self.enqueue(t, now)

    def enqueue(self, t: Task, now: float) -> None:
        if t.gang is not None:
            self.gangs.enqueue(t, now)
            return
        self.queues.push(t)

    def transition(self, t: Task, new: str, cause: str, now: float, outcome: dict[str, Any] | None = None) -> None:
        check_transition(t.task_id, t.state, new, cause)
        t.history.append({"at": now, "from": t.state, "to": new, "cause": cause, "attempt": t.attempt,
                          "worker_id": t.worker_id})
        self.counts[t.state] -= 1
        self.counts[new] += 1
        if is_terminal(new):  # no transition leaves a terminal state: this is the task's last
            self.quota.remove(t.submitted_by, t.payload_bytes)
        t.state, t.updated_at = new, now
        if outcome is not None:
            t.outcome = outcome

    def lose(self, t: Task, cause: str, now: float) -> list[Command]:
        if t.retries_used < t.spec.max_retries:
            return self.requeue(t, cause, now, count=True)
        self.transition(t, "error", cause, now, outcome={"status": "error", "attempt": t.attempt,
                                                           "worker_id": t.worker_id, "error": cause})
        self.free_slot(t)
        return [Save(t.row()), Notify((t.task_id,))]

    def requeue(self, t: Task, cause: str, now: float, *, count: bool) -> list[Command]:
        self.free_slot(t)
        delay = self.policy.retry_backoff.delay(t.retries_used) if count else 0.0
        if count:
            t.retries_used += 1
        self.transition(t, "pending", cause, now)
        t.worker_id = None
        if delay > 0:
            t.not_before = now + delay
            self.queues.delay(t)
        else:
            self.enqueue(t, now)
        return [Save(t.row())]

    def free_slot(self, t: Task) -> None:
        """Release the slot ``t`` holds on its worker once no other active task shares it (every
        member's slot and the rendezvous port, for a gang)."""
        if t.gang is not None:
            self.gangs.release(t)
            return
        w = self.workers.get(t.worker_id or "")
        slot, t.slot = t.slot or t.task_id, ""
        holders = self._batches.get(slot)
        if holders is not None:
            holders.discard(t.task_id)
            if holders:
                return  # the rest of the batch still runs in this slot
            del self._batches[slot]
        if w is not None:
            w.view.release(slot)
            self._index.touch(w.worker_id)

    # ---------------------------------------------------------------- restore

    def restore(self, snap: Snapshot, now: float) -> None:
        """Rebuild from a store snapshot (its active tasks; see ``Snapshot``): pending tasks are
        queued again; tasks that were active wait for their worker to reconnect within the grace
        period, then are requeued. ``counts`` come from ``snap.task_counts`` and submission order
        continues after ``snap.max_seq``. A finished task in ``snap.tasks`` (a store that still
        returns history) is counted when ``task_counts`` is empty and otherwise treated as
        :meth:`load` treats it."""
        self.recovery.restore(snap, now)

    def note_baselines(self, rows: Iterable[TaskRow]) -> None:
        """After a restart: the succeeded single-node training runs among ``rows`` (read from the
        store) are scaling baselines again; other rows are ignored."""
        self.recovery.note_baselines(rows)

    # ------------------------------------------------------------------ views

    def eligible_workers(self, t: Task) -> Iterable[str]:
        return [w.worker_id for w in self.workers.values() if w.connected and not unmet(t.key, w.view)]
