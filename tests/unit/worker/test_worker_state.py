"""The worker's pure bookkeeping (``worker/core/state.py``), driven event by event without a loop:
provisional assignments and their confirm, results before the confirm, abandoning at a session's
end, superseded attempts, the result hold, cancels, batches and a drain's hand-back."""

from __future__ import annotations

from typing import Any

from distributed_testing.protocol import messages as m
from distributed_testing.worker.core.state import (
    ArmHold,
    DisarmHold,
    FlushSoon,
    Forget,
    Instruction,
    Keep,
    Kill,
    RecordFinished,
    RecordStarted,
    ResendKept,
    Send,
    Settle,
    Start,
    Warn,
    WorkerState,
)

NOW = 1_000.0


def a(task_id: str, attempt: int = 1, type: str = "custom") -> m.TaskAssignment:
    return m.TaskAssignment(task_id=task_id, attempt=attempt, type=type, config={"name": "noop"})


def result(task_id: str, attempt: int = 1, status: str = "succeeded") -> m.TaskResult:
    return m.TaskResult(task_id=task_id, attempt=attempt, status=status, started_at=NOW, finished_at=NOW)  # type: ignore[arg-type]


def sent(out: list[Instruction], kind: type) -> list[Any]:
    return [i.msg for i in out if isinstance(i, Send) and isinstance(i.msg, kind)]


def kept(out: list[Instruction]) -> list[tuple[str, int]]:
    return [(i.result.task_id, i.result.attempt) for i in out if isinstance(i, Keep)]


def run_of(out: list[Instruction]) -> int:
    (start,) = [i for i in out if isinstance(i, Start)]
    return start.run


def test_an_assignment_starts_one_run_per_task_and_ignores_what_already_runs() -> None:
    s = WorkerState(slots=2)
    out = s.assign(m.AssignTasks([a("x"), a("y")]))
    assert [(i.assignments[0].task_id, i.batched) for i in out if isinstance(i, Start)] == [("x", False), ("y", False)]
    assert s.assign(m.AssignTasks([a("x"), a("y", attempt=0)])) == []  # the same attempt, or an older one
    assert [r.task_id for r in s.running_refs()] == ["x", "y"]


def test_a_confirmed_result_is_sent_once_per_flush_and_kept_until_acked() -> None:
    s = WorkerState()
    s.assign(m.AssignTasks([a("x")]))
    out = s.finished(result("x"))
    assert FlushSoon() in out and RecordFinished([m.TaskRef("x", 1)]) in out and kept(out) == [("x", 1)]
    assert s.finished(result("y")) == []  # nothing runs as y: nothing to report
    flushed = s.flush(NOW)
    assert [[r.task_id for r in msg.results] for msg in sent(flushed, m.Results)] == [["x"]]
    assert s.ack(m.ResultAck([m.TaskRef("x", 1)])) == [Forget([m.TaskRef("x", 1)])]


def test_a_provisional_result_is_sent_at_once_and_kept_only_once_confirmed() -> None:
    s = WorkerState()
    s.assign(m.AssignTasks([a("a")], provisional=1))
    out = s.finished(result("a"))
    assert kept(out) == [] and FlushSoon() in out  # sent, but maybe never durable: not kept
    assert sent(s.flush(NOW), m.Results)
    s.assign(m.AssignTasks([a("b")], provisional=2))
    assert kept(s.finished(result("b"))) == []
    assert kept(s.confirm(1)) == [("a", 1)]
    assert kept(s.confirm(2)) == [("b", 1)]
    assert s.unconfirmed == {} and s.unlogged == {}


def test_an_unconfirmed_start_is_announced_only_by_its_confirm() -> None:
    s = WorkerState()
    s.assign(m.AssignTasks([a("x")], provisional=1))
    assert s.announce(m.TaskRef("x", 1)) == []
    assert s.confirm(1) == [FlushSoon()]
    out = s.flush(NOW)
    assert [msg.tasks for msg in sent(out, m.TaskStarted)] == [[m.TaskRef("x", 1)]]
    assert RecordStarted([m.TaskRef("x", 1)]) in out


def test_unconfirmed_assignments_are_abandoned_when_the_session_ends() -> None:
    s = WorkerState(slots=2)
    s.assign(m.AssignTasks([a("done")], provisional=1))
    s.finished(result("done"))  # its result waits in the buffer (not flushed yet)
    long_run = run_of(s.assign(m.AssignTasks([a("long")], provisional=2)))
    s.announce(m.TaskRef("long", 1))
    assert s.session_ended() == [Warn("session ended before 2 provisional assignment(s) were confirmed; abandoning "
                                     "them: done#1, long#1"), Kill(long_run)]
    assert s.abandoned == [m.TaskRef("done", 1), m.TaskRef("long", 1)] and s.running == {}
    assert s.flush(NOW) == []  # done's result is dropped from the buffer, never sent again
    assert s.finished(result("long")) == []  # the killed run reports nothing
    assert s.confirm(2) == []  # a confirm from an old session changes nothing
    assert s.registered() == [ResendKept()] and s.abandoned == []  # told in that register


