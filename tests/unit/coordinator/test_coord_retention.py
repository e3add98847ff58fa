"""Workers are forgotten after ``Policy.worker_retention_s`` (``--worker-retention``), in the pure
state machine: only once disconnected, past the reconnect grace and not heard from for the
retention; the forgetting is saved as a ``FORGOTTEN`` worker record (which deletes the store's
row); the id is then free for any key; 0 keeps every worker; the tasks it ran stay."""

from __future__ import annotations

from sim_support import T0, Sim, saved

from distributed_testing.coordinator.core.policy import Policy
from distributed_testing.coordinator.core.rows import FORGOTTEN, Snapshot, WorkerRow
from distributed_testing.coordinator.core.state import CoordinatorState
from distributed_testing.coordinator.events import EventHub
from distributed_testing.protocol import messages as m
from distributed_testing.retry import Backoff
from distributed_testing.tasks import spec as specs

GRACE, RETENTION = 10.0, 100.0


def policy(retention: float = RETENTION) -> Policy:
    return Policy(worker_grace_s=GRACE, worker_ttl_s=1e9, worker_retention_s=retention,
                  retry_backoff=Backoff(base_s=0.5, factor=2.0, max_s=30.0, jitter=0.0))


def register(wid: str) -> m.Register:
    return m.Register(worker_id=wid, name=wid, protocol_version=m.PROTOCOL_VERSION, hardware={"memory_gb": 8.0},
                      capabilities=["cpu"], tags=[], max_concurrent=1, memory_gb=8.0)


def noop(task_id: str) -> specs.TaskSpec:
    return specs.parse_tasks({"task_id": task_id, "type": "custom", "config": {"name": "noop"}})[0]


def test_a_disconnected_worker_is_forgotten_after_the_retention_from_its_last_frame() -> None:
    sim = Sim(policy())
    sim.register(register("gone"))
    sim.register(register("stays"))
    sim.disconnect("gone", T0 + 1)
    assert sim.state.workers["gone"].state == "disconnected"
    assert not saved(sim.tick(T0 + RETENTION - 1), WorkerRow)
    assert sim.state.worker_ids() == ["gone", "stays"]
    cmds = sim.tick(T0 + RETENTION)  # counted from last_seen (the registration at T0)
    assert [(r.worker_id, r.state) for r in saved(cmds, WorkerRow)] == [("gone", FORGOTTEN)]
    assert sim.state.worker_ids() == ["stays"] and "gone" not in sim.state.workers
    hub = EventHub()  # the change feed's last word on it (docs/operations.md)
    sub = hub.subscribe(None)
    hub.publish_records(saved(cmds, WorkerRow))
    event = sub.queue.get_nowait()
    assert (event.kind, event.data["worker_id"], event.data["state"]) == ("worker", "gone", FORGOTTEN)
    assert not saved(sim.tick(T0 + 10 * RETENTION), WorkerRow)  # "stays" is connected: never forgotten
    sim.register(register("gone"), T0 + 10 * RETENTION, key_id="another-key")  # its id is free again
    assert sim.state.workers["gone"].key_id == "another-key" and sim.state.worker_ids() == ["gone", "stays"]


def test_a_worker_is_kept_through_its_grace_and_its_task_stays_on_record() -> None:
    sim = Sim(policy(retention=1.0))
    sim.submit(noop("t1"))
    sim.register(register("w1"))
    assert sim.task("t1").worker_id == "w1"
    sim.disconnect("w1", T0 + 1)
    sim.tick(T0 + 5)  # past the retention, inside the grace: it may still come back for its task
    assert "w1" in sim.state.workers
    cmds = sim.tick(T0 + 1 + GRACE)
    assert [r.state for r in saved(cmds, WorkerRow)] == [FORGOTTEN] and "w1" not in sim.state.workers
    t = sim.task("t1")
    assert any(h.get("worker_id") == "w1" for h in t.history), t.history


def test_zero_retention_keeps_every_worker() -> None:
    sim = Sim(policy(retention=0.0))
    sim.register(register("w1"))
    sim.disconnect("w1", T0 + 1)
    assert not saved(sim.tick(T0 + 1e9), WorkerRow) and sim.state.workers["w1"].state == "disconnected"


def test_a_forgotten_row_a_store_kept_is_not_restored() -> None:
    rows = [WorkerRow(worker_id=w, name=w, hardware={}, capabilities=["cpu"], tags=[], first_seen=T0, last_seen=T0,
                      state=s) for w, s in (("old", FORGOTTEN), ("kept", "disconnected"))]
    state = CoordinatorState(policy())
    state.restore(Snapshot(workers=rows), T0)
    assert state.worker_ids() == ["kept"]
