"""Pipelining in the pure scheduler (``coordinator/core/pipeline.py`` and ``core/state.py``): a worker that
registers a ``pipeline_depth`` is sent short tasks ahead of its slots, as many as the durations
it reports allow; nothing is queued behind a long or exclusive task, and a task waiting behind
one is taken back for an idle worker, moving as a new attempt only once the worker says it never
started it."""

from __future__ import annotations

from typing import Any

import pytest
from sim_support import T0, Sim, sent

from distributed_testing.coordinator.core.commands import Refused
from distributed_testing.coordinator.core.pipeline import Pace
from distributed_testing.coordinator.core.policy import Policy
from distributed_testing.coordinator.core.rows import ResultRow
from distributed_testing.protocol import messages as m
from distributed_testing.tasks import spec as specs

BUDGET = 0.02


def custom(task_id: str, seconds: float | None = None) -> specs.TaskSpec:
    config: dict[str, Any] = {"name": "noop"} if seconds is None else {"name": "sleep", "parameters": {"seconds": seconds}}
    return specs.parse_tasks({"task_id": task_id, "type": "custom", "config": config})[0]


def bench(task_id: str) -> specs.TaskSpec:
    return specs.parse_tasks({"task_id": task_id, "type": "benchmark", "config": {"model": "mlp"}})[0]


def worker(sim: Sim, wid: str, *, depth: int = 8, slots: int = 1) -> None:
    sim.register(m.Register(worker_id=wid, name=wid, protocol_version=m.PROTOCOL_VERSION, hardware={},
                            capabilities=["cpu"], tags=[], max_concurrent=slots, pipeline_depth=depth))


