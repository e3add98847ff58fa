"""The coordinator's scheduling core, driven event by event with ``now`` passed in: no loop, no
clock, no sockets. Each test plays a scenario a user lives through and checks the commands that
would reach workers and the store."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_support import T0, Sim, saved, sent

from distributed_testing.coordinator.core.commands import CloseWorker, Command, Notify, Save, Send
from distributed_testing.coordinator.core.policy import Policy
from distributed_testing.coordinator.core.rows import ResultRow, TaskRow
from distributed_testing.coordinator.core.state import CoordinatorState
from distributed_testing.errors import Conflict, NotFound
from distributed_testing.protocol import messages as m
from distributed_testing.retry import Backoff
from distributed_testing.tasks import spec as specs
from distributed_testing.tasks.states import check_transition

GRACE = 10.0
TTL = 30.0
BACKOFF = 0.5  # first retry delay
POLICY = Policy(
    worker_grace_s=GRACE, worker_ttl_s=TTL, retry_backoff=Backoff(base_s=BACKOFF, factor=2.0, max_s=30.0, jitter=0.0)
)


def spec(
    task_id: str | None,
    *,
    priority: int = 0,
    hardware: tuple[str, ...] = (),
    tags: tuple[str, ...] = (),
    min_memory_gb: float | None = None,
    max_retries: int = 0,
    name: str = "noop",
) -> specs.TaskSpec:
    doc: dict[str, Any] = {
        "type": "custom",
        "config": {"name": name},
        "priority": priority,
        "max_retries": max_retries,
        "requirements": {"hardware": list(hardware), "tags": list(tags), "min_memory_gb": min_memory_gb},
    }
    if task_id is not None:
        doc["task_id"] = task_id
    return specs.parse_tasks(doc)[0]


def register(
    worker_id: str,
    *,
    caps: tuple[str, ...] = ("cpu",),
    tags: tuple[str, ...] = (),
    memory_gb: float = 8.0,
    slots: int = 1,
    running: tuple[tuple[str, int], ...] = (),
) -> m.Register:
    return m.Register(
        worker_id=worker_id,
        name=f"name-{worker_id}",
        protocol_version=m.PROTOCOL_VERSION,
        hardware={"memory_gb": memory_gb},
        capabilities=list(caps),
        tags=list(tags),
        max_concurrent=slots,
        memory_gb=memory_gb,
        running=[m.TaskRef(t, a) for t, a in running],
    )


def result(task_id: str, attempt: int, status: str = "succeeded", **kw: Any) -> m.Results:
    return m.Results(
        [
            m.TaskResult(
                task_id=task_id,
                attempt=attempt,
                status=status,
                started_at=T0,  # type: ignore[arg-type]
                finished_at=T0 + 1,
                **kw,
            )
        ]
    )


def assigned(cmds: list[Command]) -> list[tuple[str, str, int]]:
    """(worker, task, attempt) for every task assignment in ``cmds``, in order."""
    return [
        (c.worker_id, a.task_id, a.attempt)
        for c in cmds
        if isinstance(c, Send) and isinstance(c.msg, m.AssignTasks)
        for a in c.msg.tasks
    ]


def assert_history_explains(state: CoordinatorState) -> None:
    """Every task's history is a legal chain of transitions from submission, each with a cause."""
    for t in state.tasks.values():
        h = t.history
        assert h[0]["from"] is None and h[0]["to"] == "pending" and h[0]["cause"]
        for prev, cur in zip(h, h[1:], strict=False):
            assert cur["from"] == prev["to"], h
            assert isinstance(cur["cause"], str) and cur["cause"], h
            check_transition(t.task_id, cur["from"], cur["to"], cur["cause"])
        assert h[-1]["to"] == t.state


@pytest.fixture
def sim() -> Iterator[Sim]:
    s = Sim(POLICY)
    yield s
    assert_history_explains(s.state)  # whatever the scenario, every task's history explains its state


# ------------------------------------------------------------------ ordering


def drain_one_at_a_time(s: Sim, worker_id: str, first: list[Command]) -> list[str]:
    """Complete each dispatched task in turn; return the dispatch order."""
    order: list[str] = []
    pending = assigned(first)
    now = T0
    while pending:
        assert len(pending) == 1, pending  # one slot: never more than one at a time
        _, task_id, attempt = pending[0]
        order.append(task_id)
        now += 1
        s.started(worker_id, task_id, attempt, now)
        pending = assigned(s.results(worker_id, result(task_id, attempt), now))
    return order


