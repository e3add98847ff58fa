"""``CoordinatorState.drain_worker``: pure, ``now`` passed in, commands out."""

from __future__ import annotations

import pytest

from distributed_testing.coordinator.core.commands import Save, Send
from distributed_testing.coordinator.core.rows import WorkerRow
from distributed_testing.coordinator.core.state import CoordinatorState
from distributed_testing.errors import Conflict, NotFound
from distributed_testing.protocol import messages as m
from distributed_testing.tasks import spec as specs

T0 = 1_000.0


def register(state: CoordinatorState, worker_id: str, slots: int = 2) -> None:
    reg = m.Register(worker_id=worker_id, name=worker_id, protocol_version=m.PROTOCOL_VERSION, hardware={},
                     capabilities=["cpu"], tags=[], max_concurrent=slots)
    state.register(reg, f"session-{worker_id}", T0, key_id=f"key-{worker_id}")


def submit(state: CoordinatorState, task_id: str, now: float) -> list[object]:
    _, cmds = state.submit(specs.parse_tasks({"task_id": task_id, "type": "custom", "config": {"name": "noop"}}), now)
    return list(cmds)


def test_drain_stops_dispatch_and_sends_drain_after_the_save() -> None:
    state = CoordinatorState()
    register(state, "w1")
    submit(state, "running", T0)
    assert state.tasks["running"].worker_id == "w1"

    cmds = state.drain_worker("w1", "maintenance", 12.5, T0 + 1)
    assert len(cmds) == 2
    save, send = cmds
    assert isinstance(save, Save) and isinstance(save.record, WorkerRow) and save.record.state == "draining"
    assert send == Send("w1", m.Drain("maintenance", 12.5))
    w = state.workers["w1"]
    assert (w.health, w.health_reason, w.view.accepting) == ("draining", "maintenance", False)

    assert not [c for c in submit(state, "later", T0 + 2) if isinstance(c, Send)]
    assert state.tasks["later"].state == "pending"  # a free slot, but the worker takes nothing new
    assert state.tasks["running"].worker_id == "w1"  # what it runs is left alone

    handed = m.Goodbye("drain timeout after 12.5s (maintenance)", handed_back=[state.tasks["running"].ref()])
    state.goodbye("w1", handed, T0 + 15)
    t = state.tasks["running"]
    assert (t.state, t.retries_used, t.worker_id) == ("pending", 0, None)

    register(state, "w2")  # both go to the next worker
    state.dispatch(T0 + 16)
    assert {state.tasks[i].worker_id for i in ("running", "later")} == {"w2"}


def test_unknown_worker_is_not_found_and_a_disconnected_one_is_a_conflict() -> None:
    state = CoordinatorState()
    with pytest.raises(NotFound, match="no worker 'ghost'"):
        state.drain_worker("ghost", "x", 1.0, T0)
    register(state, "w1")
    state.disconnect("w1", "session-w1", T0 + 1)
    with pytest.raises(Conflict, match="w1 is not connected"):
        state.drain_worker("w1", "x", 1.0, T0 + 2)
    assert state.workers["w1"].health == "ready"
