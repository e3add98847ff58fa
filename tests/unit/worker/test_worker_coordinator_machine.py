"""The coordinator's pure state and the worker's pure state played against each other.

Hypothesis interleaves submissions, message deliveries (each session is two FIFO queues; what is in
flight when a session ends is lost), the coordinator's fsyncs, task runs finishing, the 25 ms
``started`` timer, the result hold ending, disconnects, liveness drops (time passing past the TTL),
worker kills (everything lost but the durable outbox: kept results and running records) and
coordinator restarts (everything lost but the journal's durable prefix).

Between them sits a model of ``coordinator/runtime.py``: a call's records go to the journal and
its sends wait until they are durable, except an assignment for a session with nothing waiting,
which goes out at once as *provisional* and is confirmed once durable. Its memory holds the active
work and no finished task (``finished_cache=0``): a finished task leaves it once durable, and a
report on one that left memory is preceded by reading its row back from the journal, as the
runtime does from the store; a restart restores only the active tasks. After every step:

* a terminal task stays terminal with the same outcome, and an outcome is a result some worker
  really produced for that attempt (no task runs twice to an outcome);
* the current attempt of an active task runs on at most one worker, and no worker starts an
  attempt the coordinator handed out once a second time;
* the coordinator never refuses a worker's report (a worker only speaks for attempts it held);
* pipelining: the workers register with a ``pipeline_depth``, so the coordinator sends tasks ahead
  of their slots once short results come back, and takes them back for an idle worker when they
  wait behind a task that announced itself started. An attempt a worker dropped for a take-back
  never starts there, and one it kept stays where it is (its result counts).

At the end everyone reconnects and the system is left to settle: every task ends, and every
result is acknowledged or superseded (no outbox holds anything) — no task lost.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from distributed_testing.coordinator.core.commands import CloseWorker, Refused, Save, Send
from distributed_testing.coordinator.core.policy import Policy
from distributed_testing.coordinator.core.rows import Snapshot, TaskRow, WorkerRow
from distributed_testing.coordinator.core.state import CoordinatorState
from distributed_testing.protocol import messages as m
from distributed_testing.retry import Backoff
from distributed_testing.tasks import spec as specs
from distributed_testing.tasks.states import ACTIVE, is_terminal
from distributed_testing.worker.core import state as ws

POLICY = Policy(worker_grace_s=10.0, worker_ttl_s=30.0, finished_cache=0,
                retry_backoff=Backoff(base_s=1.0, factor=2.0, max_s=4.0, jitter=0.0))
FLEET = {"w1": {"slots": 2, "recover": True, "depth": 2}, "w2": {"slots": 1, "recover": False, "depth": 1}}
Key = tuple[str, int]


@dataclass
class Session:
    sid: str
    to_worker: deque[tuple[int, m.Message]] = field(default_factory=deque)  # (epoch sent in, message)
    to_coord: deque[m.Message] = field(default_factory=deque)
    provisional: int = 0
    deferred: int = 0


@dataclass
class Run:
    assignments: tuple[m.TaskAssignment, ...]
    epoch: int
    cancelled: bool = False
    announced: bool = False


@dataclass
class Worker:
    """One worker process: its pure state and its runs (lost when killed), and its durable
    outbox: kept results and running records (kept when killed)."""

    state: ws.WorkerState
    runs: dict[int, Run] = field(default_factory=dict)
    hold_armed: bool = False
    kept: dict[Key, m.TaskResult] = field(default_factory=dict)
    records: set[Key] = field(default_factory=set)
    dropped: set[Key] = field(default_factory=set)  # attempts this process gave back (take_back)


def fresh_worker(wid: str, kept: dict[Key, m.TaskResult] | None = None) -> Worker:
    return Worker(state=ws.WorkerState(slots=int(FLEET[wid]["slots"])), kept=kept or {})  # type: ignore[call-overload]


@dataclass
class Pending:
    """One coordinator call whose records are not durable yet."""

    records: list[Any]
    rest: list[Any]
    confirms: dict[str, tuple[Session, int]]
    waiting: list[Session]


class WorkerCoordinatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0
        self.coord = CoordinatorState(POLICY)
        self.journal: list[Any] = []  # durable
        self.pending: deque[Pending] = deque()
        self.epoch = 0
        self.sessions: dict[str, Session | None] = {w: None for w in FLEET}
        self.workers = {w: fresh_worker(w) for w in FLEET}
        self.n_tasks = 0
        self.sids = itertools.count(1)
        self.produced: set[tuple[str, int, str, str]] = set()  # (task, attempt, worker, status)
        self.started: set[tuple[str, int, int]] = set()  # (task, attempt, epoch assigned in)
        self.outcomes: dict[str, dict[str, Any]] = {}  # terminal outcomes on disk
        self.seen = 0  # journal records checked

    # ------------------------------------------------------- the coordinator's runtime

    def execute(self, cmds: list[Any]) -> None:
        records = [c.record for c in cmds if isinstance(c, Save)]
        rest = [c for c in cmds if not isinstance(c, Save)]
        assert not [c for c in rest if isinstance(c, Refused)], [c for c in rest if isinstance(c, Refused)]
        if not records:
            self.run_commands(rest)
            return
        later: list[Any] = []
        blocked: set[str] = set()
        confirms: dict[str, tuple[Session, int]] = {}
        for c in rest:
            if isinstance(c, Send) and isinstance(c.msg, m.AssignTasks) and c.worker_id not in blocked:
                s = self.sessions.get(c.worker_id)
                if s is not None and s.deferred == 0:
                    s.provisional += 1
                    s.to_worker.append((self.epoch, m.AssignTasks(c.msg.tasks, c.msg.batch_id, s.provisional)))
                    confirms[c.worker_id] = (s, s.provisional)
                    continue
            if isinstance(c, CloseWorker) or (isinstance(c, Send) and not isinstance(c.msg, m.ResultAck)):
                blocked.add(c.worker_id)
            later.append(c)
        waiting = [s for c in later if isinstance(c, Send | CloseWorker) and not isinstance(getattr(c, "msg", None), m.ResultAck)
                   and (s := self.sessions.get(c.worker_id)) is not None]
        for s in waiting:
            s.deferred += 1
        self.pending.append(Pending(records, later, confirms, waiting))

    def run_commands(self, cmds: list[Any]) -> None:
        for c in cmds:
            if isinstance(c, Send) and (s := self.sessions.get(c.worker_id)) is not None:
                s.to_worker.append((self.epoch, c.msg))
            elif isinstance(c, CloseWorker) and (s := self.sessions.get(c.worker_id)) is not None and s.sid == c.session_id:
                self.end_session(c.worker_id)

    def end_session(self, wid: str) -> None:
        """The connection is gone: the coordinator and the worker each learn it; in flight is lost."""
        s = self.sessions[wid]
        assert s is not None
        self.sessions[wid] = None
        self.execute(self.coord.disconnect(wid, s.sid, self.now))
        self.worker_apply(wid, self.workers[wid].state.session_ended())

    # ------------------------------------------------------------- the worker's shell

    def worker_apply(self, wid: str, out: list[ws.Instruction]) -> None:
        w = self.workers[wid]
        flush = False
        ended: list[int] = []
        for ins in out:
            if isinstance(ins, ws.Send):
                if isinstance(ins.msg, m.TakenBack):
                    w.dropped.update((r.task_id, r.attempt) for r in ins.msg.dropped)
                if (s := self.sessions[wid]) is not None:
                    s.to_coord.append(ins.msg)
            elif isinstance(ins, ws.Start):
                for a in ins.assignments:
                    key = (a.task_id, a.attempt, self.assign_epoch)
                    assert key not in self.started, f"{wid} starts {key} a second time"
                    assert (a.task_id, a.attempt) not in w.dropped, f"{wid} starts {key} after giving it back"
                    self.started.add(key)
                w.runs[ins.run] = Run(ins.assignments, self.assign_epoch)
            elif isinstance(ins, ws.Kill):
                run = w.runs.get(ins.run)
                if run is not None:
                    alive = [w.state.attempt(a.task_id, a.attempt) for a in run.assignments]
                    if any(r is not None and r.cancel_reason for r in alive):
                        run.cancelled = True  # reports "cancelled"
                    else:
                        del w.runs[ins.run]  # stopped without a report
                        ended.append(ins.run)
            elif isinstance(ins, ws.Keep):
                w.kept[(ins.result.task_id, ins.result.attempt)] = ins.result
            elif isinstance(ins, ws.Forget):
                for r in ins.refs:
                    w.kept.pop((r.task_id, r.attempt), None)
            elif isinstance(ins, ws.ResendKept):
                if w.kept and (s := self.sessions[wid]) is not None:
                    s.to_coord.append(m.Results(list(w.kept.values())))
            elif isinstance(ins, ws.RecordStarted):
                w.records.update((r.task_id, r.attempt) for r in ins.refs)
            elif isinstance(ins, ws.RecordFinished):
                w.records.difference_update((r.task_id, r.attempt) for r in ins.refs)
            elif isinstance(ins, ws.FlushSoon):
                flush = True
            elif isinstance(ins, ws.ArmHold):
                w.hold_armed = True
            elif isinstance(ins, ws.DisarmHold):
                w.hold_armed = False
            elif isinstance(ins, ws.Warn):
                pass  # the shell logs it
            else:
                raise AssertionError(f"unhandled instruction {ins!r}")
        for run in ended:  # the run's coroutine ends: its slot goes to the next queued run
            self.worker_apply(wid, w.state.run_ended(run))
        if flush:  # call_soon: after the current event, before the next frame is read
            self.worker_apply(wid, w.state.flush(self.now))

    assign_epoch = 0

    # ------------------------------------------------------------------- rules

    @initialize()
    def fleet_connects(self) -> None:
        for wid in FLEET:
            self.connect(wid)

    @rule(retries=st.integers(0, 2), n=st.integers(1, 4))
    def submit(self, retries: int, n: int) -> None:
        docs = []
        for _ in range(n):
            self.n_tasks += 1
            docs.append({"task_id": f"t{self.n_tasks}", "type": "custom", "config": {"name": "noop"},
                         "max_retries": retries})
        _, cmds = self.coord.submit(specs.parse_tasks(docs), self.now)
        self.execute(cmds)

    def pick(self, data: st.DataObject, ok: Any) -> str:
        """One of the workers for which ``ok(wid)`` holds (a precondition guarantees one does)."""
        return data.draw(st.sampled_from([w for w in sorted(FLEET) if ok(w)]))

    def has_to_worker(self, w: str) -> bool:
        return (s := self.sessions[w]) is not None and bool(s.to_worker)

    def has_to_coord(self, w: str) -> bool:
        return (s := self.sessions[w]) is not None and bool(s.to_coord)

    @precondition(lambda self: None in self.sessions.values())
    @rule(data=st.data())
    def reconnect(self, data: st.DataObject) -> None:
        self.connect(self.pick(data, lambda w: self.sessions[w] is None))

    def connect(self, wid: str) -> None:
        if self.sessions[wid] is not None:
            return
        w = self.workers[wid]
        s = Session(f"s{next(self.sids)}")
        self.sessions[wid] = s
        reg = m.Register(worker_id=wid, name=wid, protocol_version=m.PROTOCOL_VERSION, hardware={},
                         capabilities=["cpu"], tags=[], max_concurrent=int(FLEET[wid]["slots"]),  # type: ignore[call-overload]
                         running=w.state.running_refs(), finished=[m.TaskRef(*k) for k in w.kept],
                         abandoned=list(w.state.abandoned), pipeline_depth=int(FLEET[wid]["depth"]))  # type: ignore[call-overload]
        self.execute(self.coord.register(reg, s.sid, self.now, key_id=f"key-{wid}"))
        self.worker_apply(wid, w.state.registered())

    @precondition(lambda self: any(self.has_to_worker(w) for w in FLEET))
    @rule(data=st.data())
    def to_worker(self, data: st.DataObject) -> None:
        self.deliver_to_worker(self.pick(data, self.has_to_worker))

    def deliver_to_worker(self, wid: str) -> None:
        s = self.sessions[wid]
        if s is None or not s.to_worker:
            return
        epoch, msg = s.to_worker.popleft()
        st_ = self.workers[wid].state
        self.assign_epoch = epoch
        handlers = {m.AssignTasks: st_.assign, m.Confirm: lambda c: st_.confirm(c.upto), m.ResultAck: st_.ack,
                    m.Cancel: lambda c: st_.cancel(c, self.now), m.TakeBack: st_.take_back}
        self.worker_apply(wid, handlers[type(msg)](msg))  # type: ignore[operator]

    @precondition(lambda self: any(self.has_to_coord(w) for w in FLEET))
    @rule(data=st.data())
    def to_coordinator(self, data: st.DataObject) -> None:
        self.deliver_to_coordinator(self.pick(data, self.has_to_coord))

    def deliver_to_coordinator(self, wid: str) -> None:
        s = self.sessions[wid]
        if s is None or not s.to_coord:
            return
        msg = s.to_coord.popleft()
        named = [r.task_id for r in msg.results] if isinstance(msg, m.Results) else \
            [r.task_id for r in msg.tasks] if isinstance(msg, m.TaskStarted) else []
        rows = self.durable_rows()  # what the store would read back (coordinator/views.load_missing)
        self.coord.load(rows[t] for t in self.coord.missing(named) if t in rows)
        if isinstance(msg, m.Results):
            self.execute(self.coord.results(wid, msg, self.now))
        elif isinstance(msg, m.TaskStarted):
            self.execute(self.coord.started(wid, msg, self.now))
        elif isinstance(msg, m.TakenBack):
            stays = [r for r in msg.kept if (t := self.coord.tasks.get(r.task_id)) is not None
                     and t.state in ACTIVE and (t.attempt, t.worker_id) == (r.attempt, wid)]
            self.execute(self.coord.taken_back(wid, msg, self.now))
            for r in stays:  # a kept attempt had started: it is not given to anyone else
                t = self.coord.tasks[r.task_id]
                assert (t.attempt, t.worker_id) == (r.attempt, wid), (r, t.history)
        else:
            raise AssertionError(f"unexpected {msg!r}")

    @precondition(lambda self: self.pending)
    @rule()
    def fsync(self) -> None:
        p = self.pending.popleft()
        self.journal += p.records
        for s in p.waiting:
            s.deferred -= 1
        for wid, (s, upto) in p.confirms.items():
            if self.sessions.get(wid) is s:
                s.to_worker.append((self.epoch, m.Confirm(upto)))
        self.run_commands(p.rest)
        self.coord.retire(r.task_id for r in p.records if isinstance(r, TaskRow) and is_terminal(r.state))

    def durable_rows(self) -> dict[str, TaskRow]:
        return {r.task_id: r for r in self.journal if isinstance(r, TaskRow)}

    @precondition(lambda self: any(w.runs for w in self.workers.values()))
    @rule(data=st.data(), status=st.sampled_from(["succeeded", "failed", "retryable"]))
    def finish(self, data: st.DataObject, status: str) -> None:
        wid = self.pick(data, lambda w: bool(self.workers[w].runs))
        self.finish_run(wid, data.draw(st.sampled_from(sorted(self.workers[wid].runs))), status)

    def finish_run(self, wid: str, run_id: int, status: str) -> None:
        w = self.workers[wid]
        run = w.runs.pop(run_id)
        for a in run.assignments:
            final = "cancelled" if run.cancelled else ("error" if status == "retryable" else status)
            self.produced.add((a.task_id, a.attempt, wid, final))
            r = m.TaskResult(task_id=a.task_id, attempt=a.attempt, status=final,  # type: ignore[arg-type]
                             started_at=self.now, finished_at=self.now, output={"retryable": status == "retryable"})
            self.worker_apply(wid, w.state.finished(r))
        self.worker_apply(wid, w.state.run_ended(run_id))

    @precondition(lambda self: any(not r.announced for w in self.workers.values() for r in w.runs.values()))
    @rule(data=st.data())
    def started_delay_passes(self, data: st.DataObject) -> None:
        wid = self.pick(data, lambda w: any(not r.announced for r in self.workers[w].runs.values()))
        quiet = sorted(k for k, r in self.workers[wid].runs.items() if not r.announced)
        self.announce_run(wid, data.draw(st.sampled_from(quiet)))

    def announce_run(self, wid: str, run_id: int) -> None:
        w = self.workers[wid]
        run = w.runs[run_id]
        run.announced = True
        for a in run.assignments:
            self.worker_apply(wid, w.state.announce(m.TaskRef(a.task_id, a.attempt)))

    @precondition(lambda self: any(w.hold_armed for w in self.workers.values()))
    @rule(data=st.data())
    def hold_expires(self, data: st.DataObject) -> None:
        self.hold_ends(self.pick(data, lambda w: self.workers[w].hold_armed))

    def hold_ends(self, wid: str) -> None:
        w = self.workers[wid]
        if w.hold_armed:
            w.hold_armed = False
            self.worker_apply(wid, w.state.hold_expired(self.now))

    @precondition(lambda self: any(s is not None for s in self.sessions.values()))
    @rule(data=st.data())
    def disconnect(self, data: st.DataObject) -> None:
        self.end_session(self.pick(data, lambda w: self.sessions[w] is not None))

    @rule(wid=st.sampled_from(sorted(FLEET)))
    def kill_worker(self, wid: str) -> None:
        """The worker process dies: its runs and memory go; the outbox stays. At the restart the
        attempts recorded as running are reported as retryable errors with ``--recover``."""
        if self.sessions[wid] is not None:
            s = self.sessions[wid]
            assert s is not None
            self.sessions[wid] = None
            self.execute(self.coord.disconnect(wid, s.sid, self.now))
        old = self.workers[wid]
        fresh = fresh_worker(wid, kept=old.kept)
        if FLEET[wid]["recover"]:
            for task_id, attempt in sorted(old.records):
                self.produced.add((task_id, attempt, wid, "error"))
                fresh.kept[(task_id, attempt)] = m.TaskResult(
                    task_id=task_id, attempt=attempt, status="error", started_at=self.now, finished_at=self.now,
                    output={"retryable": True}, error="interrupted by a worker crash")
        self.workers[wid] = fresh

    @rule()
    def restart_coordinator(self) -> None:
        """The coordinator dies: what was not durable is gone, and every session with it."""
        self.pending.clear()
        for wid, s in self.sessions.items():
            if s is not None:
                self.sessions[wid] = None
                self.worker_apply(wid, self.workers[wid].state.session_ended())
        self.epoch += 1
        self.coord = CoordinatorState(POLICY)
        tasks = self.durable_rows()
        workers = {r.worker_id: r for r in self.journal if isinstance(r, WorkerRow)}
        active = sorted((r for r in tasks.values() if not is_terminal(r.state)), key=lambda r: r.seq)
        self.coord.restore(Snapshot(tasks=active, workers=list(workers.values()),
                                    max_seq=max((r.seq for r in tasks.values()), default=0)), self.now)

    @rule(dt=st.sampled_from([0.5, 2.0, 11.0, 31.0]), beat=st.booleans())
    def time_passes(self, dt: float, beat: bool) -> None:
        self.now += dt
        if beat:
            self.heartbeats()
        self.execute(self.coord.tick(self.now))

    def heartbeats(self) -> None:
        for wid, s in self.sessions.items():
            if s is not None:
                refs = self.workers[wid].state.running_refs()
                self.execute(self.coord.heartbeat(wid, m.Heartbeat("ready", refs, 1.0, 1.0, 0), self.now))

    # -------------------------------------------------------------- invariants

    @invariant()
    def outcomes_are_final_and_were_produced(self) -> None:
        """An outcome on disk never changes (one in memory only may be lost in a restart)."""
        for t in self.coord.tasks.values():
            if t.task_id in self.outcomes:
                assert is_terminal(t.state) and t.outcome == self.outcomes[t.task_id], (t.task_id, t.history)
            elif is_terminal(t.state) and "result from" in t.history[-1]["cause"]:
                o = t.outcome
                assert o is not None and (t.task_id, o["attempt"], o["worker_id"], o["status"]) in self.produced, (t.task_id, o)
        for r in self.journal[self.seen:]:
            if isinstance(r, TaskRow) and is_terminal(r.state):
                assert self.outcomes.setdefault(r.task_id, r.outcome or {}) == r.outcome, r.task_id
        self.seen = len(self.journal)

    @invariant()
    def the_current_attempt_runs_on_at_most_one_worker(self) -> None:
        for t in self.coord.tasks.values():
            if t.state not in ACTIVE:
                continue
            holders = [wid for wid, w in self.workers.items()
                       if any((a.task_id, a.attempt) == (t.task_id, t.attempt) and not r.cancelled
                              for r in w.runs.values() for a in r.assignments)]
            assert len(holders) <= 1, (t.task_id, t.attempt, holders)

    def teardown(self) -> None:
        """Everyone reconnects and the system settles: every task ends, every outbox empties."""
        for _ in range(60):
            for wid in FLEET:
                self.connect(wid)
            while self.pending or any(s is not None and (s.to_worker or s.to_coord) for s in self.sessions.values()):
                while self.pending:
                    self.fsync()
                for wid in FLEET:
                    while (s := self.sessions[wid]) is not None and (s.to_worker or s.to_coord):
                        self.deliver_to_worker(wid)
                        self.deliver_to_coordinator(wid)
            for wid, w in self.workers.items():
                for run_id, run in list(w.runs.items()):
                    if run_id in w.runs:
                        w.runs.pop(run_id)
                        for a in run.assignments:
                            status = "cancelled" if run.cancelled else "succeeded"
                            self.produced.add((a.task_id, a.attempt, wid, status))
                            r = m.TaskResult(task_id=a.task_id, attempt=a.attempt, status=status,  # type: ignore[arg-type]
                                             started_at=self.now, finished_at=self.now)
                            self.worker_apply(wid, w.state.finished(r))
                        self.worker_apply(wid, w.state.run_ended(run_id))
                self.hold_ends(wid)
            self.now += 2.0
            self.heartbeats()
            self.execute(self.coord.tick(self.now))
            self.outcomes_are_final_and_were_produced()
            settled = all(is_terminal(t.state) for t in self.coord.tasks.values())
            if settled and not self.pending and all(not w.kept and not w.runs for w in self.workers.values()):
                break
        open_tasks = {t.task_id: t.state for t in self.coord.tasks.values() if not is_terminal(t.state)}
        assert not open_tasks, f"tasks lost: {open_tasks}"
        assert all(not w.kept for w in self.workers.values()), {k: list(w.kept) for k, w in self.workers.items()}


WorkerCoordinatorMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
test_worker_and_coordinator_state_machines = WorkerCoordinatorMachine.TestCase


# ---------------------------------------------------------------- directed scenarios
# The paths the random search reaches only rarely within its budget, played step by step.

class _First:
    """Stands in for ``st.data()``: always draws the first choice."""

    def draw(self, strategy: Any) -> Any:
        return strategy.elements[0]


def _scenario() -> WorkerCoordinatorMachine:
    x = WorkerCoordinatorMachine()
    x.fleet_connects()
    x.submit(retries=0, n=1)
    x.to_worker(_First())  # the provisional assignment
    return x


def test_a_provisional_result_is_never_resent_after_the_coordinator_lost_its_assignment() -> None:
    x = _scenario()
    x.finish(_First(), "succeeded")  # its result is sent at once, before the confirm
    assert x.workers["w1"].kept == {}
    x.restart_coordinator()  # the submission and assignment were never durable
    x.teardown()  # a re-sent result would be refused here
    assert x.coord.tasks == {}


def test_a_confirmed_result_lost_in_a_disconnect_is_resent_and_makes_the_outcome() -> None:
    x = _scenario()
    x.finish(_First(), "succeeded")
    while x.pending:
        x.fsync()  # durable: the confirm goes out
    while x.has_to_worker("w1"):
        x.deliver_to_worker("w1")
    assert list(x.workers["w1"].kept) == [("t1", 1)]
    x.disconnect(_First())  # the results frame is lost
    x.teardown()
    outcome = x.durable_rows()["t1"].outcome  # durable, so it has left memory (finished_cache=0)
    assert "t1" not in x.coord.tasks and outcome is not None and outcome["status"] == "succeeded"


# ------------------------------------------------------------- pipelining, step by step
# w2 has one slot and a pipeline depth of 1: once a short result has opened its window, it holds
# one task ahead of its slot.

def _pump(x: WorkerCoordinatorMachine) -> None:
    """Every write durable and every message delivered, until nothing is in flight."""
    while x.pending or any(s is not None and (s.to_worker or s.to_coord) for s in x.sessions.values()):
        while x.pending:
            x.fsync()
        for wid in FLEET:
            while x.has_to_worker(wid) or x.has_to_coord(wid):
                x.deliver_to_worker(wid)
                x.deliver_to_coordinator(wid)


def _run_of(x: WorkerCoordinatorMachine, wid: str, task_id: str) -> int:
    (run_id,) = [k for k, r in x.workers[wid].runs.items() if any(a.task_id == task_id for a in r.assignments)]
    return run_id


def _finish(x: WorkerCoordinatorMachine, wid: str, task_id: str) -> None:
    x.finish_run(wid, _run_of(x, wid, task_id), "succeeded")


def _w2_holds_long_with_short_ahead() -> WorkerCoordinatorMachine:
    """w1 offline; w2 ran one short task (its window is open), then holds t2 (started: it ran past
    the started delay) in its slot and t3 ahead of it; everything durable and delivered."""
    x = WorkerCoordinatorMachine()
    x.fleet_connects()
    x.end_session("w1")
    x.submit(retries=0, n=1)
    _pump(x)
    _finish(x, "w2", "t1")
    _pump(x)
    assert x.coord.workers["w2"].view.window == 1
    x.submit(retries=0, n=2)
    _pump(x)
    w2 = x.workers["w2"].state
    assert [r.task_id for r in w2.running_refs()] == ["t2", "t3"] and len(w2.queued) == 1  # t3 waits for the slot
    assert "ahead of a free slot" in x.coord.tasks["t3"].history[-1]["cause"]
    x.announce_run("w2", _run_of(x, "w2", "t2"))
    _pump(x)
    assert x.coord.tasks["t2"].state == "running"
    return x


def test_a_task_waiting_behind_a_long_one_is_taken_back_for_an_idle_worker_as_a_new_attempt() -> None:
    x = _w2_holds_long_with_short_ahead()
    x.connect("w1")  # an idle worker: w2 is asked for t3 back, drops it, and t3 goes to w1
    _pump(x)
    t3 = x.coord.tasks["t3"]
    assert (t3.attempt, t3.worker_id) == (2, "w1") and x.workers["w2"].dropped == {("t3", 1)}
    assert any("taken back from w2 before it started" in h["cause"] for h in t3.history)
    _finish(x, "w1", "t3")
    _finish(x, "w2", "t2")
    _pump(x)
    rows = x.durable_rows()  # finished: on disk, out of memory
    assert {tid: (rows[tid].state, rows[tid].outcome["attempt"], rows[tid].outcome["worker_id"])  # type: ignore[index]
            for tid in ("t2", "t3")} == {"t2": ("succeeded", 1, "w2"), "t3": ("succeeded", 2, "w1")}
    assert rows["t3"].retries_used == 0
    x.teardown()


def test_a_task_that_started_before_the_take_back_arrived_stays_and_its_result_counts() -> None:
    x = _w2_holds_long_with_short_ahead()
    x.connect("w1")
    while x.pending:
        x.fsync()  # the take-back is on its way to w2 ...
    assert [type(msg) for _, msg in x.sessions["w2"].to_worker] == [m.TakeBack]  # type: ignore[union-attr]
    _finish(x, "w2", "t2")  # ... when t2 ends and t3 starts in its slot
    assert "t3" in {a.task_id for r in x.workers["w2"].runs.values() for a in r.assignments}
    _pump(x)  # w2 answers kept: t3 stays there, at attempt 1
    t3 = x.coord.tasks["t3"]
    assert (t3.attempt, t3.worker_id, t3.state) == (1, "w2", "assigned") and x.workers["w2"].dropped == set()
    _finish(x, "w2", "t3")
    _pump(x)
    outcome = x.durable_rows()["t3"].outcome
    assert outcome is not None and (outcome["attempt"], outcome["worker_id"]) == (1, "w2")
    assert not [s for s in x.started if s[0] == "t3" and s[1] != 1]  # it ran once, as attempt 1
    x.teardown()


def test_tasks_held_ahead_survive_a_coordinator_restart_and_are_still_taken_back() -> None:
    x = _w2_holds_long_with_short_ahead()
    x.restart_coordinator()  # the sessions end; w2 keeps t2 running and t3 queued (both confirmed)
    x.connect("w2")
    x.connect("w1")
    _pump(x)
    t3 = x.coord.tasks["t3"]
    assert (t3.attempt, t3.worker_id) == (2, "w1") and x.workers["w2"].dropped == {("t3", 1)}
    x.teardown()
    assert {tid: r.state for tid, r in x.durable_rows().items()} == {"t1": "succeeded", "t2": "succeeded",
                                                                     "t3": "succeeded"}


def test_tasks_held_ahead_are_kept_across_a_reconnect_and_requeued_when_the_worker_lost_them() -> None:
    x = _w2_holds_long_with_short_ahead()
    x.end_session("w2")
    x.connect("w2")  # re-announces t2 (running) and t3 (queued): both stay
    _pump(x)
    assert {tid: (t.worker_id, t.attempt) for tid, t in x.coord.tasks.items()} == {"t2": ("w2", 1), "t3": ("w2", 1)}
    x.kill_worker("w2")  # this time it loses both, found after the grace
    x.time_passes(11.0, beat=False)
    _pump(x)
    rows = x.durable_rows()
    assert rows["t2"].state == "error"  # it was running: lost (a retry; none left)
    assert (rows["t3"].state, rows["t3"].retries_used) == ("pending", 0)  # only queued there: requeued, no retry
    x.teardown()