def test_priority_order_then_fifo_within_priority(sim: Sim) -> None:
    prios = {"a": 0, "b": 5, "c": 0, "d": 10, "e": 5, "f": -3, "g": 10, "h": 0}
    for i, (tid, p) in enumerate(prios.items()):
        _, cmds = sim.submit(spec(tid, priority=p), now=T0 + i * 0.001)
        assert assigned(cmds) == []
    order = drain_one_at_a_time(sim, "w1", sim.register(register("w1", slots=1)))
    assert order == ["d", "g", "b", "e", "a", "c", "h", "f"]
    assert all(sim.task(t).state == "succeeded" for t in prios)
    assert_history_explains(sim.state)


def test_fifo_within_a_batch_follows_list_order(sim: Sim) -> None:
    sim.submit(spec("z"), spec("m"), spec("a"))  # one request, one timestamp
    assert drain_one_at_a_time(sim, "w1", sim.register(register("w1"))) == ["z", "m", "a"]


@settings(max_examples=40, deadline=None)
@given(prios=st.lists(st.integers(min_value=-3, max_value=3), min_size=1, max_size=12), batch=st.booleans())
def test_dispatch_order_is_a_stable_sort_by_priority(prios: list[int], batch: bool) -> None:
    s = Sim(POLICY)
    items = [spec(f"t{i:02d}", priority=p) for i, p in enumerate(prios)]
    if batch:
        s.submit(*items)
    else:
        for i, item in enumerate(items):
            s.submit(item, now=T0 + i)
    expected = [it.task_id for it in sorted(items, key=lambda it: -it.priority)]
    assert drain_one_at_a_time(s, "w1", s.register(register("w1"))) == expected


def test_higher_priority_submitted_later_overtakes_queued_work(sim: Sim) -> None:
    sim.submit(spec("low-1"), spec("low-2"))
    first = sim.register(register("w1"))
    assert assigned(first) == [("w1", "low-1", 1)]
    sim.submit(spec("urgent", priority=100), now=T0 + 1)
    nxt = sim.results("w1", result("low-1", 1), now=T0 + 2)
    assert assigned(nxt) == [("w1", "urgent", 1)]


# ------------------------------------------------------------------ requirements


def test_cuda_task_never_goes_to_cpu_only_worker(sim: Sim) -> None:
    sim.register(register("cpu-1", caps=("cpu",), slots=4))
    _, cmds = sim.submit(spec("gpu-task", hardware=("cuda",)))
    assert assigned(cmds) == []
    t = sim.task("gpu-task")
    assert t.state == "pending"
    reason = sim.state.why_pending(t)
    assert reason is not None and "cpu-1" in reason and "hardware cuda" in reason
    assert list(sim.state.eligible_workers(t)) == []
    cmds = sim.register(register("gpu-1", caps=("cpu", "cuda")))
    assert assigned(cmds) == [("gpu-1", "gpu-task", 1)]
    assert sim.state.why_pending(sim.task("gpu-task")) is None


def test_why_pending_without_workers(sim: Sim) -> None:
    sim.submit(spec("t"))
    assert sim.state.why_pending(sim.task("t")) == "no worker is connected"


def test_tags_and_min_memory_are_required(sim: Sim) -> None:
    sim.register(register("small", tags=("transformers",), memory_gb=4.0, slots=2))
    sim.register(register("untagged", tags=(), memory_gb=64.0, slots=2))
    _, cmds = sim.submit(spec("big", tags=("transformers",), min_memory_gb=16))
    assert assigned(cmds) == []
    reason = sim.state.why_pending(sim.task("big"))
    assert reason is not None
    assert "small lacks 16 GB memory" in reason and "untagged lacks tag transformers" in reason
    cmds = sim.register(register("fits", tags=("transformers", "x"), memory_gb=16.0))
    assert assigned(cmds) == [("fits", "big", 1)]


def test_per_worker_concurrency_is_respected(sim: Sim) -> None:
    sim.submit(*[spec(f"t{i}") for i in range(5)])
    first = sim.register(register("w1", slots=2))
    assert [a[1] for a in assigned(first)] == ["t0", "t1"]
    assert len(sent(first, m.AssignTasks)) == 1  # one batch message
    assert sim.state.why_pending(sim.task("t2")) == "waiting for a free slot on 1 eligible worker(s)"
    sim.started("w1", "t0", 1)
    nxt = sim.results("w1", result("t0", 1))
    assert assigned(nxt) == [("w1", "t2", 1)]
    assert sum(1 for t in sim.state.tasks.values() if t.state in ("assigned", "running")) == 2