def assigned(cmds: list[Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for wid, msg in sent(cmds, m.AssignTasks):
        out.setdefault(wid, []).extend(a.task_id for a in msg.tasks)
    return out


def finish(sim: Sim, wid: str, task_id: str, duration_s: float = 0.001, now: float = T0) -> list[Any]:
    t = sim.task(task_id)
    r = m.TaskResult(task_id=task_id, attempt=t.attempt, status="succeeded", started_at=now - duration_s,
                     finished_at=now)
    return sim.results(wid, m.Results([r]), now)


@pytest.fixture
def sim() -> Sim:
    return Sim(Policy(pipeline_budget_s=BUDGET, batch_wait_s=0.0))


def test_the_window_grows_for_short_tasks_and_closes_for_long_ones() -> None:
    p = Pace(limit=16)
    assert p.target(BUDGET) == 0  # nothing observed yet: nothing ahead
    assert [p.observe(0.0005, BUDGET) for _ in range(6)] == [1, 2, 4, 8, 16, 16]  # slow start up to the limit
    assert p.observe(2.0, BUDGET) == 0  # one long task closes it at once
    widths = [p.observe(0.001, BUDGET) for _ in range(40)]
    assert widths[0] == 0 and widths[-1] == 16 and widths == sorted(widths)  # short ones reopen it, gradually
    assert Pace(limit=0).observe(0.0, BUDGET) == 0  # --pipeline-depth 0: never
    mid = Pace(limit=16)
    for _ in range(10):
        mid.observe(0.005, BUDGET)
    assert mid.window == 4  # 20 ms of queued work at most: 4 tasks of 5 ms


def test_short_results_open_the_window_and_long_ones_close_it(sim: Sim) -> None:
    worker(sim, "w", depth=4)
    _, cmds = sim.submit(*[custom(f"t{i}") for i in range(12)])
    assert assigned(cmds) == {"w": ["t0"]}  # no duration known yet: one task, no window
    cmds = finish(sim, "w", "t0")
    assert assigned(cmds) == {"w": ["t1", "t2"]}  # window 1: a slot and one ahead
    assert "ahead of a free slot" in sim.task("t2").history[-1]["cause"]
    assert assigned(finish(sim, "w", "t1")) == {"w": ["t3", "t4"]}  # window 2: t2 in the slot, two ahead
    cmds = finish(sim, "w", "t2")
    assert assigned(cmds) == {"w": ["t5", "t6", "t7"]} and sim.state.workers["w"].view.window == 4
    held = sorted(sim.running("w"))
    cmds = finish(sim, "w", held[0], duration_s=2.0)  # a long one: the window shuts
    assert sim.state.workers["w"].view.window == 0 and assigned(cmds) == {}  # the others still hold the slot
    for tid in held[1:]:
        cmds = finish(sim, "w", tid, duration_s=2.0)
    assert assigned(cmds) == {"w": [assigned(cmds)["w"][0]]} and len(sim.running("w")) == 1  # one at a time again


def test_with_pipeline_depth_zero_a_worker_only_ever_holds_its_slots(sim: Sim) -> None:
    worker(sim, "w", depth=0, slots=2)
    sim.submit(*[custom(f"t{i}") for i in range(10)])
    for _ in range(8):
        held = sorted(sim.running("w"))
        assert len(held) == 2
        finish(sim, "w", held[0])
    assert sim.state.workers["w"].view.window == 0


def warm(sim: Sim, wid: str, n: int = 4) -> None:
    """Run ``n`` short tasks on ``wid`` alone so its window is open."""
    for i in range(n):
        _, cmds = sim.submit(custom(f"warm-{wid}-{i}"))
        (tid,) = assigned(cmds)[wid]
        finish(sim, wid, tid)
    assert sim.state.workers[wid].view.window > 0


def test_nothing_is_queued_behind_a_benchmark_and_a_benchmark_never_waits_behind_anything(sim: Sim) -> None:
    worker(sim, "w", depth=8)
    warm(sim, "w")
    _, cmds = sim.submit(bench("b"), custom("c1"), custom("c2"))
    assert assigned(cmds) == {"w": ["b"]}  # the benchmark has the worker to itself: nothing ahead of it
    cmds = finish(sim, "w", "b", duration_s=0.001)
    got = assigned(cmds)["w"]
    assert got == ["c1", "c2"]  # custom tasks again, one ahead
    _, cmds = sim.submit(bench("b2"))
    assert assigned(cmds) == {}  # a benchmark goes only to a free slot, never ahead
    finish(sim, "w", "c1")
    assert sim.running("w") == {"c2"}
    cmds = finish(sim, "w", "c2")
    assert assigned(cmds) == {"w": ["b2"]} and sim.running("w") == {"b2"}


def test_a_started_task_stops_more_from_being_queued_behind_it(sim: Sim) -> None:
    worker(sim, "w", depth=8)
    warm(sim, "w")
    _, cmds = sim.submit(custom("long", 30), custom("s1"))
    assert assigned(cmds) == {"w": ["long", "s1"]}
    sim.started("w", "long", 1)  # it ran past the worker's started delay
    _, cmds = sim.submit(custom("s2"))
    assert assigned(cmds) == {} and sim.state.workers["w"].view.ahead_room == 0


def test_a_task_waiting_behind_a_long_one_is_taken_back_for_an_idle_worker(sim: Sim) -> None:
    worker(sim, "a")
    warm(sim, "a")
    _, cmds = sim.submit(custom("long", 30), custom("s1"), custom("s2"))
    assert assigned(cmds) == {"a": ["long", "s1", "s2"]}
    cmds = sim.started("a", "long", 1)
    assert sent(cmds, m.TakeBack) == []  # nobody idle to give them to
    cmds = sim.run(sim.state.register(m.Register(worker_id="b", name="b", protocol_version=m.PROTOCOL_VERSION,
                                                 hardware={}, capabilities=["cpu"], tags=[], max_concurrent=1,
                                                 pipeline_depth=8), "sb", T0, key_id="key-b"))
    assert sent(cmds, m.TakeBack) == [("a", m.TakeBack([m.TaskRef("s1", 1)]))]  # one per idle slot, oldest first
    assert sent(sim.tick(T0 + 0.5), m.TakeBack) == []  # asked already: not again
    cmds = sim.run(sim.state.taken_back("a", m.TakenBack(dropped=[m.TaskRef("s1", 1)], kept=[]), T0 + 1))
    s1 = sim.task("s1")
    assert assigned(cmds) == {"b": ["s1"]} and (s1.attempt, s1.worker_id, s1.retries_used) == (2, "b", 0)
    assert "taken back from a before it started" in s1.history[-2]["cause"]
    assert sim.running("a") == {"long", "s2"}
    cmds = finish(sim, "b", "s1", now=T0 + 2)  # b idle again: s2 is asked for next
    assert sent(cmds, m.TakeBack) == [("a", m.TakeBack([m.TaskRef("s2", 1)]))]


def test_a_task_that_started_before_the_take_back_arrived_stays_and_its_result_counts(sim: Sim) -> None:
    worker(sim, "a")
    warm(sim, "a")
    sim.submit(custom("long", 30), custom("s1"))
    sim.started("a", "long", 1)
    worker(sim, "b")
    worker(sim, "b")  # (re-registering changes nothing here)
    # "long" ended and s1 started on a before the take-back reached it: a keeps it
    finish(sim, "a", "long", duration_s=30, now=T0 + 30)
    cmds = sim.run(sim.state.taken_back("a", m.TakenBack(dropped=[], kept=[m.TaskRef("s1", 1)]), T0 + 30))
    s1 = sim.task("s1")
    assert (s1.attempt, s1.worker_id) == (1, "a") and assigned(cmds) == {}
    cmds = finish(sim, "a", "s1", now=T0 + 31)
    assert s1.state == "succeeded" and s1.outcome is not None and s1.outcome["worker_id"] == "a"
    assert [r.attempt for r in sim.journal if isinstance(r, ResultRow) and r.task_id == "s1"] == [1]


def test_a_drop_nobody_asked_for_is_refused_and_changes_nothing(sim: Sim) -> None:
    worker(sim, "a")
    warm(sim, "a")
    sim.submit(custom("x"), custom("y"))
    cmds = sim.run(sim.state.taken_back("a", m.TakenBack(dropped=[m.TaskRef("y", 1)], kept=[]), T0))
    assert [(c.what, c.task) for c in cmds if isinstance(c, Refused)] == [("taken_back", m.TaskRef("y", 1))]
    assert (sim.task("y").state, sim.task("y").worker_id, sim.task("y").attempt) == ("assigned", "a", 1)
    worker(sim, "b")  # b's drop of a's task is refused too
    cmds = sim.run(sim.state.taken_back("b", m.TakenBack(dropped=[m.TaskRef("y", 1)], kept=[]), T0))
    assert [c.what for c in cmds if isinstance(c, Refused)] == ["taken_back"] and sim.task("y").worker_id == "a"


def test_a_take_back_pending_when_the_session_ends_is_forgotten(sim: Sim) -> None:
    worker(sim, "a")
    warm(sim, "a")
    sim.submit(custom("long", 30), custom("s1"))
    sim.started("a", "long", 1)
    worker(sim, "b")
    assert sim.state.take_backs.asked  # asked of a
    sim.disconnect("a", T0)
    assert not sim.state.take_backs.asked
    cmds = sim.run(sim.state.taken_back("a", m.TakenBack(dropped=[m.TaskRef("s1", 1)], kept=[]), T0))
    assert [c.what for c in cmds if isinstance(c, Refused)] == ["taken_back"]  # an answer from an old session
    assert sim.task("s1").worker_id == "a"


def test_a_cancelled_task_being_taken_back_is_not_requeued(sim: Sim) -> None:
    worker(sim, "a")
    warm(sim, "a")
    sim.submit(custom("long", 30), custom("s1"))
    sim.started("a", "long", 1)
    worker(sim, "b")
    sim.cancel("s1")
    cmds = sim.run(sim.state.taken_back("a", m.TakenBack(dropped=[m.TaskRef("s1", 1)], kept=[]), T0))
    assert sim.task("s1").state == "cancelled" and assigned(cmds) == {}


def test_tasks_held_ahead_by_a_worker_that_turns_constrained_are_taken_back_for_an_idle_one(sim: Sim) -> None:
    worker(sim, "a")
    warm(sim, "a")
    sim.submit(custom("s0"), custom("s1"), custom("s2"))
    assert sim.running("a") == {"s0", "s1", "s2"}
    worker(sim, "b")  # idle, but a is not stuck: its tasks are short and it takes work
    assert not sim.state.take_backs.asked
    cmds = sim.heartbeat("a", "constrained", reason="memory 91% > limit 75%")
    assert sent(cmds, m.TakeBack) == [("a", m.TakeBack([m.TaskRef("s1", 1)]))]  # oldest waiting first



def test_a_lost_worker_costs_its_waiting_tasks_no_retry_but_its_running_one_ends_as_before(sim: Sim) -> None:
    worker(sim, "w", depth=8)
    warm(sim, "w")
    _, cmds = sim.submit(custom("long", 30), custom("s1"), custom("s2"))  # max_retries 0 (the default)
    assert assigned(cmds) == {"w": ["long", "s1", "s2"]}
    sim.started("w", "long", 1)
    sim.disconnect("w", T0 + 1)
    sim.tick(T0 + 1 + sim.state.policy.worker_grace_s + 1)  # no reconnect within the grace: lost
    assert sim.task("long").state == "error"  # it was running there: lost, as without pipelining
    for tid in ("s1", "s2"):  # they only waited ahead of its slot: requeued once, no retry used
        t = sim.task(tid)
        assert t.state == "pending" and t.retries_used == 0, (tid, t.state, t.history[-1])
        assert "requeued without a retry" in t.history[-1]["cause"]
    worker(sim, "w2", depth=8)  # a new session's window starts shut: s1 in its slot, s2 waits here
    assert (sim.task("s1").state, sim.task("s2").state) == ("assigned", "pending")
    sim.disconnect("w2", T0 + 20)
    sim.tick(T0 + 20 + sim.state.policy.worker_grace_s + 1)
    assert sim.task("s1").state == "error"  # in a slot this time: lost as any running task
