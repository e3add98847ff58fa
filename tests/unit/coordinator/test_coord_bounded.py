"""Memory bounded by active work: finished tasks leave the state machine once their terminal record
is durable (beyond a small cache), and every event that names one is answered as before once its
row is read back from the store (``load``). ``Sim`` retires what each call finished at once, as
the runtime does when the records are durable; ``sim.task`` and ``sim.stored`` read the journal
as a store would."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from sim_support import T0, Sim, saved, sent

from distributed_testing.coordinator.core.commands import Notify, Refused
from distributed_testing.coordinator.core.policy import Policy
from distributed_testing.coordinator.core.rows import ResultRow, Snapshot, TaskRow
from distributed_testing.coordinator.core.state import CoordinatorState
from distributed_testing.errors import Conflict
from distributed_testing.protocol import messages as m
from distributed_testing.retry import Backoff
from distributed_testing.tasks import spec as specs

CACHE = 2
POLICY = Policy(worker_grace_s=10.0, worker_ttl_s=30.0, finished_cache=CACHE,
                retry_backoff=Backoff(base_s=0.5, factor=2.0, max_s=30.0, jitter=0.0))


def spec(task_id: str, name: str = "noop", **extra: Any) -> specs.TaskSpec:
    return specs.parse_tasks({"task_id": task_id, "type": "custom", "config": {"name": name}, **extra})[0]


def register(worker_id: str, slots: int = 1, **extra: Any) -> m.Register:
    return m.Register(worker_id=worker_id, name=worker_id, protocol_version=m.PROTOCOL_VERSION, hardware={},
                      capabilities=["cpu"], tags=[], max_concurrent=slots, **extra)


def result(task_id: str, attempt: int = 1, status: str = "succeeded") -> m.Results:
    return m.Results([m.TaskResult(task_id, attempt, status, T0, T0 + 1)])  # type: ignore[arg-type]


def run_all(sim: Sim, ids: list[str], worker: str = "w1") -> None:
    """Submit ``ids`` and let ``worker`` (one slot) run each to success in turn."""
    sim.submit(*(spec(t) for t in ids))
    sim.register(register(worker))
    for i, tid in enumerate(ids):
        sim.results(worker, result(tid), now=T0 + i + 1)


@pytest.fixture
def sim() -> Sim:
    return Sim(POLICY)


def test_finished_tasks_leave_memory_beyond_the_cache_and_counts_stay_whole(sim: Sim) -> None:
    run_all(sim, ["a", "b", "c", "d", "e"])
    sim.submit(spec("pending-1"), now=T0 + 10)
    assert set(sim.state.tasks) == {"d", "e", "pending-1"}  # the active one and the newest two finished
    assert sim.state.cached_finished == CACHE
    assert sim.state.missing(["a", "d", "pending-1", "zzz"]) == ["a", "zzz"]
    assert {k: v for k, v in sim.state.counts.items() if v} == {"succeeded": 5, "assigned": 1}


def test_a_finished_task_stays_until_its_record_is_durable() -> None:
    st = CoordinatorState(POLICY)
    st.submit([spec(t) for t in "abcd"], T0)
    st.register(register("w1", slots=4), "s1", T0, key_id="k")
    for t in "abcd":
        st.results("w1", result(t), T0 + 1)  # outcomes in memory, records not durable yet
    assert set(st.tasks) == set("abcd") and st.cached_finished == 0
    st.retire(["a", "b", "nope"])
    assert set(st.tasks) == set("abcd")  # within the cache
    st.retire(["c"])
    assert set(st.tasks) == set("bcd")  # the oldest retired left; d is not durable yet, so it stays
    st.retire(["d"])
    assert set(st.tasks) == set("cd")


def test_an_active_task_is_never_retired() -> None:
    st = CoordinatorState(Policy(finished_cache=0))
    st.submit([spec("a")], T0)
    st.retire(["a"])
    assert set(st.tasks) == {"a"}


def test_a_resubmission_of_a_task_that_left_memory_is_answered_as_before(sim: Sim) -> None:
    run_all(sim, ["a", "b", "c"])
    assert sim.state.missing(["a"]) == ["a"]
    sim.state.load(sim.stored(["a"]))  # what the submit path reads from the store first
    accepted, cmds = sim.submit(spec("a"), now=T0 + 20)
    assert accepted == [{"task_id": "a", "created": False, "state": "succeeded"}] and saved(cmds, TaskRow) == []
    assert sim.state.counts["succeeded"] == 3 and sim.state.counts["pending"] == 0
    run_all_again = [spec("b", name="other")]
    sim.state.load(sim.stored(["b"]))
    with pytest.raises(Conflict, match="different body"):
        sim.state.submit(run_all_again, T0 + 21)


def test_a_resent_result_of_a_task_that_left_memory_is_acknowledged_not_refused(sim: Sim) -> None:
    run_all(sim, ["a", "b", "c"])
    sim.state.load(sim.stored(sim.state.missing(["a"])))  # what the WebSocket reader reads first
    cmds = sim.results("w1", result("a"), now=T0 + 30)
    assert not [c for c in cmds if isinstance(c, Refused | Notify)]
    assert [msg.tasks for _, msg in sent(cmds, m.ResultAck)] == [[m.TaskRef("a", 1)]]
    assert [r.task_id for r in saved(cmds, ResultRow)] == ["a"]  # kept once by the store's (task, attempt) key
    assert saved(cmds, TaskRow) == [] and sim.task("a").outcome["attempt"] == 1
    # started and progress about it are not refused either
    for cmds in (sim.started("w1", "a", 1, now=T0 + 31),
                 sim.run(sim.state.progress("w1", m.TaskProgress(m.TaskRef("a", 1), 0.5), T0 + 31))):
        assert not [c for c in cmds if isinstance(c, Refused)]
    # a worker that never held it is refused, as before
    sim.register(register("w2"))
    refused = [c for c in sim.results("w2", result("a"), now=T0 + 32) if isinstance(c, Refused)]
    assert [r.reason for r in refused] == ["attempt 1 was never assigned to this worker (the task is at attempt 1)"]


def test_an_unknown_task_is_still_refused(sim: Sim) -> None:
    sim.register(register("w1"))
    sim.state.load(sim.stored(sim.state.missing(["ghost"])))
    (refused,) = [c for c in sim.results("w1", result("ghost")) if isinstance(c, Refused)]
    assert refused.reason == "no such task"


def test_cancel_of_a_task_that_left_memory_changes_nothing(sim: Sim) -> None:
    run_all(sim, ["a", "b", "c"])
    sim.state.load(sim.stored(["a"]))
    assert sim.cancel("a", now=T0 + 40) == []
    assert sim.task("a").state == "succeeded"


def test_a_worker_announcing_a_task_that_left_memory_is_told_to_cancel_it(sim: Sim) -> None:
    run_all(sim, ["a", "b", "c"])
    cmds = sim.register(register("w1", running=[m.TaskRef("a", 1)]), now=T0 + 50)
    assert [msg.task for _, msg in sent(cmds, m.Cancel)] == [m.TaskRef("a", 1)]


def test_queues_skip_cancelled_tasks_that_left_memory(sim: Sim) -> None:
    sim.submit(spec("x1"), spec("x2"), spec("x3"), spec("late", max_retries=1), spec("keep"))
    for tid in ("x1", "x2", "x3"):
        sim.cancel(tid, now=T0 + 1)  # still in the queue's heap, and evicted beyond the cache
    assert sim.state.missing(["x1"]) == ["x1"]
    cmds = sim.register(register("w1", slots=2), now=T0 + 2)
    assert sorted(a.task_id for _, msg in sent(cmds, m.AssignTasks) for a in msg.tasks) == ["keep", "late"]
    # a task cancelled while it waits out its retry backoff, then evicted: the ticker skips it
    sim.results("w1", m.Results([m.TaskResult("late", 1, "error", T0, T0, output={"retryable": True})]), now=T0 + 3)
    assert sim.task("late").not_before > T0 + 3
    sim.cancel("late", now=T0 + 3)
    for tid in ("y1", "y2", "y3"):
        sim.submit(spec(tid), now=T0 + 3)
        sim.cancel(tid, now=T0 + 3)
    assert "late" not in sim.state.tasks
    sim.tick(T0 + 100)


def test_load_ignores_active_rows_and_tasks_in_memory(sim: Sim) -> None:
    sim.submit(spec("p"))
    row = sim.rows()["p"]
    sim.state.load([msgspec.structs.replace(row, state="succeeded", outcome={"status": "succeeded"})])
    assert sim.task("p").state == "pending"  # memory is the authority for what it holds
    st = CoordinatorState(POLICY)
    st.load([row])  # an active row only the snapshot may bring
    assert st.tasks == {}


def test_loading_more_than_the_cache_keeps_them_all_for_the_event(sim: Sim) -> None:
    ids = [f"t{i}" for i in range(5)]
    run_all(sim, ids)
    fresh = Sim(POLICY)
    fresh.journal = sim.journal
    fresh.state.restore(sim.snapshot(), T0 + 100)
    fresh.state.load(sim.stored(ids))
    assert fresh.state.missing(ids) == []  # all five, for the one message that named them
    fresh.state.retire([])
    assert len(fresh.state.missing(ids)) == 5 - CACHE


def test_restore_seeds_counts_and_continues_submission_order(sim: Sim) -> None:
    run_all(sim, ["a", "b", "c"])
    sim.submit(spec("p1"), spec("p2"), now=T0 + 10)
    snap = sim.snapshot()
    assert [r.task_id for r in snap.tasks] == ["p1", "p2"] and snap.max_seq == 5
    fresh = CoordinatorState(POLICY)
    fresh.restore(snap, T0 + 20)
    assert set(fresh.tasks) == {"p1", "p2"}
    assert {k: v for k, v in fresh.counts.items() if v} == {"succeeded": 3, "assigned": 1, "pending": 1}
    fresh.submit([spec("n1")], T0 + 21)
    assert fresh.get("n1").seq == 6
    # an old-style snapshot with the history in it: counted, and only the cache's worth kept
    old = Snapshot(tasks=list(sim.rows().values()))
    legacy = CoordinatorState(POLICY)
    legacy.restore(old, T0 + 20)
    assert {k: v for k, v in legacy.counts.items() if v} == {"succeeded": 3, "assigned": 1, "pending": 1}
    assert set(legacy.tasks) == {"b", "c", "p1", "p2"} and legacy.get("p1").state == "assigned"


def test_memory_stays_flat_over_many_finished_tasks() -> None:
    sim = Sim(Policy(finished_cache=50))
    sim.register(register("w1", slots=8))
    for batch in range(50):
        ids = [f"b{batch}-{i}" for i in range(20)]
        cmds = sim.run(sim.state.submit([spec(t) for t in ids], T0 + batch)[1])
        for _, msg in sent(cmds, m.AssignTasks):
            sim.results("w1", m.Results([m.TaskResult(a.task_id, a.attempt, "succeeded", T0, T0) for a in msg.tasks]),
                        now=T0 + batch)
        while (busy := sorted(sim.running("w1"))):
            sim.results("w1", m.Results([m.TaskResult(t, 1, "succeeded", T0, T0) for t in busy]), now=T0 + batch)
    assert sim.state.counts["succeeded"] == 1000
    assert len(sim.state.tasks) == 50 and sim.state.cached_finished == 50  # nothing active; the cache alone