def test_load_spreads_to_the_worker_with_most_free_slots(sim: Sim) -> None:
    sim.register(register("a", slots=1))
    sim.register(register("b", slots=3))
    _, cmds = sim.submit(*[spec(f"t{i}") for i in range(4)])
    per_worker: dict[str, int] = {}
    for w, _, _ in assigned(cmds):
        per_worker[w] = per_worker.get(w, 0) + 1
    assert per_worker == {"a": 1, "b": 3}


def test_task_nobody_can_run_does_not_block_others(sim: Sim) -> None:
    sim.register(register("cpu-1", slots=1))
    _, cmds = sim.submit(
        spec("gpu-first", priority=100, hardware=("cuda",)),
        spec("cpu-after", priority=0),
        spec("cpu-last", priority=-5),
    )
    assert assigned(cmds) == [("cpu-1", "cpu-after", 1)]
    nxt = sim.results("cpu-1", result("cpu-after", 1))
    assert assigned(nxt) == [("cpu-1", "cpu-last", 1)]
    assert sim.task("gpu-first").state == "pending"


def test_constrained_worker_gets_no_work_until_ready(sim: Sim) -> None:
    sim.register(register("w1", slots=2))
    sim.heartbeat("w1", "constrained", reason="memory 95% > 90%")
    _, cmds = sim.submit(spec("t"))
    assert assigned(cmds) == []
    assert sim.state.why_pending(sim.task("t")) == "all 1 eligible worker(s) are constrained or draining"
    assert assigned(sim.heartbeat("w1", "ready", now=T0 + 1)) == [("w1", "t", 1)]


def test_heartbeat_memory_offer_gates_tasks_by_max_memory_mb(sim: Sim) -> None:
    sim.register(register("w1", slots=4))
    hb = m.Heartbeat("ready", [], 1.0, 1.0, 4, available_memory_mb=1000.0)
    sim.run(sim.state.heartbeat("w1", hb, T0))
    big = specs.parse_tasks({"task_id": "big", "type": "custom", "config": {"name": "noop"}, "max_memory_mb": 1500})[0]
    small = [specs.parse_tasks({"task_id": f"s{i}", "type": "custom", "config": {"name": "noop"},
                                "max_memory_mb": 400})[0] for i in range(3)]
    _, cmds = sim.submit(big, *small)
    # 1000 MB offered: two 400 MB tasks fit (reserved until the next heartbeat), the third and big wait
    assert sorted(t for _, t, _ in assigned(cmds)) == ["s0", "s1"]
    assert "lacks 1500 MB memory for the task (offers" in (sim.state.why_pending(sim.task("big")) or "")
    assert sim.state.workers["w1"].load["available_memory_mb"] == 1000.0
    more = m.Heartbeat("ready", [], 1.0, 1.0, 2, available_memory_mb=5000.0)
    assert sorted(t for _, t, _ in assigned(sim.run(sim.state.heartbeat("w1", more, T0 + 1)))) == ["big", "s2"]


# ------------------------------------------------------------------ submission


def test_identical_resubmission_is_a_no_op(sim: Sim) -> None:
    accepted, cmds = sim.submit(spec("t1", priority=3), spec("t2"))
    assert [a["created"] for a in accepted] == [True, True]
    assert {r.task_id for r in saved(cmds, TaskRow)} == {"t1", "t2"}
    accepted, cmds = sim.submit(spec("t1", priority=3), now=T0 + 5)
    assert accepted == [{"task_id": "t1", "created": False, "state": "pending"}]
    assert saved(cmds, TaskRow) == []
    assert sim.task("t1").submitted_at == T0
    assert len(sim.task("t1").history) == 1


def test_resubmission_after_completion_reports_the_current_state(sim: Sim) -> None:
    sim.submit(spec("t1"))
    sim.register(register("w1"))
    sim.results("w1", result("t1", 1))
    accepted, cmds = sim.submit(spec("t1"), now=T0 + 9)
    assert accepted == [{"task_id": "t1", "created": False, "state": "succeeded"}]
    assert assigned(cmds) == [] and saved(cmds, TaskRow) == []


def test_same_id_different_body_conflicts_and_changes_nothing(sim: Sim) -> None:
    sim.submit(spec("t1", priority=1))
    before = (sim.task("t1").digest, sim.task("t1").spec, list(sim.task("t1").history), sim.state.tasks.keys() - set())
    with pytest.raises(Conflict, match="t1"):
        sim.submit(spec("new-one"), spec("t1", priority=2), now=T0 + 1)
    assert (sim.task("t1").digest, sim.task("t1").spec, sim.task("t1").history, set(sim.state.tasks)) == before
    assert "new-one" not in sim.state.tasks  # checked before anything was accepted
    assert drain_one_at_a_time(sim, "w1", sim.register(register("w1"))) == ["t1"]