def test_an_abandoned_task_is_never_announced_as_started() -> None:
    s = WorkerState()
    s.assign(m.AssignTasks([a("x")], provisional=1))
    s.session_ended()
    assert s.announce(m.TaskRef("x", 1)) == []  # the 25 ms timer fired after the session ended


def test_a_newer_attempt_stops_the_older_one_which_reports_nothing() -> None:
    s = WorkerState()
    first = run_of(s.assign(m.AssignTasks([a("t", 1)])))
    out = s.assign(m.AssignTasks([a("t", 2)]))
    assert out == [Warn("task t: attempt 2 supersedes attempt 1 still running here; stopping that one"),
                   Kill(first)]  # attempt 2 waits for the slot attempt 1 still holds while it stops
    out = s.run_ended(first)
    assert [i.assignments[0].attempt for i in out if isinstance(i, Start)] == [2]
    assert s.finished(result("t", 1)) == []
    assert kept(s.finished(result("t", 2))) == [("t", 2)]


def test_an_ack_settles_a_result_sent_before_its_confirm() -> None:
    """An ack means the result, and so its assignment, is durable: a confirm coming after it must
    not put the acknowledged result back in the outbox (to be re-sent forever)."""
    s = WorkerState()
    s.assign(m.AssignTasks([a("a")], provisional=1))
    s.finished(result("a"))
    s.flush(NOW)
    out = s.ack(m.ResultAck([m.TaskRef("a", 1)]))
    assert s.unlogged == {} and s.unconfirmed == {}
    assert [i for i in out if isinstance(i, Settle)] == [Settle([result("a")])]  # in the history, as acknowledged
    assert kept(s.confirm(1)) == []


def test_an_ack_carrying_a_confirm_settles_its_results_and_confirms_the_rest() -> None:
    s = WorkerState()
    s.assign(m.AssignTasks([a("a")], provisional=1))
    s.finished(result("a"))
    s.flush(NOW)
    s.assign(m.AssignTasks([a("b")], provisional=2))
    out = s.ack(m.ResultAck([m.TaskRef("a", 1)], confirm_upto=2))
    assert kept(out) == [] and s.unconfirmed == {}
    assert [r.task_id for i in out if isinstance(i, Settle) for r in i.results] == ["a"]
    assert kept(s.finished(result("b"))) == [("b", 1)]


def test_results_wait_for_the_previous_ack_and_go_together() -> None:
    s = WorkerState()
    for t in "abc":
        s.assign(m.AssignTasks([a(t)]))
    s.finished(result("a"))
    assert [len(msg.results) for msg in sent(s.flush(NOW), m.Results)] == [1]
    s.finished(result("b"))
    assert s.flush(NOW) == [ArmHold()]  # a is unacknowledged: b is held
    assert s.finished(result("c"))[0] == FlushSoon()
    assert s.flush(NOW) == []  # still held; the hold is armed once
    out = s.ack(m.ResultAck([m.TaskRef("a", 1)]))
    assert out == [Forget([m.TaskRef("a", 1)]), FlushSoon()]
    out = s.flush(NOW)
    assert out[0] == DisarmHold() and [[r.task_id for r in x.results] for x in sent(out, m.Results)] == [["b", "c"]]


def test_a_missing_ack_delays_results_only_until_the_hold_ends() -> None:
    s = WorkerState()
    for t in "ab":
        s.assign(m.AssignTasks([a(t)]))
    s.finished(result("a"))
    s.flush(NOW)
    s.finished(result("b"))
    assert s.flush(NOW) == [ArmHold()]
    assert [[r.task_id for r in x.results] for x in sent(s.hold_expired(NOW), m.Results)] == [["b"]]


def test_registering_again_resends_what_is_kept_and_ends_the_hold() -> None:
    s = WorkerState()
    for t in "ab":
        s.assign(m.AssignTasks([a(t)]))
    s.finished(result("a"))
    s.flush(NOW)
    s.finished(result("b"))
    s.flush(NOW)
    assert s.registered() == [DisarmHold(), ResendKept()]  # b is kept: re-sent with a
    assert s.result_buf == [] and s.unacked_sent == set()


def test_a_cancel_kills_the_attempt_with_its_reason_and_ignores_other_attempts() -> None:
    s = WorkerState()
    run = run_of(s.assign(m.AssignTasks([a("x", 2)])))
    assert s.cancel(m.Cancel(m.TaskRef("x", 1), "stale"), NOW) == []
    assert s.cancel(m.Cancel(m.TaskRef("x", 2), "by request"), NOW) == [Kill(run)]
    assert s.running["x"].cancel_reason == "by request"


