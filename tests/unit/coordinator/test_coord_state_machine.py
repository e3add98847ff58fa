"""Random event sequences against CoordinatorState, checking what must hold after every event.

A fake fleet of three workers follows the coordinator's commands (runs what it is assigned, obeys
cancels, reports results, drops off and comes back with or without its tasks) while hypothesis
interleaves submissions, cancels, heartbeats and the passage of time. After every step:

* no worker holds more tasks than ``max_concurrent``; no task sits on a worker lacking what it needs;
* no pending, runnable task is left waiting while an eligible worker has a free slot;
* a task's current attempt runs on at most one worker; terminal tasks stay terminal;
* every task's history is a legal chain of transitions, each with a cause.

A forging worker reports results for attempts it was never given (another worker's, a stale or
future attempt, a task not submitted yet): each is refused, acknowledged and never stored.

Two workers pipeline (``pipeline_depth``): once short results open their windows they hold tasks
ahead of their slots, and the coordinator asks for tasks back (``TakeBack``); the fake worker
answers each ask at a time hypothesis picks, dropping the attempt (it had not started) or keeping
it. A dropped attempt must move to a new attempt without a retry; a kept one must stay.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from distributed_testing.coordinator.core.commands import CloseWorker, Refused, Save, Send
from distributed_testing.coordinator.core.placement import pick_worker, unmet
from distributed_testing.coordinator.core.policy import Policy
from distributed_testing.coordinator.core.rows import ResultRow
from distributed_testing.coordinator.core.state import CoordinatorState
from distributed_testing.protocol import messages as m
from distributed_testing.retry import Backoff
from distributed_testing.tasks import spec as specs
from distributed_testing.tasks.states import ACTIVE, check_transition, is_terminal

FLEET: dict[str, dict[str, Any]] = {
    "cpu": {"caps": ["cpu"], "tags": [], "slots": 1, "depth": 2},
    "gpu": {"caps": ["cpu", "cuda"], "tags": [], "slots": 2, "depth": 0},
    "tagged": {"caps": ["cpu"], "tags": ["x"], "slots": 2, "depth": 1},
}
POLICY = Policy(
    worker_grace_s=10.0, worker_ttl_s=30.0, retry_backoff=Backoff(base_s=1.0, factor=2.0, max_s=8.0, jitter=0.0)
)


class CoordinatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = CoordinatorState(POLICY)
        self.now = 1000.0
        self.n_tasks = 0
        self.n_sessions = 0
        self.session: dict[str, str | None] = {w: None for w in FLEET}
        # What each fake worker is actually running: (task_id, attempt) -> cancel requested?
        self.running: dict[str, dict[tuple[str, int], bool]] = {w: {} for w in FLEET}
        self.terminal: dict[str, str] = {}
        self.given: set[tuple[str, str, int]] = set()  # (worker, task, attempt) ever assigned
        self.asked: dict[str, list[m.TaskRef]] = {w: [] for w in FLEET}  # take-backs not answered yet
        self.announced: set[tuple[str, str, int]] = set()  # (worker, task, attempt) told as started

    # ------------------------------------------------------------ command execution

    def execute(self, cmds: list[Any]) -> None:
        for c in cmds:
            if isinstance(c, Send) and self.session.get(c.worker_id):
                if isinstance(c.msg, m.AssignTasks):
                    for a in c.msg.tasks:
                        assert (a.task_id, a.attempt) not in self.running[c.worker_id], "assigned twice"
                        self.given.add((c.worker_id, a.task_id, a.attempt))
                        self.running[c.worker_id][(a.task_id, a.attempt)] = False
                elif isinstance(c.msg, m.TakeBack):
                    self.asked[c.worker_id] += c.msg.tasks
                elif isinstance(c.msg, m.Cancel):
                    ref = (c.msg.task.task_id, c.msg.task.attempt)
                    if ref in self.running[c.worker_id]:
                        self.running[c.worker_id][ref] = True
            elif isinstance(c, CloseWorker) and self.session.get(c.worker_id) == c.session_id:
                self.execute(self.state.disconnect(c.worker_id, c.session_id, self.now))
                self.session[c.worker_id] = None
                self.asked[c.worker_id] = []

    # ------------------------------------------------------------ rules

    @rule(
        priority=st.integers(-2, 2),
        hardware=st.sampled_from([[], ["cpu"], ["cuda"], ["rocm"]]),
        tags=st.sampled_from([[], ["x"]]),
        retries=st.integers(0, 2),
    )
    def submit(self, priority: int, hardware: list[str], tags: list[str], retries: int) -> None:
        self.n_tasks += 1
        doc = {
            "task_id": f"t{self.n_tasks}",
            "type": "custom",
            "config": {"name": "noop"},
            "priority": priority,
            "max_retries": retries,
            "requirements": {"hardware": hardware, "tags": tags},
        }
        _, cmds = self.state.submit(specs.parse_tasks(doc), self.now)
        self.execute(cmds)

    @initialize(warm=st.booleans())
    def fleet_connects(self, warm: bool) -> None:
        """Every worker connected; with ``warm``, each ran one short task (its window is open)."""
        for wid in FLEET:
            self.connect(wid, keep=True)
        if warm:
            for wid in FLEET:
                self.burst(len(FLEET) * 2)
                for key in list(self.running[wid]):
                    r = m.TaskResult(task_id=key[0], attempt=key[1], status="succeeded", started_at=self.now,
                                     finished_at=self.now)
                    del self.running[wid][key]
                    self.execute(self.state.results(wid, m.Results([r]), self.now))

    @rule(n=st.integers(2, 8))
    def burst(self, n: int) -> None:
        """More plain tasks at once than the fleet has slots: room for pipelining."""
        docs = []
        for _ in range(n):
            self.n_tasks += 1
            docs.append({"task_id": f"t{self.n_tasks}", "type": "custom", "config": {"name": "noop"}})
        _, cmds = self.state.submit(specs.parse_tasks(docs), self.now)
        self.execute(cmds)

    @rule(wid=st.sampled_from(sorted(FLEET)), keep=st.booleans())
    def connect(self, wid: str, keep: bool) -> None:
        """(Re)connect; ``keep`` False models a restarted worker that lost its children."""
        if not keep:
            self.running[wid].clear()
        self.n_sessions += 1
        sid = f"s{self.n_sessions}"
        self.session[wid] = sid
        f = FLEET[wid]
        reg = m.Register(
            worker_id=wid,
            name=wid,
            protocol_version=1,
            hardware={},
            capabilities=f["caps"],
            tags=f["tags"],
            max_concurrent=f["slots"],
            memory_gb=8.0,
            running=[m.TaskRef(t, a) for t, a in self.running[wid]],
            pipeline_depth=f["depth"],
        )
        self.asked[wid] = []  # asked of the old session: that answer never comes
        self.execute(self.state.register(reg, sid, self.now, key_id=f"key-{wid}"))

    @rule(wid=st.sampled_from(sorted(FLEET)))
    def disconnect(self, wid: str) -> None:
        sid = self.session[wid]
        if sid is not None:
            self.execute(self.state.disconnect(wid, sid, self.now))
            self.session[wid] = None
            self.asked[wid] = []

    @precondition(lambda self: any(self.asked.values()))
    @rule(data=st.data(), drop=st.booleans())
    def answer_take_back(self, data: st.DataObject, drop: bool) -> None:
        """The worker answers its oldest take-back: dropped (it had not started; it never will
        there) or kept (it had started: it stays there and its result counts)."""
        wid = data.draw(st.sampled_from([w for w in sorted(FLEET) if self.asked[w]]))
        ref = self.asked[wid].pop(0)
        key = (ref.task_id, ref.attempt)
        dropped = (drop and key in self.running[wid] and not self.running[wid][key]
                   and (wid, *key) not in self.announced)  # a worker never drops what it said had started
        if dropped:
            del self.running[wid][key]
        t = self.state.tasks[ref.task_id]
        before = (t.state, t.attempt, t.worker_id, t.retries_used)
        msg = m.TakenBack(dropped=[ref] if dropped else [], kept=[] if dropped else [ref])
        cmds = self.state.taken_back(wid, msg, self.now)
        assert not [c for c in cmds if isinstance(c, Refused)], cmds
        if not dropped and before[0] in ACTIVE and before[1:3] == (ref.attempt, wid):
            assert (t.attempt, t.worker_id) == (ref.attempt, wid), t.history  # kept: it stays
        if dropped and before[0] in ACTIVE and before[1:3] == (ref.attempt, wid):
            assert t.attempt != ref.attempt or t.state == "pending", t.history  # moved, as a new attempt
            assert t.retries_used == before[3]  # at no retry cost
        self.execute(cmds)

    @rule(wid=st.sampled_from(sorted(FLEET)))
    def start(self, wid: str) -> None:
        if self.session[wid] and self.running[wid]:
            # a worker runs its slots' worth, oldest first; the rest wait in its queue, unstarted
            first = list(self.running[wid])[: FLEET[wid]["slots"]]
            refs = [m.TaskRef(t, a) for t, a in first]
            self.announced.update((wid, t, a) for t, a in first)
            self.execute(self.state.started(wid, m.TaskStarted(refs, self.now), self.now))

    @rule(
        wid=st.sampled_from(sorted(FLEET)),
        data=st.data(),
        status=st.sampled_from(["succeeded", "failed", "timed_out", "error", "retryable"]),
    )
    def finish(self, wid: str, data: st.DataObject, status: str) -> None:
        if not self.session[wid] or not self.running[wid]:
            return
        ref = data.draw(st.sampled_from(sorted(self.running[wid])))
        cancelled = self.running[wid].pop(ref)
        retryable = status == "retryable"
        final = "cancelled" if cancelled else ("error" if retryable else status)
        r = m.TaskResult(
            task_id=ref[0],
            attempt=ref[1],
            status=final,
            started_at=self.now,  # type: ignore[arg-type]
            finished_at=self.now,
            output={"retryable": retryable},
        )
        self.execute(self.state.results(wid, m.Results([r]), self.now))

    @rule(wid=st.sampled_from(sorted(FLEET)))
    def finish_all(self, wid: str) -> None:
        """``wid`` finishes everything it holds: it goes idle (a take-back may come its way)."""
        while self.session[wid] and self.running[wid]:
            (task_id, attempt), cancelled = next(iter(self.running[wid].items()))
            del self.running[wid][(task_id, attempt)]
            r = m.TaskResult(task_id=task_id, attempt=attempt, status="cancelled" if cancelled else "succeeded",
                             started_at=self.now, finished_at=self.now)
            self.execute(self.state.results(wid, m.Results([r]), self.now))

    @rule(wid=st.sampled_from(sorted(FLEET)), n=st.integers(1, 4), attempt=st.integers(0, 3),
          status=st.sampled_from(["succeeded", "failed"]))
    def forge(self, wid: str, n: int, attempt: int, status: str) -> None:
        """``wid`` reports on an attempt it was never given; it may even be a task not yet submitted."""
        tid = f"t{self.n_tasks + n - 2}" if self.n_tasks + n - 2 > 0 else "t1"
        if not self.session[wid] or (wid, tid, attempt) in self.given:
            return
        t = self.state.tasks.get(tid)
        before = None if t is None else (t.state, t.attempt, t.worker_id, t.outcome, len(t.history))
        r = m.TaskResult(task_id=tid, attempt=attempt, status=status, started_at=self.now,  # type: ignore[arg-type]
                         finished_at=self.now)
        cmds = self.state.results(wid, m.Results([r]), self.now)
        assert [(c.worker_id, c.task) for c in cmds if isinstance(c, Refused)] == [(wid, m.TaskRef(tid, attempt))]
        assert not [c for c in cmds if isinstance(c, Save) and isinstance(c.record, ResultRow)]
        assert m.ResultAck([m.TaskRef(tid, attempt)]) in [c.msg for c in cmds if isinstance(c, Send)]
        after = None if t is None else (t.state, t.attempt, t.worker_id, t.outcome, len(t.history))
        assert before == after
        self.execute(cmds)

    @precondition(lambda self: self.n_tasks > 0)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        tid = f"t{data.draw(st.integers(1, self.n_tasks))}"
        self.execute(self.state.cancel(tid, self.now))

    @rule(wid=st.sampled_from(sorted(FLEET)), health=st.sampled_from(["ready", "constrained", "draining"]))
    def heartbeat(self, wid: str, health: str) -> None:
        if self.session[wid]:
            refs = [m.TaskRef(t, a) for t, a in self.running[wid]]
            hb = m.Heartbeat(health, refs, 10.0, 10.0, 0)  # type: ignore[arg-type]
            self.execute(self.state.heartbeat(wid, hb, self.now))

    @rule(dt=st.sampled_from([0.5, 1.0, 5.0, 10.0, 31.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self.execute(self.state.tick(self.now))

    # ------------------------------------------------------------ invariants

    @invariant()
    def slots_and_requirements(self) -> None:
        for w in self.state.workers.values():
            if w.connected:
                assert len(w.view.running) <= w.view.max_concurrent + w.pace.limit, (w.worker_id, w.view.running)
        for t in self.state.tasks.values():
            if t.state in ACTIVE:
                assert t.worker_id is not None
                assert unmet(t.key, self.state.workers[t.worker_id].view) == [], (t.task_id, t.worker_id)

    @invariant()
    def no_idle_capacity_while_runnable_work_waits(self) -> None:
        free = [w.view for w in self.state.workers.values() if w.connected and w.view.free_slots > 0]
        for t in self.state.tasks.values():
            if t.state == "pending" and not t.not_before:
                w = pick_worker(t.key, free)
                assert w is None, f"{t.task_id} pending while {w.worker_id} could run it"

    @invariant()
    def current_attempt_runs_at_most_once(self) -> None:
        for t in self.state.tasks.values():
            holders = [
                w
                for w in FLEET
                if self.session[w]
                and (t.task_id, t.attempt) in self.running[w]
                and not self.running[w][(t.task_id, t.attempt)]
            ]
            if t.state in ACTIVE:
                assert len(holders) <= 1, (t.task_id, holders)

    @invariant()
    def terminal_is_final_and_history_explains_state(self) -> None:
        for t in self.state.tasks.values():
            if t.task_id in self.terminal:
                assert t.state == self.terminal[t.task_id]
            elif is_terminal(t.state):
                self.terminal[t.task_id] = t.state
                assert t.outcome is not None and t.outcome["status"] == t.state
            h = t.history
            assert h[0]["to"] == "pending" and h[-1]["to"] == t.state
            for prev, cur in zip(h, h[1:], strict=False):
                assert cur["from"] == prev["to"] and cur["cause"]
                check_transition(t.task_id, cur["from"], cur["to"], cur["cause"])


CoordinatorMachine.TestCase.settings = settings(
    max_examples=20, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_coordinator_state_machine = CoordinatorMachine.TestCase


class _First:
    """Stands in for ``st.data()``: always draws the first choice."""

    def draw(self, strategy: Any) -> Any:
        return strategy.elements[0]


def test_take_backs_answered_both_ways_keep_every_invariant() -> None:
    """The path the random search reaches only rarely: two workers stuck behind started tasks with
    tasks held ahead, a third goes idle; one holder drops its task, the other keeps its own."""
    x = CoordinatorMachine()
    x.fleet_connects(warm=True)
    x.burst(6)
    for wid in FLEET:
        x.start(wid)
    x.finish_all("gpu")
    asked = {w: list(refs) for w, refs in x.asked.items() if refs}
    assert set(asked) == {"cpu", "tagged"}, asked
    (dropped,), (kept,) = asked["cpu"], asked["tagged"]
    x.answer_take_back(_First(), drop=True)  # cpu's: it had not started
    x.answer_take_back(_First(), drop=False)  # tagged's: it had
    t = x.state.tasks[dropped.task_id]
    assert (t.attempt, t.worker_id) == (dropped.attempt + 1, "gpu") and t.retries_used == 0
    assert (x.state.tasks[kept.task_id].attempt, x.state.tasks[kept.task_id].worker_id) == (kept.attempt, "tagged")
    for check in (x.slots_and_requirements, x.no_idle_capacity_while_runnable_work_waits,
                  x.current_attempt_runs_at_most_once, x.terminal_is_final_and_history_explains_state):
        check()
    for wid in FLEET:
        x.finish_all(wid)
    assert all(is_terminal(t.state) for t in x.state.tasks.values())