def test_tasks_without_id_get_distinct_ids(sim: Sim) -> None:
    accepted, _ = sim.submit(spec(None), spec(None))
    ids = [a["task_id"] for a in accepted]
    assert len(set(ids)) == 2 and all(i.startswith("custom-") for i in ids)


# ------------------------------------------------------------------ cancel


def test_cancel_pending_task_is_never_dispatched(sim: Sim) -> None:
    sim.submit(spec("keep"), spec("drop", priority=9))
    cmds = sim.cancel("drop", now=T0 + 1)
    assert any(isinstance(c, Notify) and "drop" in c.task_ids for c in cmds)
    assert sent(cmds, m.Cancel) == []
    t = sim.task("drop")
    assert t.state == "cancelled" and t.outcome and t.outcome["status"] == "cancelled"
    assert [r.state for r in saved(cmds, TaskRow)] == ["cancelled"]
    assert drain_one_at_a_time(sim, "w1", sim.register(register("w1"))) == ["keep"]
    assert sim.task("drop").attempt == 0
    assert_history_explains(sim.state)


def test_cancel_running_task_tells_its_worker_and_the_outcome_stays_cancelled(sim: Sim) -> None:
    sim.submit(spec("t1"), spec("t2"))
    sim.register(register("w1"))
    sim.started("w1", "t1", 1)
    cmds = sim.cancel("t1", now=T0 + 1)
    assert sent(cmds, m.Cancel) == [("w1", m.Cancel(m.TaskRef("t1", 1), "cancelled by request"))]
    assert assigned(cmds) == []  # the slot is still busy until the worker reports
    assert sim.task("t1").state == "cancelled"
    late = sim.results("w1", result("t1", 1, "succeeded"), now=T0 + 2)
    assert sent(late, m.ResultAck) == [("w1", m.ResultAck([m.TaskRef("t1", 1)]))]
    assert [c.record.status for c in late if isinstance(c, Save) and isinstance(c.record, ResultRow)] == ["succeeded"]
    t = sim.task("t1")
    assert t.state == "cancelled" and t.outcome is not None and t.outcome["status"] == "cancelled"
    assert assigned(late) == [("w1", "t2", 1)]  # the result freed the slot
    assert_history_explains(sim.state)


def test_cancel_terminal_task_is_a_no_op_and_unknown_is_not_found(sim: Sim) -> None:
    sim.submit(spec("t1"))
    sim.register(register("w1"))
    sim.results("w1", result("t1", 1, "failed", error="assert 1 == 2"))
    assert sim.cancel("t1") == []
    assert sim.task("t1").state == "failed"
    with pytest.raises(NotFound):
        sim.cancel("nope")
    with pytest.raises(NotFound):
        sim.state.get("nope")


def test_cancel_missed_while_disconnected_is_resent_on_reconnect(sim: Sim) -> None:
    sim.submit(spec("t1"))
    sim.register(register("w1"))
    sim.started("w1", "t1", 1)
    sim.disconnect("w1", T0 + 1)
    sim.cancel("t1", now=T0 + 2)
    cmds = sim.register(register("w1", running=(("t1", 1),)), now=T0 + 3)
    assert [msg.task for _, msg in sent(cmds, m.Cancel)] == [m.TaskRef("t1", 1)]
    assert sim.task("t1").state == "cancelled"


# ------------------------------------------------------------------ results


def test_result_becomes_the_outcome_and_is_acked(sim: Sim) -> None:
    sim.submit(spec("t1"))
    sim.register(register("w1"))
    sim.started("w1", "t1", 1, now=T0 + 1)
    assert sim.task("t1").state == "running"
    cmds = sim.results("w1", result("t1", 1, "failed", error="boom", output={"x": 1}), now=T0 + 5)
    t = sim.task("t1")
    assert t.state == "failed"
    assert t.outcome == {"status": "failed", "attempt": 1, "worker_id": "w1", "error": "boom", "duration_s": 1.0}
    assert sent(cmds, m.ResultAck) == [("w1", m.ResultAck([m.TaskRef("t1", 1)]))]
    assert any(isinstance(c, Notify) and c.task_ids == ("t1",) for c in cmds)
    rows = [c.record for c in cmds if isinstance(c, Save) and isinstance(c.record, ResultRow)]
    assert [(r.task_id, r.attempt, r.status, r.output, r.received_at) for r in rows] == [
        ("t1", 1, "failed", {"x": 1}, T0 + 5)
    ]