def test_a_batch_runs_in_one_call_only_for_a_batching_executor() -> None:
    msg = m.AssignTasks([a("p", type="benchmark"), a("q", type="benchmark")], batch_id="batch-p")
    assert [len(i.assignments) for i in WorkerState(slots=2).assign(msg) if isinstance(i, Start)] == [1, 1]
    s = WorkerState(batch_types=frozenset({"benchmark"}))
    out = s.assign(msg)
    assert [(len(i.assignments), i.batched) for i in out if isinstance(i, Start)] == [(2, True)]
    # a newer attempt of one member does not stop the batch the other still runs in
    assert not [i for i in s.assign(m.AssignTasks([a("p", 2, type="benchmark")])) if isinstance(i, Kill)]


def test_a_hand_back_kills_every_run_and_forgets_them_once_stopped() -> None:
    s = WorkerState(slots=2)
    runs = [run_of(s.assign(m.AssignTasks([a(t)]))) for t in "xy"]
    refs, kills = s.hand_back()
    assert refs == [m.TaskRef("x", 1), m.TaskRef("y", 1)] and kills == [Kill(r) for r in runs]
    assert len(s.running) == 2  # until their runs have stopped
    assert s.handed_back(refs) == [RecordFinished(refs)] and s.running == {}
    assert WorkerState().hand_back() == ([], [])


# ------------------------------------------------------------------ pipelining

def starts(out: list[Instruction]) -> list[str]:
    return [a.task_id for i in out if isinstance(i, Start) for a in i.assignments]


def test_assignments_beyond_the_slots_wait_and_start_in_order_as_runs_end() -> None:
    s = WorkerState(slots=1)
    out = s.assign(m.AssignTasks([a("x"), a("y"), a("z")]))
    assert starts(out) == ["x"] and [r.task_id for r in s.running_refs()] == ["x", "y", "z"]  # all three held
    x_run = run_of(out)
    s.finished(result("x"))
    assert starts(s.run_ended(x_run)) == ["y"]  # the slot frees when x's run is over, not before
    assert s.run_ended(x_run) == []  # (told twice: nothing more starts)


def test_a_take_back_drops_only_what_has_not_started() -> None:
    s = WorkerState(slots=1)
    s.assign(m.AssignTasks([a("x"), a("y"), a("z")], provisional=1))
    out = s.take_back(m.TakeBack([m.TaskRef("x", 1), m.TaskRef("y", 1), m.TaskRef("q", 1), m.TaskRef("z", 2)]))
    assert sent(out, m.TakenBack) == [m.TakenBack(dropped=[m.TaskRef("y", 1)],
                                                  kept=[m.TaskRef("x", 1), m.TaskRef("q", 1), m.TaskRef("z", 2)])]
    assert [r.task_id for r in s.running_refs()] == ["x", "z"] and ("y", 1) not in s.unconfirmed
    assert s.finished(result("y")) == []  # never reported
    assert starts(s.run_ended(1)) == ["z"]  # y never starts


def test_a_cancel_of_a_queued_task_reports_cancelled_at_once_without_starting_it() -> None:
    s = WorkerState(slots=1)
    s.assign(m.AssignTasks([a("x"), a("y")]))
    out = s.cancel(m.Cancel(m.TaskRef("y", 1), "by request"), NOW)
    assert kept(out) == [("y", 1)] and not [i for i in out if isinstance(i, Kill | Start)]
    (msg,) = sent(s.flush(NOW), m.Results)
    assert [(r.task_id, r.status, r.error) for r in msg.results] == [("y", "cancelled", "by request")]
    assert s.run_ended(1) == []  # y never starts


def test_a_newer_attempt_of_a_queued_task_replaces_it_in_the_queue() -> None:
    s = WorkerState(slots=1)
    s.assign(m.AssignTasks([a("x"), a("y")]))
    assert not [i for i in s.assign(m.AssignTasks([a("y", 2)])) if isinstance(i, Kill)]  # attempt 1 never started
    assert [i.assignments[0].attempt for i in s.run_ended(1) if isinstance(i, Start)] == [2]


def test_a_session_end_abandons_unconfirmed_queued_tasks_without_starting_them() -> None:
    s = WorkerState(slots=1)
    s.assign(m.AssignTasks([a("x")]))
    s.assign(m.AssignTasks([a("y")], provisional=1))
    assert [i for i in s.session_ended() if not isinstance(i, Warn)] == [] and s.abandoned == [m.TaskRef("y", 1)]
    assert s.run_ended(1) == []


def test_a_hand_back_never_starts_the_queued_tasks_and_kills_only_started_runs() -> None:
    s = WorkerState(slots=1)
    first = run_of(s.assign(m.AssignTasks([a("x"), a("y")])))
    refs, kills = s.hand_back()
    assert refs == [m.TaskRef("x", 1), m.TaskRef("y", 1)] and kills == [Kill(first)]
    assert s.run_ended(first) == []
    assert s.handed_back(refs) == [RecordFinished(refs)] and s.running == {}


def test_nothing_starts_once_the_worker_is_closing() -> None:
    s = WorkerState(slots=1)
    first = run_of(s.assign(m.AssignTasks([a("x"), a("y")])))
    s.closing()
    assert s.run_ended(first) == [] and [r.task_id for r in s.running_refs()] == ["x", "y"]
