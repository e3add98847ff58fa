"""A worker speaks only for itself, in the pure state machine: a worker id belongs to the key that
first registered it, and a worker reports (result, started, progress) only on attempts it was
given. Anything else is refused (a ``Refused`` command for the transport to log and count), a
refused result is acknowledged so the worker's outbox settles it, and nothing of it is stored."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from sim_support import T0, Sim, saved, sent

from distributed_testing.coordinator.core.commands import CloseWorker, Command, Refused
from distributed_testing.coordinator.core.identity import held
from distributed_testing.coordinator.core.policy import Policy
from distributed_testing.coordinator.core.rows import ResultRow, Snapshot, TaskRow, WorkerRow
from distributed_testing.coordinator.core.state import CoordinatorState
from distributed_testing.errors import Conflict, NotFound, PermissionDenied
from distributed_testing.protocol import messages as m
from distributed_testing.retry import Backoff
from distributed_testing.tasks import spec as specs

GRACE = 10.0
POLICY = Policy(worker_grace_s=GRACE, worker_ttl_s=1e9, retry_backoff=Backoff(base_s=0.5, factor=2.0, max_s=30.0,
                                                                             jitter=0.0))


def spec(task_id: str, max_retries: int = 0) -> specs.TaskSpec:
    return specs.parse_tasks({"task_id": task_id, "type": "custom", "config": {"name": "noop"},
                              "max_retries": max_retries})[0]


def training(task_id: str) -> specs.TaskSpec:
    config = {"model": "mlp", "nodes": 2, "batch_size": 64, "steps": 5}
    return specs.parse_tasks({"task_id": task_id, "type": "training", "config": config})[0]


def register(wid: str, running: tuple[tuple[str, int], ...] = ()) -> m.Register:
    return m.Register(worker_id=wid, name=wid, protocol_version=m.PROTOCOL_VERSION, hardware={"memory_gb": 8.0},
                      capabilities=["cpu"], tags=[], max_concurrent=1, memory_gb=8.0,
                      running=[m.TaskRef(t, a) for t, a in running], address=f"10.0.0.{len(wid)}")


def result(task_id: str, attempt: int, status: str = "succeeded", **output: Any) -> m.Results:
    return m.Results([m.TaskResult(task_id=task_id, attempt=attempt, status=status,  # type: ignore[arg-type]
                                   started_at=T0, finished_at=T0 + 1, output=output)])


def refused(cmds: list[Command]) -> list[tuple[str, str, str, int]]:
    return [(c.worker_id, c.what, c.task.task_id, c.task.attempt) for c in cmds if isinstance(c, Refused)]


def acked(cmds: list[Command], worker_id: str) -> list[m.TaskRef]:
    return [ref for _, msg in sent(cmds, m.ResultAck) if _ == worker_id for ref in msg.tasks]


@pytest.fixture
def sim() -> Sim:
    return Sim(POLICY)


# ------------------------------------------------------------------ worker id binding


def test_another_key_cannot_take_a_worker_id_and_the_owner_session_stays(sim: Sim) -> None:
    sim.submit(spec("t1"))
    sim.register(register("w1"))
    owner = sim.state.workers["w1"]
    with pytest.raises(PermissionDenied, match="worker id 'w1' is bound to another key"):
        sim.state.register(register("w1"), "s-impostor", T0 + 1, key_id="key-impostor")
    assert sim.state.workers["w1"] is owner and owner.session_id == sim.sessions["w1"] and owner.connected
    assert sim.task("t1").worker_id == "w1" and sim.task("t1").state == "assigned"


def test_the_owning_key_registers_again_and_keeps_its_tasks(sim: Sim) -> None:
    sim.submit(spec("t1"))
    sim.register(register("w1"))
    old = sim.sessions["w1"]
    cmds = sim.register(register("w1", running=(("t1", 1),)), now=T0 + 1)
    assert [c.session_id for c in cmds if isinstance(c, CloseWorker)] == [old]
    assert sim.task("t1").state == "assigned" and sim.running("w1") == {"t1"}
    assert [r.key_id for r in saved(cmds, WorkerRow)] == ["key-w1"]


def test_the_binding_survives_a_restart(sim: Sim) -> None:
    sim.register(register("w1"))
    fresh = CoordinatorState(POLICY)
    fresh.restore(sim.snapshot(), T0 + 5)
    with pytest.raises(PermissionDenied):
        fresh.register(register("w1"), "s9", T0 + 6, key_id="key-impostor")
    assert fresh.register(register("w1"), "s9", T0 + 6, key_id="key-w1")


def test_a_row_without_a_binding_is_taken_by_the_next_key() -> None:
    """A worker row written before bindings existed (schema 1), or released by an admin."""
    state = CoordinatorState(POLICY)
    state.restore(Snapshot(workers=[WorkerRow("w1", "w1", {}, ["cpu"], [], 1.0, 2.0, "disconnected")]), T0)
    cmds = state.register(register("w1"), "s1", T0, key_id="k-new")
    assert [r.key_id for r in saved(cmds, WorkerRow)] == ["k-new"]
    with pytest.raises(PermissionDenied):
        state.register(register("w1"), "s2", T0, key_id="k-other")


def test_an_admin_releases_a_disconnected_worker_id(sim: Sim) -> None:
    sim.register(register("w1"))
    with pytest.raises(NotFound):
        sim.state.release_worker("nobody", T0)
    with pytest.raises(Conflict, match="connected"):
        sim.state.release_worker("w1", T0)
    sim.disconnect("w1", T0 + 1)
    cmds = sim.run(sim.state.release_worker("w1", T0 + 2))
    assert [r.key_id for r in saved(cmds, WorkerRow)] == [None]
    sim.register(register("w1"), now=T0 + 3, key_id="key-rotated")
    assert sim.state.workers["w1"].key_id == "key-rotated"
    with pytest.raises(PermissionDenied):
        sim.state.register(register("w1"), "s-old", T0 + 4, key_id="key-w1")


# ------------------------------------------------------------------ results


def test_a_result_for_another_workers_task_is_refused_not_stored(sim: Sim) -> None:
    sim.submit(spec("t1"))
    sim.register(register("w1"))
    sim.register(register("w2"))
    cmds = sim.results("w2", result("t1", 1))
    assert refused(cmds) == [("w2", "result", "t1", 1)]
    assert acked(cmds, "w2") == [m.TaskRef("t1", 1)]  # settled in the worker's outbox
    assert saved(cmds, ResultRow) == [] and saved(cmds, TaskRow) == []
    assert sim.task("t1").state == "assigned" and sim.task("t1").outcome is None
    real = sim.results("w1", result("t1", 1, "failed"))
    assert [r.worker_id for r in saved(real, ResultRow)] == ["w1"]
    assert sim.task("t1").outcome is not None and sim.task("t1").outcome["worker_id"] == "w1"


def test_results_for_attempts_never_held_are_refused(sim: Sim) -> None:
    sim.submit(spec("t1", max_retries=2))
    sim.register(register("w1"))
    sim.register(register("w2"))
    cmds = sim.results("w1", m.Results([*result("t1", 0).results, *result("t1", 2).results,
                                        *result("t1", 7).results]))
    assert refused(cmds) == [("w1", "result", "t1", 0), ("w1", "result", "t1", 2), ("w1", "result", "t1", 7)]
    assert saved(cmds, ResultRow) == [] and sim.task("t1").state == "assigned"


def test_a_result_for_a_task_not_yet_submitted_is_refused_and_plants_nothing(sim: Sim) -> None:
    sim.register(register("w1"))
    sim.register(register("w2"))
    cmds = sim.results("w2", result("future", 1, "failed"))
    assert refused(cmds) == [("w2", "result", "future", 1)] and saved(cmds, ResultRow) == []
    assert acked(cmds, "w2") == [m.TaskRef("future", 1)]
    sim.submit(spec("future"))
    holder = sim.task("future").worker_id
    assert holder is not None
    sim.results(holder, result("future", 1))
    assert sim.task("future").outcome is not None and sim.task("future").outcome["worker_id"] == holder
    assert [(r.worker_id, r.status) for r in sim.journal if isinstance(r, ResultRow)] == [(holder, "succeeded")]


def test_a_superseded_attempt_its_worker_held_is_history_never_the_outcome(sim: Sim) -> None:
    sim.submit(spec("t1", max_retries=1))
    sim.register(register("w1"))
    sim.disconnect("w1", T0 + 1)
    sim.register(register("w2"), now=T0 + 2)
    sim.tick(T0 + 1 + GRACE)
    sim.tick(T0 + 2 + GRACE)
    assert (sim.task("t1").attempt, sim.task("t1").worker_id) == (2, "w2")
    sim.register(register("w1"), now=T0 + 20)
    late = sim.results("w1", result("t1", 1))
    assert refused(late) == [] and [(r.attempt, r.worker_id) for r in saved(late, ResultRow)] == [(1, "w1")]
    assert sim.task("t1").outcome is None
    # w2 never held attempt 1, and w1 does not hold attempt 2
    assert refused(sim.results("w2", result("t1", 1))) == [("w2", "result", "t1", 1)]
    assert refused(sim.results("w1", result("t1", 2))) == [("w1", "result", "t1", 2)]
    assert sim.task("t1").outcome is None and sim.task("t1").state == "assigned"


def test_started_and_progress_from_a_non_holder_are_refused(sim: Sim) -> None:
    sim.submit(spec("t1"))
    sim.register(register("w1"))
    sim.register(register("w2"))
    cmds = sim.started("w2", "t1", 1)
    assert refused(cmds) == [("w2", "started", "t1", 1)] and sim.task("t1").state == "assigned"
    prog = sim.state.progress("w2", m.TaskProgress(m.TaskRef("t1", 1), 0.5), T0)
    assert refused(prog) == [("w2", "progress", "t1", 1)]
    assert sim.state.progress("w1", m.TaskProgress(m.TaskRef("t1", 1), 0.5), T0) == []
    assert refused(sim.started("w1", "t1", 1)) == [] and sim.task("t1").state == "running"


def test_the_running_attempts_latest_progress_is_kept_until_it_ends(sim: Sim) -> None:
    sim.submit(spec("t1"))
    sim.register(register("w1"))
    early = sim.state.progress("w1", m.TaskProgress(m.TaskRef("t1", 1), 0.1, "before started"), T0)
    assert early == [] and sim.task("t1").progress_view() is None  # assigned, not yet running
    sim.started("w1", "t1", 1)
    for done in (1, 2):
        sim.state.progress("w1", m.TaskProgress(m.TaskRef("t1", 1), done / 3, f"mlp b{done} fp32: 0.12 ms ({done} of 3)"),
                           T0 + done)
    assert sim.task("t1").progress_view() == {"fraction": 2 / 3, "message": "mlp b2 fp32: 0.12 ms (2 of 3)",
                                              "at": T0 + 2}
    sim.results("w1", result("t1", 1))
    assert sim.task("t1").state == "succeeded" and sim.task("t1").progress_view() is None


def test_a_gang_result_from_a_non_member_is_refused(sim: Sim) -> None:
    for wid in ("w1", "w22", "w333"):
        sim.register(register(wid))
    sim.submit(training("g"))
    members = list(sim.task("g").gang.members)
    outsider = next(w for w in ("w1", "w22", "w333") if w not in members)
    cmds = sim.results(outsider, result("g", 1, node_rank=0))
    assert refused(cmds) == [(outsider, "result", "g", 1)] and saved(cmds, ResultRow) == []
    assert acked(cmds, outsider) == [m.TaskRef("g", 1)]
    assert sim.task("g").gang.held == {} and sim.task("g").state == "assigned"
    # a member's own result is held (acknowledged once the attempt's row is saved)
    assert refused(sim.results(members[1], result("g", 1, node_rank=1))) == []
    assert set(sim.task("g").gang.held) == {members[1]}


def test_held_reads_single_and_gang_assignments_from_history() -> None:
    history = [{"to": "pending", "attempt": 0}, {"to": "assigned", "attempt": 1, "worker_id": "a"},
               {"to": "pending", "attempt": 1}, {"to": "assigned", "attempt": 2, "worker_id": "b",
                                                 "gang": {"members": ["b", "c"]}}]
    assert held(history, "a", 1) and held(history, "b", 2) and held(history, "c", 2)
    assert not held(history, "a", 2) and not held(history, "c", 1) and not held(history, "a", 3)
    # a decoded row round-trips the same
    assert held(msgspec.json.decode(msgspec.json.encode(history)), "c", 2)