@pytest.mark.parametrize("status", ["succeeded", "failed", "timed_out", "error", "cancelled"])
def test_every_result_status_is_a_terminal_outcome(sim: Sim, status: str) -> None:
    sim.submit(spec("t1"))
    sim.register(register("w1"))
    sim.results("w1", result("t1", 1, status))
    assert sim.task("t1").state == status and sim.task("t1").outcome["status"] == status  # type: ignore[index]


def test_retryable_infrastructure_error_is_retried(sim: Sim) -> None:
    sim.submit(spec("t1", max_retries=1))
    sim.register(register("w1"))
    cmds = sim.results("w1", result("t1", 1, "error", error="OOM killed", output={"retryable": True}), now=T0 + 1)
    assert sim.task("t1").state == "pending" and sim.task("t1").retries_used == 1
    assert assigned(cmds) == []  # backoff first
    assert assigned(sim.tick(T0 + 1 + BACKOFF)) == [("w1", "t1", 2)]
    sim.results("w1", result("t1", 2, "error", error="OOM killed", output={"retryable": True}), now=T0 + 3)
    assert sim.task("t1").state == "error"  # retries exhausted
    assert_history_explains(sim.state)


def test_result_from_stale_attempt_is_acked_and_stored_but_never_the_outcome(sim: Sim) -> None:
    sim.submit(spec("t1", max_retries=1))
    sim.register(register("w1"))
    sim.started("w1", "t1", 1)
    sim.disconnect("w1", T0 + 1)
    sim.register(register("w2"), now=T0 + 2)
    sim.tick(T0 + 1 + GRACE)
    assert assigned(sim.tick(T0 + 1 + GRACE + BACKOFF)) == [("w2", "t1", 2)]
    back = sim.register(register("w1", running=(("t1", 1),)), now=T0 + 20)
    assert [msg.task for _, msg in sent(back, m.Cancel)] == [m.TaskRef("t1", 1)]
    stale = sim.results("w1", result("t1", 1, "succeeded"), now=T0 + 21)
    assert sent(stale, m.ResultAck) == [("w1", m.ResultAck([m.TaskRef("t1", 1)]))]
    assert [
        (c.record.attempt, c.record.worker_id) for c in stale if isinstance(c, Save) and isinstance(c.record, ResultRow)
    ] == [(1, "w1")]
    assert saved(stale, TaskRow) == []
    t = sim.task("t1")
    assert (t.state, t.attempt, t.worker_id, t.outcome) == ("assigned", 2, "w2", None)
    sim.results("w2", result("t1", 2, "failed", error="real"), now=T0 + 22)
    assert t.state == "failed" and t.outcome is not None and t.outcome["attempt"] == 2
    assert_history_explains(sim.state)


def test_result_from_a_worker_not_running_the_task_is_ignored(sim: Sim) -> None:
    sim.submit(spec("t1"))
    sim.register(register("w1"))
    sim.register(register("intruder"))
    cmds = sim.results("intruder", result("t1", 1, "succeeded"))
    assert sent(cmds, m.ResultAck)  # settled on the intruder's side, but refused: nothing stored
    assert saved(cmds, ResultRow) == []
    assert sim.task("t1").state == "assigned" and sim.task("t1").outcome is None


# ------------------------------------------------------------------ worker loss


def test_lost_worker_task_requeued_with_next_attempt_when_retries_allow(sim: Sim) -> None:
    sim.submit(spec("t1", max_retries=2))
    sim.register(register("w1"))
    sim.started("w1", "t1", 1)
    sim.register(register("w2", slots=1), now=T0)
    sim.heartbeat("w2", "constrained")  # keep w2 out until we want it
    sim.disconnect("w1", T0 + 1)
    sim.tick(T0 + 1 + GRACE - 0.01)
    assert sim.task("t1").state == "running"  # still within grace
    sim.tick(T0 + 1 + GRACE)
    t = sim.task("t1")
    assert (t.state, t.attempt, t.retries_used, t.worker_id) == ("pending", 1, 1, None)
    assert "lost" in t.history[-1]["cause"] and "w1" in t.history[-1]["cause"]
    assert "retry backoff" in (sim.state.why_pending(t) or "")
    sim.heartbeat("w2", "ready", now=T0 + 1 + GRACE)
    assert assigned(sim.tick(T0 + 1 + GRACE + BACKOFF)) == [("w2", "t1", 2)]
    assert_history_explains(sim.state)


