"""The coordinator's scheduling core: events in, commands out. Pure: no awaits, no clock, no I/O.

Every public method takes ``now`` and returns a list of commands for the transport to execute:
:class:`Save` records first (the transport makes them durable), then :class:`Send` /
:class:`CloseWorker` / :class:`Notify`. The transport executes sends only after the saves of the
same call are on disk, so nothing a peer is told can be lost by a crash.

Queues: one priority heap per requirement key (see :mod:`.placement`), ordered by
(-priority, submission sequence): higher priority first, FIFO within a priority. Dispatch takes the
best head among keys that still have an eligible worker with a free slot, so a task nobody can
run never blocks tasks others can.

Gang tasks (multi-node training, see :mod:`.gang`) wait in their own small list and compete with
the queue heads in the same order. A gang is reserved all-or-nothing in one dispatch round: its
``nodes`` distinct eligible workers each get one slot, or nothing is held. While it cannot be
placed, later tasks may use the free slots (backfill) until it has waited ``gang_max_wait_s``;
from then on its eligible workers take no new work of lower or equal priority until it fits, unless
fewer eligible workers are connected than it needs (then it holds nothing and says so). Any
member's failure, loss or hand-back ends the attempt for all members (the others get ``Cancel``),
and the gang is requeued whole or ends. Member results are held unacknowledged until the attempt's
single combined result row is saved.

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
import heapq
from collections import OrderedDict, defaultdict
from collections.abc import Iterable
from typing import Any

from ...errors import Conflict, NotFound, ValidationError
from ...protocol import messages as m
from ...tasks import spec as specs
from ...tasks.states import ACTIVE, check_transition, is_terminal
from ...tasks.usercode import model_module
from .gang import Baselines, PortPool, attempt_row, success_row
from .identity import check_owner, held
from .model import CloseWorker, Command, Notify, Policy, Refused, Save, Send, Task, Worker
from .pipeline import Pace
from .placement import (
    PlacementIndex,
    ReqKey,
    WorkerView,
    gang_pending_reason,
    handler_refusal,
    model_module_refusal,
    pending_reason,
    pick_ahead,
    pick_gang,
    pick_worker,
    unmet,
)
from .quota import KeyQuota, payload_size
from .rows import FORGOTTEN, ResultRow, Snapshot, TaskRow


class CoordinatorState:
    def __init__(self, policy: Policy | None = None) -> None:
        self.policy = policy or Policy()
        self.tasks: dict[str, Task] = {}  # active, finished but not yet durable, and the finished cache
        self._finished: OrderedDict[str, None] = OrderedDict()  # the finished cache, oldest first
        self.workers: dict[str, Worker] = {}
        self._queues: dict[ReqKey, list[tuple[int, int, str]]] = defaultdict(list)
        self._delayed: list[tuple[float, str]] = []
        self._batches: dict[str, set[str]] = {}  # batch slot -> tasks still holding it
        self._seq = 0
        self.counts: dict[str, int] = defaultdict(int)  # tasks per state, kept by _transition
        self._unsent: set[tuple[str, int]] = set()  # attempts restored as "assigned": maybe never sent
        self._gangs_pending: dict[str, Task] = {}  # gang tasks ready to dispatch (not in _queues)
        self._gangs_active: dict[str, Task] = {}  # gang tasks assigned or running
        self._ports = PortPool(*self.policy.gang_port_range)
        self.baselines = Baselines()  # single-node training throughput, for scaling efficiency
        # Take-backs asked and not answered yet: task id -> (worker holding it, attempt, idle
        # worker it is meant for). At most one per task; each counts against its idle worker's slots.
        self._taking_back: dict[str, tuple[str, int, str]] = {}
        self._ahead: set[str] = set()  # workers given tasks ahead of their slots (maybe holding some still)
        self._index = PlacementIndex()  # the connected workers, ordered for placement (told of every gain)
        self._worker_ids: list[str] = []  # every key of self.workers, sorted (worker_ids)
        self.quota = KeyQuota(self.policy.max_queued_per_key, self.policy.max_payload_bytes_per_key)

    # ----------------------------------------------------------------- tasks

    def submit(self, items: list[specs.TaskSpec], now: float,
               submitted_by: str | None = None) -> tuple[list[dict[str, Any]], list[Command]]:
        """Accept specs (ids assigned where missing). Raises Conflict, before changing anything,
        if an id already exists with a different body, and RateLimited when the new ones would
        take ``submitted_by`` past its quota (``quota.py``); an identical resubmission is a no-op."""
        prepared = [specs.with_id(s) for s in items]
        digests = [specs.spec_digest(s) for s in prepared]
        for s, d in zip(prepared, digests, strict=True):
            old = self.tasks.get(s.task_id or "")
            if old is not None and old.digest != d:
                raise Conflict(f"task {s.task_id} already exists with a different body")
        self._refuse_unrunnable(prepared)
        dicts = {s.task_id: specs.spec_to_dict(s) for s in prepared if s.task_id not in self.tasks}
        sizes = {tid: payload_size(d) for tid, d in dicts.items()}
        self.quota.check(submitted_by, sizes.values())
        accepted: list[dict[str, Any]] = []
        cmds: list[Command] = []
        for s, d in zip(prepared, digests, strict=True):
            assert s.task_id is not None
            if s.task_id in self.tasks:
                accepted.append({"task_id": s.task_id, "created": False, "state": self.tasks[s.task_id].state})
                continue
            self._seq += 1
            t = Task(spec=s, spec_dict=dicts[s.task_id], task_id=s.task_id, type=specs.spec_type(s),
                     digest=d, seq=self._seq, submitted_at=now, updated_at=now, submitted_by=submitted_by,
                     payload_bytes=sizes[s.task_id])
            self.quota.add(submitted_by, t.payload_bytes)
            t.history.append({"at": now, "from": None, "to": "pending", "cause": "submitted", "attempt": 0})
            self.tasks[t.task_id] = t
            self.counts["pending"] += 1
            self._enqueue(t, now)
            cmds.append(Save(t.row()))
            accepted.append({"task_id": t.task_id, "created": True, "state": "pending"})
        return accepted, cmds + self.dispatch(now)

    def _refuse_unrunnable(self, prepared: list[specs.TaskSpec]) -> None:
        """Raise ValidationError when a new task's user model imports a module that no connected
        worker allows (placement would never find it a worker), and with ``Policy.strict`` when it
        calls a custom handler no connected worker has; resubmissions are not checked."""
        connected = self._index.views()  # only a task importing a model or calling a handler looks
        errors: list[dict[str, str]] = []
        for i, s in enumerate(prepared):
            if s.task_id in self.tasks or s.bundle is not None:  # shipped code: the worker checks it
                continue
            where = f"[{i}].config." if len(prepared) > 1 else "config."
            kind, config = specs.kind_of(s), specs.config_dict(s)
            module = model_module(kind.imports_model, config)
            reason = None if module is None else model_module_refusal(config["model"], module, connected)
            if reason is not None:
                errors.append({"field": where + "model", "error": reason})
            handler = kind.handler(kind.decode(config)) if self.policy.strict else None
            reason = None if handler is None else handler_refusal(handler, connected)
            if reason is not None:
                errors.append({"field": where + kind.handler_field, "error": reason})
        if errors:
            raise ValidationError(errors)

    def cancel(self, task_id: str, now: float, cause: str = "cancelled by request") -> list[Command]:
        t = self.get(task_id)
        if is_terminal(t.state):
            return []
        if t.gang is not None and t.state in ACTIVE:
            return self._end_gang(t, now, status="cancelled", cause=cause, culprit=None, retry=False) + self.dispatch(now)
        self._gangs_pending.pop(t.task_id, None)
        cmds: list[Command] = []
        if t.state in ACTIVE and t.worker_id is not None:
            cmds.append(Send(t.worker_id, m.Cancel(t.ref(), cause)))
        self._transition(t, "cancelled", cause, now, outcome={"status": "cancelled", "error": cause})
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
                self._unsent.discard((tid, t.attempt))
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
        view = WorkerView(reg.worker_id, frozenset(reg.capabilities), frozenset(reg.tags),
                          reg.memory_gb, reg.max_concurrent, model_modules=tuple(reg.model_modules),
                          handlers=None if reg.handlers is None else frozenset(reg.handlers),
                          accept_bundles=reg.accept_bundles)
        first = w.first_seen if w else now
        if w is None and len(self._worker_ids) == len(self.workers):
            bisect.insort(self._worker_ids, reg.worker_id)  # a new id: O(log n) to find, no re-sort
        w = Worker(view=view, name=reg.name, hardware=reg.hardware, session_id=session_id,
                   first_seen=first, last_seen=now, address=reg.address or reg.name, key_id=key_id,
                   liveness=liveness, pace=Pace(reg.pipeline_depth))
        self.workers[reg.worker_id] = w
        self._forget_take_backs(reg.worker_id)  # asked of an older session: that answer never comes
        cmds += self._reconcile(w, {r.task_id: r.attempt for r in reg.running},
                                {r.task_id: r.attempt for r in reg.finished}, now,
                                {(r.task_id, r.attempt) for r in reg.abandoned})
        if len(view.running) > view.max_concurrent:  # it still holds tasks sent ahead to its last session
            self._ahead.add(reg.worker_id)
        self._index.add(view)
        cmds.append(Save(w.row()))
        return cmds + self.dispatch(now)

    def _reconcile(self, w: Worker, announced: dict[str, int], finished: dict[str, int], now: float,
                   abandoned: set[tuple[str, int]]) -> list[Command]:
        """Keep tasks the worker still runs or has finished (their results follow the
        registration); requeue ours it no longer has; cancel the rest."""
        cmds: list[Command] = []
        for t in self.tasks.values():
            if t.worker_id == w.worker_id and t.state in ACTIVE and t.gang is None:
                if announced.get(t.task_id) == t.attempt:
                    w.view.hold(t.slot or t.task_id, exclusive=not t.pipelined, started=t.state == "running")
                elif finished.get(t.task_id) == t.attempt:
                    self._free_slot(t)  # done there; the re-sent result makes the outcome
                elif (t.task_id, t.attempt) in abandoned:
                    # sent provisionally; the session ended before the confirm, so the worker
                    # stopped it without reporting anything: it costs no retry
                    cmds += self._requeue(t, "assignment abandoned: its session ended before it was confirmed",
                                          now, count=False)
                elif (t.task_id, t.attempt) in self._unsent and t.state == "assigned":
                    # dispatched just before a coordinator crash and never heard of: the assign
                    # message may never have left, so the attempt costs no retry
                    cmds += self._requeue(t, "assignment lost in a coordinator restart", now, count=False)
                else:
                    cmds += self._lose(t, "worker restarted without this task", now)
                self._unsent.discard((t.task_id, t.attempt))
        for t in list(self._gangs_active.values()):
            assert t.gang is not None
            if (t.task_id, t.attempt) in abandoned and w.worker_id in t.gang.members and w.worker_id not in t.gang.held:
                # the member stopped it unconfirmed: end the attempt now (the other ranks wait on
                # it), at no retry cost. A member whose result is held here finished it: its
                # result, sent before the confirm, stands (we still hold it, so we did not crash)
                cmds += self._end_gang(t, now, status="error", culprit=w.worker_id, retry=True, count=False,
                                       cause=f"node assignment abandoned by {w.worker_id}: its session ended "
                                             "before it was confirmed")
                continue
            self._reconcile_member(t, w, announced, now)
        for task_id, attempt in announced.items():
            known = self.tasks.get(task_id)
            mine = known is not None and (w.worker_id in known.gang.members if known.gang is not None
                                          else known.worker_id == w.worker_id)
            if known is None or known.attempt != attempt or not mine or known.state not in ACTIVE:
                cmds.append(Send(w.worker_id, m.Cancel(m.TaskRef(task_id, attempt), "superseded or unknown attempt")))
        return cmds

    def _reconcile_member(self, t: Task, w: Worker, announced: dict[str, int], now: float) -> None:
        """A gang member re-registered: it keeps its slot if it still runs the attempt. If it does
        not, its result may be on the way (a worker re-sends unacknowledged results right after
        registering), so it has ``worker_grace_s`` for that before the attempt fails."""
        g = t.gang
        assert g is not None
        if w.worker_id not in g.members or w.worker_id in g.held:
            return
        if announced.get(t.task_id) == t.attempt:
            w.view.hold(t.task_id, exclusive=True)
            g.awaiting.pop(w.worker_id, None)
        else:
            g.awaiting.setdefault(w.worker_id, now + self.policy.worker_grace_s)

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
        self._forget_take_backs(worker_id)
        return [Save(w.row())]

    def goodbye(self, worker_id: str, msg: m.Goodbye, now: float) -> list[Command]:
        cmds: list[Command] = []
        for ref in msg.handed_back:
            t = self.tasks.get(ref.task_id)
            if t is not None and t.gang is not None:
                if t.attempt == ref.attempt and t.state in ACTIVE and worker_id in t.gang.members and worker_id not in t.gang.held:
                    cmds += self._end_gang(t, now, status="error", cause=f"node {t.gang.members.index(worker_id)} "
                                           f"handed back by {worker_id}: {msg.reason}", culprit=worker_id,
                                           retry=True, count=False)
                continue
            if t is not None and t.attempt == ref.attempt and t.state in ACTIVE and t.worker_id == worker_id:
                cmds += self._requeue(t, f"handed back by {worker_id}: {msg.reason}", now, count=False)
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
                self._transition(t, "running", f"started on {worker_id}", now)
                cmds.append(Save(t.row()))
                if t.pipelined and (w := self.workers.get(worker_id)) is not None:
                    w.view.started.add(t.slot or t.task_id)  # ran past the started delay: nothing queues behind it
        w = self.workers.get(worker_id)
        if w is not None and w.view.stuck:  # tasks held ahead now wait behind a long one: maybe take them back
            cmds += self.dispatch(now)
        return cmds

    def progress(self, worker_id: str, msg: m.TaskProgress, now: float) -> list[Command]:
        """Progress is only logged; a report on an attempt the worker was never given is refused."""
        why = self._refusal(self.tasks.get(msg.task.task_id), worker_id, msg.task.attempt)
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
                cmds += self._gang_result(t, worker_id, r, now, acked)
                continue
            acked.append(m.TaskRef(r.task_id, r.attempt))
            if t.attempt == r.attempt and t.worker_id == worker_id:
                self._free_slot(t)
                if t.pipelined and w is not None:
                    w.view.window = w.pace.observe(r.finished_at - r.started_at, self.policy.pipeline_budget_s)
                    self._index.touch(worker_id)
            cmds.append(Save(ResultRow(
                task_id=r.task_id, attempt=r.attempt, worker_id=worker_id, status=r.status,
                started_at=r.started_at, finished_at=r.finished_at, received_at=now,
                output=r.output, error=r.error, task_type=t.type)))
            if t.attempt != r.attempt or t.state not in ACTIVE or t.worker_id != worker_id:
                continue  # superseded attempt: stored and acknowledged, never the outcome
            if r.status == "error" and r.output.get("retryable") and t.retries_used < t.spec.max_retries:
                cmds += self._requeue(t, f"infrastructure error on {worker_id}: {r.error}", now, count=True)
                continue
            outcome = {"status": r.status, "attempt": r.attempt, "worker_id": worker_id,
                       "error": r.error, "duration_s": round(r.finished_at - r.started_at, 6)}
            self._transition(t, r.status, f"result from {worker_id}", now, outcome=outcome)
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
        own TTL (``Worker.liveness``) or disconnected for longer than the grace."""
        cmds: list[Command] = []
        while self._delayed and self._delayed[0][0] <= now:
            _, task_id = heapq.heappop(self._delayed)
            t = self.tasks.get(task_id)  # gone: cancelled while it waited, and retired since
            if t is not None and t.state == "pending" and t.not_before:
                t.not_before = 0.0
                self._enqueue(t, now)
        for w in list(self.workers.values()):
            if w.connected and now - w.last_seen > w.liveness.ttl_s:
                cmds.append(CloseWorker(w.worker_id, w.session_id or "", f"nothing heard for {now - w.last_seen:.1f}s "
                                        f"(its TTL is {w.liveness.ttl_s:g}s)"))
                cmds += self.disconnect(w.worker_id, w.session_id or "", now)
            if not w.connected and w.disconnected_at is not None and now - w.disconnected_at >= self.policy.worker_grace_s:
                w.disconnected_at = None
                cause = f"worker {w.worker_id} lost (no reconnect within {self.policy.worker_grace_s:g}s)"
                for t in [t for t in self.tasks.values() if t.worker_id == w.worker_id and t.state in ACTIVE and t.gang is None]:
                    cmds += self._lose_held(t, cause, now)
                cmds += self._gang_member_lost(w.worker_id, cause, now)
                w.view.release_all()
        cmds += self._forget_gone(now)
        if self._gangs_active:
            cmds += self._gang_deadlines(now)
        return cmds + self.dispatch(now)

    def _forget_gone(self, now: float) -> list[Command]:
        """Forget workers disconnected, past their grace and not heard from for
        ``worker_retention_s`` (0: never): their entry, listing and key binding go; the tasks and
        results they ran stay. A worker some unfinished task still names is kept."""
        keep = self.policy.worker_retention_s
        gone = [w for w in self.workers.values() if keep and not w.connected and w.disconnected_at is None
                and now - w.last_seen >= keep]
        if not gone:
            return []
        named = {t.worker_id for t in self.tasks.values() if t.state in ACTIVE} | {
            wid for t in self._gangs_active.values() if t.gang is not None for wid in t.gang.members}
        cmds: list[Command] = []
        for w in gone:
            if w.worker_id in named:
                continue
            del self.workers[w.worker_id]
            self._worker_ids = [wid for wid in self._worker_ids if wid != w.worker_id]
            cmds.append(Save(w.row(FORGOTTEN)))
        return cmds

    # --------------------------------------------------------------- dispatch

    def dispatch(self, now: float) -> list[Command]:
        """Assign as many pending tasks as eligible workers have free slots for, then pipelined
        ones ahead of the slots of workers whose window allows (:mod:`.pipeline`); then ask
        workers stuck behind a long task for the tasks they hold ahead, for the workers still
        idle (``TakeBack``)."""
        if not (self._queues or self._gangs_pending or self._taking_back or self._ahead):
            return []  # nothing waits: no work proportional to the fleet (heartbeats of an idle fleet)
        cmds: list[Command] = []
        if self._gangs_pending:  # a gang needs the whole list of placeable workers (pick_gang, starvation)
            workers = self._placeable()
            if not workers:
                return []
            cmds = self._assign(workers, now)
        elif self._queues:
            cmds = self._assign(None, now)
        if self._taking_back or self._ahead:
            cmds += self._take_back()
        return cmds

    def _placeable(self) -> list[WorkerView]:
        """Connected workers with a free slot or room ahead of their slots, in registration order."""
        return [w.view for w in self.workers.values() if w.connected and (w.view.free_slots > 0 or w.view.ahead_room > 0)]

    def _assign(self, workers: list[WorkerView] | None, now: float) -> list[Command]:
        """Place queued tasks (and gangs) on ``workers``, or, when None, on the placement index
        (no gang pending: the same choices without a scan of the fleet)."""
        singles: dict[str, list[list[Task]]] = defaultdict(list)
        batched: dict[str, list[list[Task]]] = defaultdict(list)
        blocked: set[ReqKey] = set()
        gangs = self._gang_order() if self._gangs_pending else []
        gang_cmds: list[Command] = []
        while True:
            best = self._best_head(blocked)
            if gangs and (best is None or (-gangs[0].spec.priority, gangs[0].seq) < (-best[1].spec.priority, best[1].seq)):
                g = gangs.pop(0)
                assert workers is not None
                placed = self._place_gang(g, workers, now)
                if placed is not None:
                    gang_cmds += placed
                elif self._starving(g, now):
                    workers[:] = [w for w in workers if unmet(g.key, w)]  # the rest of this round keeps off its workers
                continue
            if best is None:
                break
            key, t = best
            group = self._batch_group(key, t, now)
            w = (self._index.pick_worker(key) if workers is None else pick_worker(key, workers)) if group else None
            ahead = w is None and t.pipelined and len(group) == 1
            if ahead:
                w = self._index.pick_ahead(key) if workers is None else pick_ahead(key, workers)
                if w is not None:
                    self._ahead.add(w.worker_id)
            if w is None:
                blocked.add(key)
                continue
            slot = t.task_id if len(group) == 1 else f"batch-{t.task_id}"
            for member in group:
                member.attempt += 1
                member.worker_id, member.slot, member.sent_ahead = w.worker_id, slot, ahead
                self._transition(member, "assigned", f"dispatched to {w.worker_id}"
                                 + (f" in {slot} of {len(group)}" if len(group) > 1 else "")
                                 + (" ahead of a free slot" if ahead else ""), now)
            w.hold(slot, exclusive=not t.pipelined)
            if len(group) > 1:
                self._batches[slot] = {member.task_id for member in group}
            if w.available_memory_mb is not None and key[3]:
                w.available_memory_mb -= key[3] * len(group)  # reserved until the next heartbeat says more
            (batched if len(group) > 1 else singles)[w.worker_id].append(group)
        cmds: list[Command] = [Save(t.row()) for d in (singles, batched) for gs in d.values() for g in gs for t in g]
        cmds += [Send(wid, m.AssignTasks([self._assignment(g[0]) for g in gs])) for wid, gs in singles.items()]
        cmds += [Send(wid, m.AssignTasks([self._assignment(t) for t in g], batch_id=g[0].slot))
                 for wid, gs in batched.items() for g in gs]
        return cmds + gang_cmds if gang_cmds else cmds

    def _take_back(self) -> list[Command]:
        """Ask workers stuck behind a long or exclusive task (``WorkerView.stuck``) for the tasks
        they hold ahead of their slots, oldest first (priority, then FIFO), one for each free slot
        of an eligible worker not already promised one. Sends ``TakeBack``; the task moves only
        when the worker answers that it had not started it (:meth:`taken_back`)."""
        for tid, (holder, attempt, _) in list(self._taking_back.items()):
            t = self.tasks.get(tid)
            if t is None or t.state != "assigned" or t.attempt != attempt or t.worker_id != holder:
                del self._taking_back[tid]  # settled otherwise (result, cancel, loss): no longer a claim
        waiting: list[Task] = []
        for wid in list(self._ahead):
            w = self.workers.get(wid)
            if w is None or len(w.view.running) <= w.view.max_concurrent:
                self._ahead.discard(wid)  # holds nothing ahead any more
            elif w.connected and w.view.stuck:
                held = sorted((t for tid in w.view.running if tid not in w.view.started
                               and (t := self.tasks.get(tid)) is not None and t.state == "assigned" and t.pipelined),
                              key=lambda t: (t.history[-1]["at"], t.seq))  # in the order the worker got them
                # the oldest fill the slots no started or exclusive task holds: likely running already
                busy = max(0, w.view.max_concurrent - len(w.view.started) - len(w.view.exclusive))
                waiting += [t for t in held[busy:] if t.task_id not in self._taking_back]
        if not waiting:
            return []
        workers = self._placeable()  # someone waits behind a long task: find the idle workers
        idle = {v.worker_id: v.free_slots for v in workers if v.free_slots > 0}
        for _, _, to in self._taking_back.values():
            if to in idle:
                idle[to] -= 1
        if not any(n > 0 for n in idle.values()):
            return []
        views = {v.worker_id: v for v in workers}
        asks: dict[str, list[m.TaskRef]] = defaultdict(list)
        for t in sorted(waiting, key=lambda t: (-t.spec.priority, t.seq)):
            dest = next((i for i, n in idle.items() if n > 0 and i != t.worker_id and not unmet(t.key, views[i])), None)
            if dest is None:
                continue
            assert t.worker_id is not None
            idle[dest] -= 1
            self._taking_back[t.task_id] = (t.worker_id, t.attempt, dest)
            asks[t.worker_id].append(t.ref())
        return [Send(wid, m.TakeBack(refs)) for wid, refs in asks.items()]

    def taken_back(self, worker_id: str, msg: m.TakenBack, now: float) -> list[Command]:
        """The answer to a ``TakeBack``. A ``dropped`` attempt never started and never will on
        ``worker_id``: it is requeued (at no retry cost) and dispatched as a new attempt. A
        ``kept`` one had started: it stays, and its result counts. A drop of an attempt nobody
        asked this worker for is refused and changes nothing."""
        cmds: list[Command] = []
        for ref in msg.dropped:
            claim = self._taking_back.get(ref.task_id)
            if claim is None or claim[:2] != (worker_id, ref.attempt):
                cmds.append(Refused(worker_id, "taken_back", ref, "no take-back of this attempt was asked of this worker"))
                continue
            del self._taking_back[ref.task_id]
            t = self.tasks.get(ref.task_id)  # (a claim outlives a task that finished and left memory)
            if t is not None and t.state in ACTIVE and t.attempt == ref.attempt and t.worker_id == worker_id:
                cmds += self._requeue(t, f"taken back from {worker_id} before it started (waiting there while "
                                         f"{claim[2]} was idle)", now, count=False)
        for ref in msg.kept:
            claim = self._taking_back.get(ref.task_id)
            if claim is not None and claim[:2] == (worker_id, ref.attempt):
                del self._taking_back[ref.task_id]
        return cmds + self.dispatch(now)

    def _forget_take_backs(self, worker_id: str) -> None:
        """The session ``worker_id`` was asked on is gone: its answers never come."""
        for tid in [tid for tid, (holder, _, _) in self._taking_back.items() if holder == worker_id]:
            del self._taking_back[tid]

    def _batch_group(self, key: ReqKey, head: Task, now: float) -> list[Task]:
        """``head`` plus the pending tasks that can share its model load (at most batch_max);
        empty while a lone benchmark task is still within its batching wait."""
        if head.batch_key is None or self.policy.batch_max <= 1:
            return [head]
        queued = (self.tasks.get(e[2]) for e in self._queues.get(key, []) if e[2] != head.task_id)
        mates = sorted((t for t in queued if t is not None and t.state == "pending" and t.batch_key == head.batch_key),
                       key=lambda t: (-t.spec.priority, t.seq))
        group = [head, *mates[: self.policy.batch_max - 1]]
        if len(group) < self.policy.batch_max and now - head.submitted_at < self.policy.batch_wait_s:
            return []
        return group

    def _best_head(self, blocked: set[ReqKey]) -> tuple[ReqKey, Task] | None:
        best: tuple[tuple[int, int], ReqKey, Task] | None = None
        for key in list(self._queues):
            if key in blocked:
                continue
            q = self._queues[key]
            while q and ((queued := self.tasks.get(q[0][2])) is None or queued.state != "pending"):
                heapq.heappop(q)  # cancelled while queued (and maybe retired since)
            if not q:
                del self._queues[key]
                continue
            order = (q[0][0], q[0][1])
            if best is None or order < best[0]:
                best = (order, key, self.tasks[q[0][2]])
        return None if best is None else (best[1], best[2])

    @staticmethod
    def _assignment(t: Task, gang: m.GangAssignment | None = None) -> m.TaskAssignment:
        return m.TaskAssignment(
            task_id=t.task_id, attempt=t.attempt, type=t.type, config=specs.config_dict(t.spec),
            timeout_s=t.spec.timeout_s, max_memory_mb=t.spec.max_memory_mb, cache=t.spec.cache, gang=gang,
            bundle=t.spec.bundle, python=list(t.spec.requirements.python))

    # ------------------------------------------------------------------ gangs

    def _gang_order(self) -> list[Task]:
        """Pending gangs in dispatch order (higher priority first, then FIFO)."""
        for tid in [tid for tid, t in self._gangs_pending.items() if t.state != "pending"]:
            del self._gangs_pending[tid]
        return sorted(self._gangs_pending.values(), key=lambda t: (-t.spec.priority, t.seq))

    def _place_gang(self, t: Task, workers: list[WorkerView], now: float) -> list[Command] | None:
        """Reserve one slot on each of ``nodes`` distinct workers and send each its node rank, or
        change nothing (None) when they are not all free now."""
        g = t.gang
        assert g is not None
        chosen = pick_gang(t.key, g.nodes, workers)
        if chosen is None:
            return None
        addresses = [self.workers[w.worker_id].address for w in chosen]
        port = self._ports.take(addresses[0])
        if port is None:
            return None  # every port of the range is in use on that address; wait for a gang to end
        t.attempt += 1
        g.place([w.worker_id for w in chosen], addresses, port, all("cuda" in w.capabilities for w in chosen), now)
        t.worker_id, t.slot = chosen[0].worker_id, t.task_id
        for w in chosen:
            w.hold(t.task_id, exclusive=True)
            if w.available_memory_mb is not None and t.key[3]:
                w.available_memory_mb -= t.key[3]
        ranks = ", ".join(f"{wid} (rank {r})" for r, wid in enumerate(g.members))
        self._transition(t, "assigned", f"dispatched to gang {ranks}, rendezvous {g.master_addr}:{port}", now)
        t.history[-1]["gang"] = g.record()
        del self._gangs_pending[t.task_id]
        self._gangs_active[t.task_id] = t
        return [Save(t.row()), *(Send(wid, m.AssignTasks([self._assignment(t, g.assignment(rank))]))
                                 for rank, wid in enumerate(g.members))]

    def _starving(self, t: Task, now: float) -> bool:
        """Past ``gang_max_wait_s`` and placeable in principle (enough eligible workers connected
        and accepting): its eligible workers then take no new lower or equal priority work."""
        g = t.gang
        assert g is not None
        g.protecting = now - g.queued_at >= self.policy.gang_max_wait_s and sum(
            1 for w in self.workers.values()
            if w.connected and w.view.accepting and w.view.max_concurrent > 0 and not unmet(t.key, w.view)) >= g.nodes
        return g.protecting

    def _gang_result(self, t: Task, worker_id: str, r: m.TaskResult, now: float, acked: list[m.TaskRef]) -> list[Command]:
        """A member's result. Held without an ack until the attempt's row is saved; a result of an
        attempt the worker held but that is over is stored and acknowledged (appended to ``acked``)."""
        g = t.gang
        assert g is not None
        if t.state not in ACTIVE or r.attempt != t.attempt or worker_id not in g.members:
            acked.append(m.TaskRef(r.task_id, r.attempt))
            return [Save(ResultRow(
                task_id=r.task_id, attempt=r.attempt, worker_id=worker_id, status=r.status, started_at=r.started_at,
                finished_at=r.finished_at, received_at=now, output=r.output, error=r.error, task_type=t.type))]
        w = self.workers.get(worker_id)
        if w is not None:
            w.view.release(t.task_id)  # this node is done
            self._index.touch(worker_id)
        g.held[worker_id] = r
        g.awaiting.pop(worker_id, None)
        if r.status != "succeeded":
            rank = g.members.index(worker_id)
            retry = r.status in ("error", "cancelled") and r.output.get("retryable") is not False
            return self._end_gang(t, now, status="error" if r.status == "cancelled" else r.status,
                                  cause=f"node {rank} ({worker_id}) {r.status}: {r.error or 'no reason given'}",
                                  culprit=worker_id, retry=retry)
        if len(g.held) < len(g.members):
            return []
        row, extra = success_row(t.task_id, t.attempt, g, self.baselines, now)
        acks = self._gang_acks(t)
        outcome = {"status": "succeeded", "attempt": t.attempt, "worker_id": g.members[0], "error": None,
                   "duration_s": round(row.finished_at - row.started_at, 6), **extra}
        self._transition(t, "succeeded", f"all {g.nodes} node(s) succeeded", now, outcome=outcome)
        if extra["training"] is not None:
            self.baselines.record(t.task_id, t.attempt, extra["training"], now)
        self._free_slot(t)
        return [Save(row), Save(t.row()), *acks, Notify((t.task_id,))]

    def _end_gang(self, t: Task, now: float, *, status: str, cause: str, culprit: str | None, retry: bool,
                  count: bool = True) -> list[Command]:
        """End the current attempt of gang ``t`` for every member: save its one result row,
        ``Cancel`` the members still running, acknowledge the held results, free every slot, then
        requeue the whole gang (``retry`` and retries left; ``count=False`` never uses one) or end
        the task as ``status``."""
        g = t.gang
        assert g is not None
        stop = [w for w in g.members if w not in g.held and w != culprit]
        notes = {w: f"stopped: {cause}" for w in stop}
        if culprit is not None and culprit not in g.held:
            notes[culprit] = cause
        cmds: list[Command] = [Save(attempt_row(t.task_id, t.attempt, g, status, cause, culprit, notes, now))]
        cmds += [Send(w, m.Cancel(t.ref(), f"gang attempt {t.attempt} ended: {cause}")) for w in stop]
        acks = self._gang_acks(t)
        if retry and (not count or t.retries_used < t.spec.max_retries):
            return cmds + self._requeue(t, cause, now, count=count) + acks
        outcome = {"status": status, "attempt": t.attempt, "worker_id": culprit or t.worker_id, "error": cause,
                   "members": list(g.members)}
        self._transition(t, status, cause, now, outcome=outcome)
        self._free_slot(t)
        return [*cmds, Save(t.row()), *acks, Notify((t.task_id,))]

    @staticmethod
    def _gang_acks(t: Task) -> list[Command]:
        assert t.gang is not None
        return [Send(w, m.ResultAck([m.TaskRef(r.task_id, r.attempt)])) for w, r in t.gang.held.items()]

    def _release_gang(self, t: Task) -> None:
        g = t.gang
        assert g is not None
        for wid in g.members:
            w = self.workers.get(wid)
            if w is not None:
                w.view.release(t.task_id)
                self._index.touch(wid)
        if g.master_port:
            self._ports.release(g.master_addr, g.master_port)
        g.clear()
        t.slot = ""
        self._gangs_active.pop(t.task_id, None)

    def _gang_member_lost(self, worker_id: str, cause: str, now: float) -> list[Command]:
        cmds: list[Command] = []
        for t in list(self._gangs_active.values()):
            g = t.gang
            assert g is not None
            if worker_id in g.members and worker_id not in g.held:
                cmds += self._end_gang(t, now, status="error", cause=f"node {g.members.index(worker_id)}: {cause}",
                                       culprit=worker_id, retry=True)
        return cmds

    def _gang_deadlines(self, now: float) -> list[Command]:
        """Fail attempts whose member re-registered without the task and sent no result in time."""
        cmds: list[Command] = []
        for t in list(self._gangs_active.values()):
            g = t.gang
            assert g is not None
            late = [w for w, deadline in g.awaiting.items() if deadline <= now]
            if late and t.task_id in self._gangs_active:
                cmds += self._end_gang(t, now, status="error", culprit=late[0], retry=True,
                                       cause=f"node {g.members.index(late[0])} ({late[0]}) re-registered without "
                                             f"the task and sent no result within {self.policy.worker_grace_s:g}s")
        return cmds

    def _restore_gang(self, t: Task, now: float) -> None:
        """After a restart: an active gang keeps its members (each must re-announce the attempt
        within the grace period) and port."""
        g = t.gang
        assert g is not None
        if t.state in ACTIVE:
            g.restore(t.history, t.attempt, t.worker_id, now)
            t.slot = t.task_id
            if g.master_port:
                self._ports.hold(g.master_addr, g.master_port)
            self._gangs_active[t.task_id] = t

    def note_baselines(self, rows: Iterable[TaskRow]) -> None:
        """After a restart: the succeeded single-node training runs among ``rows`` (read from the
        store) are scaling baselines again; other rows are ignored."""
        for row in rows:
            summary = (row.outcome or {}).get("training") if row.state == "succeeded" else None
            if isinstance(summary, dict) and {"model", "global_batch", "precision", "nnodes",
                                              "global_samples_per_s"} <= summary.keys():
                self.baselines.record(row.task_id, row.attempt, summary, row.updated_at)

    # ---------------------------------------------------------------- helpers

    def _enqueue(self, t: Task, now: float) -> None:
        if t.gang is not None:
            t.gang.queued_at, t.gang.protecting = now, False
            self._gangs_pending[t.task_id] = t
            return
        heapq.heappush(self._queues[t.key], (-t.spec.priority, t.seq, t.task_id))

    def _transition(self, t: Task, new: str, cause: str, now: float, outcome: dict[str, Any] | None = None) -> None:
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

    def _lose_held(self, t: Task, cause: str, now: float) -> list[Command]:
        """A lost worker's task: one that only waited ahead of its slots (sent ahead, never reported
        started) is requeued once without using a retry (a crash with a deep window would otherwise
        end dozens of innocent tasks; a task that itself kills workers uses its retries the next
        time); any other is lost as usual (``_lose``)."""
        if t.sent_ahead and t.state == "assigned" and not t.spared:
            t.spared = True
            return self._requeue(t, f"{cause}; it was waiting ahead of the worker's slots: requeued without a retry",
                                 now, count=False)
        return self._lose(t, cause, now)

    def _lose(self, t: Task, cause: str, now: float) -> list[Command]:
        if t.retries_used < t.spec.max_retries:
            return self._requeue(t, cause, now, count=True)
        self._transition(t, "error", cause, now, outcome={"status": "error", "attempt": t.attempt,
                                                           "worker_id": t.worker_id, "error": cause})
        self._free_slot(t)
        return [Save(t.row()), Notify((t.task_id,))]

    def _requeue(self, t: Task, cause: str, now: float, *, count: bool) -> list[Command]:
        self._free_slot(t)
        delay = self.policy.retry_backoff.delay(t.retries_used) if count else 0.0
        if count:
            t.retries_used += 1
        self._transition(t, "pending", cause, now)
        t.worker_id = None
        if delay > 0:
            t.not_before = now + delay
            heapq.heappush(self._delayed, (t.not_before, t.task_id))
        else:
            self._enqueue(t, now)
        return [Save(t.row())]

    def _free_slot(self, t: Task) -> None:
        """Release the slot ``t`` holds on its worker once no other active task shares it (every
        member's slot and the rendezvous port, for a gang)."""
        if t.gang is not None:
            self._release_gang(t)
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
        counted: dict[str, int] = defaultdict(int)
        finished: list[TaskRow] = []
        for row in sorted(snap.tasks, key=lambda r: (r.seq, r.submitted_at)):
            counted[row.state] += 1
            if is_terminal(row.state):
                finished.append(row)
                continue
            t = Task.from_row(row)
            self._seq = t.seq = max(self._seq + 1, row.seq)
            self.tasks[t.task_id] = t
            t.payload_bytes = payload_size(t.spec_dict)
            self.quota.add(t.submitted_by, t.payload_bytes)
            if t.state == "assigned":
                self._unsent.add((t.task_id, t.attempt))
            if t.gang is not None:
                self._restore_gang(t, now)
            if t.state == "pending":
                if t.not_before > now:
                    heapq.heappush(self._delayed, (t.not_before, t.task_id))
                else:
                    t.not_before = 0.0
                    self._enqueue(t, now)
        self._seq = max(self._seq, snap.max_seq)
        self.counts = defaultdict(int, snap.task_counts or counted)
        self.note_baselines(finished)
        self.load(finished[-self.policy.finished_cache:] if self.policy.finished_cache else [])
        for wr in snap.workers:
            if wr.state == FORGOTTEN:  # a store that kept the deleting record
                continue
            view = WorkerView(wr.worker_id, frozenset(wr.capabilities), frozenset(wr.tags),
                              float(wr.hardware.get("memory_gb", 0.0)), 0)
            self.workers[wr.worker_id] = Worker(view=view, name=wr.name, hardware=wr.hardware, session_id=None,
                                                first_seen=wr.first_seen, last_seen=wr.last_seen,
                                                connected=False, disconnected_at=now, key_id=wr.key_id or "")

    # ------------------------------------------------------------------ views

    def eligible_workers(self, t: Task) -> Iterable[str]:
        return [w.worker_id for w in self.workers.values() if w.connected and not unmet(t.key, w.view)]
