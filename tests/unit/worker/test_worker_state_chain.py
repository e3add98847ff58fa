"""Chains in the worker's pure bookkeeping (``worker/core/state.py``): queued tasks of a chainable
type handed to one slot's pool child together, only once the type is known to be short, each still
its own result; a cancel inside a chain stops that task alone, and what a chain never began is
queued again in order."""

from __future__ import annotations

from distributed_testing.protocol import messages as m
from distributed_testing.worker.core.state import (
    CHAIN_MAX,
    Instruction,
    Keep,
    Kill,
    Send,
    Start,
    Withdraw,
    WorkerState,
    pace_key,
)

NOW = 1_000.0


def a(task_id: str, **kw: object) -> m.TaskAssignment:
    handler = str(kw.pop("handler", "noop"))
    return m.TaskAssignment(task_id=task_id, attempt=1, type=str(kw.pop("type", "custom")), config={"name": handler},
                            **kw)  # type: ignore[arg-type]


def done(task_id: str, seconds: float = 0.0001) -> m.TaskResult:
    return m.TaskResult(task_id=task_id, attempt=1, status="succeeded", started_at=NOW, finished_at=NOW + seconds)


def starts(out: list[Instruction]) -> list[tuple[tuple[str, ...], bool]]:
    return [(tuple(x.task_id for x in i.assignments), i.chained) for i in out if isinstance(i, Start)]


def warmed(*ids: str) -> WorkerState:
    """One slot; a first task ran short, so the type is known; ``ids`` queued behind ``w``, running
    as run 2."""
    s = WorkerState(chain_types=frozenset({"custom"}))
    s.assign(m.AssignTasks([a("first")]))
    s.finished(done("first"))
    s.run_ended(1)
    s.assign(m.AssignTasks([a("w")]))
    s.assign(m.AssignTasks([a(i) for i in ids]))
    return s


def test_no_chain_before_a_task_of_the_type_has_finished() -> None:
    s = WorkerState(chain_types=frozenset({"custom"}))
    assert starts(s.assign(m.AssignTasks([a("x"), a("y"), a("z")]))) == [(("x",), False)]
    s.finished(done("x"))
    assert starts(s.run_ended(1)) == [(("y", "z"), True)]  # the queue behind, in order, one slot
    assert {tid: r.run for tid, r in s.running.items()} == {"y": 2, "z": 2}


def test_a_chain_takes_only_compatible_tasks_in_queue_order() -> None:
    s = warmed("b", "c", "d")
    s.assign(m.AssignTasks([a("big", max_memory_mb=100), a("e")]))
    s.finished(done("w"))
    assert starts(s.run_ended(2)) == [(("b", "c", "d"), True)]  # stops at the task with another memory limit
    for tid in "bcd":
        s.finished(done(tid))
    assert starts(s.run_ended(3)) == [(("big",), False)]
    bundle = WorkerState(chain_types=frozenset({"custom"}), pace={"custom:noop": 0.0001})
    assert starts(bundle.assign(m.AssignTasks([a("x", bundle="sha256:" + "0" * 64), a("y")]))) == [(("x",), False)]


def test_one_handler_s_pace_chains_no_other_handler() -> None:
    # 60 quick no-ops say nothing of a sleep: it starts alone, and no no-op chains behind it, where
    # a take-back would wait the sleep out (tests/e2e/test_pipelining_process.py)
    s = warmed()
    s.assign(m.AssignTasks([a("long", handler="sleep"), a("n1"), a("n2")]))
    s.finished(done("w"))
    assert starts(s.run_ended(2)) == [(("long",), False)]
    assert pace_key(a("x", handler="sleep")) == "custom:sleep" and pace_key(a("y", type="test")) == "test"


def test_a_long_task_stops_chains_and_several_slots_share_the_queue() -> None:
    s = warmed("b", "c")
    s.finished(done("w", seconds=2.0))  # longer than the chain budget: no chain until it decays
    assert starts(s.run_ended(2)) == [(("b",), False)]
    many = WorkerState(slots=2, chain_types=frozenset({"custom"}), pace={"custom:noop": 0.00001})
    out = many.assign(m.AssignTasks([a(f"t{i}") for i in range(2 * CHAIN_MAX + 10)]))
    assert [len(ids) for ids, _ in starts(out)] == [CHAIN_MAX, CHAIN_MAX]  # each slot a chain of its share


def test_a_cancel_inside_a_chain_stops_that_task_only() -> None:
    s = WorkerState(chain_types=frozenset({"custom"}), pace={"custom:noop": 0.0001})
    out = s.assign(m.AssignTasks([a("x"), a("y"), a("z")]))
    assert starts(out) == [(("x", "y", "z"), True)]
    assert s.cancel(m.Cancel(m.TaskRef("y", 1), "by the user"), NOW) == [Kill(1, "y")]
    out = s.skipped(1, m.TaskRef("y", 1), NOW)  # the child skipped it: it never began
    assert [(r.task_id, r.status, r.error) for i in out if isinstance(i, Keep) for r in [i.result]] == [
        ("y", "cancelled", "by the user")]
    assert set(s.running) == {"x", "z"}


def test_a_take_back_of_chained_tasks_is_answered_by_what_the_child_did() -> None:
    """Dropped only once the child skipped it (it never began); kept if it began; dropped too if
    the chain ended before it. Nothing is answered before it is known."""
    s = WorkerState(chain_types=frozenset({"custom"}), pace={"custom:noop": 0.0001})
    s.assign(m.AssignTasks([a("x"), a("y"), a("z"), a("v")]))
    refs = {t: m.TaskRef(t, 1) for t in "xyzv"}
    out = s.take_back(m.TakeBack([refs["y"], refs["z"], refs["v"]]))
    assert out == [Withdraw(1, "y"), Withdraw(1, "z"), Withdraw(1, "v")]
    assert s.began(refs["y"]) == [Send(m.TakenBack([], [refs["y"]]))]  # it ran: its result counts
    assert s.skipped(1, refs["z"], NOW) == [Send(m.TakenBack([refs["z"]], []))]
    assert s.unstarted(1, [refs["v"]]) == [Send(m.TakenBack([refs["v"]], []))]  # the chain stopped first
    assert set(s.running) == {"x", "y"} and not s.queued


def test_what_a_chain_never_began_waits_again_at_the_front_in_order() -> None:
    s = WorkerState(chain_types=frozenset({"custom"}), pace={"custom:noop": 0.0001})
    s.assign(m.AssignTasks([a("x"), a("y"), a("z")]))
    s.assign(m.AssignTasks([a("later", max_memory_mb=5)]))
    s.finished(m.TaskResult(task_id="x", attempt=1, status="timed_out", started_at=NOW, finished_at=NOW + 1))
    s.unstarted(1, [m.TaskRef("y", 1), m.TaskRef("z", 1)])
    assert [st.assignments[0].task_id for st in s.queued.values()] == ["y", "z", "later"]  # before what waited
    s.pace["custom:noop"] = 0.0001
    assert starts(s.run_ended(1)) == [(("y", "z"), True)]