def test_lost_worker_task_errors_with_cause_when_no_retries_left(sim: Sim) -> None:
    sim.submit(spec("t1", max_retries=0))
    sim.register(register("w1"))
    sim.started("w1", "t1", 1)
    sim.disconnect("w1", T0 + 1)
    cmds = sim.tick(T0 + 1 + GRACE)
    t = sim.task("t1")
    assert t.state == "error"
    assert t.outcome is not None and t.outcome["status"] == "error" and "w1 lost" in t.outcome["error"]
    assert "w1 lost" in t.history[-1]["cause"]
    assert any(isinstance(c, Notify) and "t1" in c.task_ids for c in cmds)
    assert [r.state for r in saved(cmds, TaskRow)] == ["error"]


def test_reconnect_within_grace_keeps_running_task_without_second_dispatch(sim: Sim) -> None:
    sim.submit(spec("t1", max_retries=3), spec("t2"))
    sim.register(register("w1", slots=1))
    sim.started("w1", "t1", 1)
    sim.disconnect("w1", T0 + 1)
    cmds = sim.register(register("w1", slots=1, running=(("t1", 1),)), now=T0 + 1 + GRACE / 2)
    assert assigned(cmds) == [] and sent(cmds, m.Cancel) == []
    assert sim.tick(T0 + 1 + 2 * GRACE) == []  # the old disconnect no longer counts
    t = sim.task("t1")
    assert (t.state, t.attempt, t.worker_id, t.retries_used) == ("running", 1, "w1", 0)
    assert sim.state.workers["w1"].view.running == {"t1"}  # its slot is still taken
    assert assigned(sim.results("w1", result("t1", 1))) == [("w1", "t2", 1)]


def test_register_without_the_task_requeues_it(sim: Sim) -> None:
    sim.submit(spec("t1", max_retries=1))
    sim.register(register("w1"))
    sim.started("w1", "t1", 1)
    cmds = sim.register(register("w1"), now=T0 + 2)  # restarted, lost its child
    t = sim.task("t1")
    assert t.state == "pending" and "restarted without this task" in t.history[-1]["cause"]
    assert [r.state for r in saved(cmds, TaskRow)] == ["pending"]
    assert assigned(sim.tick(T0 + 2 + BACKOFF)) == [("w1", "t1", 2)]


def test_register_without_the_task_and_no_retries_errors(sim: Sim) -> None:
    sim.submit(spec("t1"))
    sim.register(register("w1"))
    sim.register(register("w1"), now=T0 + 2)
    assert sim.task("t1").state == "error"


def test_an_abandoned_provisional_assignment_is_requeued_without_spending_a_retry(sim: Sim) -> None:
    sim.submit(spec("t1", max_retries=0))
    sim.register(register("w1"))
    reg = msgspec.structs.replace(register("w1"), abandoned=[m.TaskRef("t1", 1)])
    cmds = sim.register(reg, now=T0 + 1)  # the session ended before the confirm reached w1
    t = sim.task("t1")
    assert (t.retries_used, t.attempt) == (0, 2) and assigned(cmds) == [("w1", "t1", 2)]
    assert any("abandoned" in h["cause"] for h in t.history)


def test_an_abandoned_attempt_whose_result_arrived_keeps_its_outcome(sim: Sim) -> None:
    """The worker sent the result before the confirm, then lost its session: the result stands."""
    sim.submit(spec("t1"))
    sim.register(register("w1"))
    sim.results("w1", m.Results([m.TaskResult("t1", 1, "succeeded", T0, T0 + 1)]), now=T0 + 1)
    reg = msgspec.structs.replace(register("w1"), abandoned=[m.TaskRef("t1", 1)])
    assert assigned(sim.register(reg, now=T0 + 2)) == []
    t = sim.task("t1")
    assert (t.state, t.attempt, t.retries_used) == ("succeeded", 1, 0)


def test_register_announcing_unknown_attempt_gets_cancel(sim: Sim) -> None:
    cmds = sim.register(register("w1", running=(("ghost", 3),)))
    assert [msg.task for _, msg in sent(cmds, m.Cancel)] == [m.TaskRef("ghost", 3)]


def test_new_session_closes_the_old_one(sim: Sim) -> None:
    sim.register(register("w1"))
    old = sim.sessions["w1"]
    cmds = sim.register(register("w1"), now=T0 + 1)
    assert [c for c in cmds if isinstance(c, CloseWorker)] == [CloseWorker("w1", old, "replaced by a new session")]


def test_disconnect_of_a_replaced_session_is_ignored(sim: Sim) -> None:
    sim.submit(spec("t1"))
    sim.register(register("w1"))
    old = sim.sessions["w1"]
    sim.register(register("w1", running=(("t1", 1),)), now=T0 + 1)
    assert sim.state.disconnect("w1", old, T0 + 2) == []
    assert sim.state.workers["w1"].connected
    sim.tick(T0 + 100)
    assert sim.task("t1").state == "assigned"


def test_worker_silent_past_ttl_is_closed_and_then_lost(sim: Sim) -> None:
    sim.submit(spec("t1", max_retries=1))
    sim.register(register("w1"))
    sim.heartbeat("w1", now=T0 + 10)
    assert sim.tick(T0 + 10 + TTL) == []
    cmds = sim.tick(T0 + 10 + TTL + 0.1)
    assert [c for c in cmds if isinstance(c, CloseWorker)][0].worker_id == "w1"
    assert not sim.state.workers["w1"].connected
    sim.tick(T0 + 10 + TTL + 0.1 + GRACE)
    assert sim.task("t1").state == "pending" and sim.task("t1").retries_used == 1


def test_goodbye_hands_back_tasks_without_spending_retries(sim: Sim) -> None:
    sim.submit(spec("t1"))
    sim.register(register("w1"))
    sim.register(register("w2"))
    owner = sim.task("t1").worker_id
    other = "w2" if owner == "w1" else "w1"
    cmds = sim.state.goodbye(owner, m.Goodbye("shutting down", [m.TaskRef("t1", 1)]), T0 + 1)
    assert assigned(cmds) == [(other, "t1", 2)]
    assert sim.task("t1").retries_used == 0


def test_cancel_during_retry_backoff_is_never_dispatched(sim: Sim) -> None:
    sim.submit(spec("t1", max_retries=1))
    sim.register(register("w1"))
    sim.register(register("w1"), now=T0 + 1)  # lost -> backoff
    sim.cancel("t1", now=T0 + 1.1)
    assert assigned(sim.tick(T0 + 10)) == []
    assert sim.task("t1").state == "cancelled"


# ------------------------------------------------------------------ restore


def test_restore_from_saved_rows_gives_back_the_same_tasks(sim: Sim) -> None:
    sim.submit(
        spec("done", priority=5),
        spec("running", max_retries=1),
        spec("queued-1"),
        spec("queued-2", priority=1),
        spec("gone"),
        spec("gpu", hardware=("cuda",)),
    )
    sim.register(register("w1", slots=2))
    sim.started("w1", "done", 1)
    sim.results("w1", result("done", 1), now=T0 + 1)  # frees a slot: "running" dispatched next
    sim.cancel("gone", now=T0 + 3)
    states = {t: sim.task(t).state for t in sim.state.tasks}
    assert states == {
        "done": "succeeded",
        "running": "assigned",
        "queued-2": "assigned",
        "queued-1": "pending",
        "gone": "cancelled",
        "gpu": "pending",
    }

    fresh = CoordinatorState(POLICY)
    snap = sim.snapshot()
    assert sorted(r.task_id for r in snap.tasks) == ["gpu", "queued-1", "queued-2", "running"]  # active only
    fresh.restore(snap, T0 + 10)
    assert sorted(fresh.missing(sim.state.tasks)) == ["done", "gone"]
    fresh.load(sim.stored(fresh.missing(sim.state.tasks)))  # read back from the store, as the runtime does
    assert {k: v for k, v in fresh.counts.items() if v} == {k: v for k, v in sim.state.counts.items() if v}
    for tid, old in sim.state.tasks.items():
        new = fresh.get(tid)
        assert (
            new.state,
            new.attempt,
            new.worker_id,
            new.spec,
            new.digest,
            new.history,
            new.outcome,
            new.retries_used,
            new.submitted_at,
        ) == (
            old.state,
            old.attempt,
            old.worker_id,
            old.spec,
            old.digest,
            old.history,
            old.outcome,
            old.retries_used,
            old.submitted_at,
        )
    # Resubmitting a restored task is still idempotent.
    assert fresh.submit([spec("done", priority=5)], T0 + 10)[0][0]["created"] is False

    # Pending tasks are queued again; the active ones wait for w1 (still within grace).
    cmds = fresh.register(register("w9", slots=4), "s-new", T0 + 11, key_id="key-w9")
    assert [a[1] for a in assigned(cmds)] == ["queued-1"]
    # w1 comes back announcing what it still runs: nothing is dispatched twice.
    cmds = fresh.register(register("w1", slots=2, running=(("running", 1), ("queued-2", 1))), "s-w1", T0 + 12, key_id="key-w1")
    assert assigned(cmds) == [] and sent(cmds, m.Cancel) == []
    assert fresh.tick(T0 + 12 + GRACE * 2) == []
    assert fresh.get("running").state == "assigned" and fresh.get("running").attempt == 1


def test_started_transition_is_saved(sim: Sim) -> None:
    sim.submit(spec("t1"))
    sim.register(register("w1"))
    cmds = sim.started("w1", "t1", 1, now=T0 + 1)
    assert [r.state for r in saved(cmds, TaskRow)] == ["running"]
    fresh = CoordinatorState(POLICY)
    fresh.restore(sim.snapshot(), T0 + 2)
    assert fresh.get("t1").state == "running"
    assert [h["to"] for h in fresh.get("t1").history] == ["pending", "assigned", "running"]


def test_restore_requeues_active_tasks_whose_worker_never_returns(sim: Sim) -> None:
    sim.submit(spec("t1", max_retries=1))
    sim.register(register("w1"))
    sim.started("w1", "t1", 1)
    fresh = CoordinatorState(POLICY)
    fresh.restore(sim.snapshot(), T0 + 10)
    fresh.register(register("w2"), "s2", T0 + 10, key_id="key-w2")
    assert fresh.tick(T0 + 10 + GRACE - 0.1) == []
    fresh.tick(T0 + 10 + GRACE)
    assert assigned(fresh.tick(T0 + 10 + GRACE + BACKOFF)) == [("w2", "t1", 2)]


def test_restore_keeps_fifo_order_of_one_batch(sim: Sim) -> None:
    sim.submit(spec("z"), spec("m"), spec("a"))
    snap = sim.snapshot()
    snap.tasks.sort(key=lambda r: (r.submitted_at, r.task_id))  # the order MemoryStore and DuckDBStore return
    fresh = Sim(POLICY)
    fresh.state.restore(snap, T0 + 1)
    assert drain_one_at_a_time(fresh, "w1", fresh.register(register("w1"), now=T0 + 1)) == ["z", "m", "a"]


def test_saved_rows_carry_the_full_history(sim: Sim) -> None:
    """The last saved row of a task holds its whole history, so "why did X fail?" survives a restart."""
    sim.submit(spec("t1", max_retries=1))
    sim.register(register("w1"))
    sim.started("w1", "t1", 1)
    sim.register(register("w1"), now=T0 + 1)
    sim.tick(T0 + 1 + BACKOFF)
    sim.results("w1", result("t1", 2), now=T0 + 3)
    saved = [r.state for r in sim.journal if isinstance(r, TaskRow)]
    final = sim.task("t1")
    assert final.state == "succeeded"
    assert saved[0] == "pending" and saved[-1] == "succeeded"
    assert [h["to"] for h in sim.rows()["t1"].history] == [h["to"] for h in final.history]
    assert [h["to"] for h in final.history] == ["pending", "assigned", "running", "pending", "assigned", "succeeded"]


def test_restart_keeps_a_task_that_finished_while_the_coordinator_was_down(sim: Sim) -> None:
    # The coordinator died while w1 ran t1; t1 finished meanwhile and its result waits, unacked, in
    # w1's outbox. w1 re-registers with it in ``finished`` and re-sends it: one run, one outcome,
    # even with no retries left (before, the task was lost as "restarted without this task").
    sim.submit(spec("t1"), spec("t2"))
    sim.register(register("w1", slots=1))
    sim.started("w1", "t1", 1)
    fresh = CoordinatorState(POLICY)
    fresh.restore(sim.snapshot(), T0 + 10)
    reg = msgspec.structs.replace(register("w1", slots=1), finished=[m.TaskRef("t1", 1)])
    cmds = fresh.register(reg, "s2", T0 + 10, key_id="key-w1")
    t = fresh.get("t1")
    assert (t.state, t.attempt, t.retries_used) == ("running", 1, 0)
    assert [(s.worker_id, a.task_id) for s in cmds if isinstance(s, Send) and isinstance(s.msg, m.AssignTasks)
            for a in s.msg.tasks] == [("w1", "t2")]  # its slot is free for the next task
    fresh.results("w1", result("t1", 1), T0 + 10.1)
    assert fresh.get("t1").state == "succeeded" and fresh.get("t1").outcome["attempt"] == 1  # type: ignore[index]
