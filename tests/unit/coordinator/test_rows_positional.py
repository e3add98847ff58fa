"""Rows and messages built positionally on the hot path (``Task.row``, ``changes.change_of``,
``Task.assignment``, the state's result rows) carry every field where its name says: a field added
or reordered in a record type fails here, not in a replay."""

from __future__ import annotations

import msgspec

from distributed_testing.coordinator.core.commands import Save
from distributed_testing.coordinator.core.entities import Task
from distributed_testing.coordinator.core.rows import ResultRow, TaskRow
from distributed_testing.coordinator.core.state import CoordinatorState
from distributed_testing.coordinator.store.changes import TaskChange, change_of
from distributed_testing.protocol import messages as m
from distributed_testing.tasks.spec import parse_tasks, spec_to_dict


def test_task_row_and_change_of_match_their_fields_by_name() -> None:
    (spec,) = parse_tasks([{"task_id": "t1", "type": "custom", "config": {"name": "noop"}, "priority": 7,
                            "run_id": "run-0123456789ab"}])
    t = Task(spec=spec, spec_dict=spec_to_dict(spec), task_id="t1", type="custom", digest="sha256:d", seq=42,
             submitted_at=1.5, state="running", attempt=3, worker_id="w9", updated_at=2.5, retries_used=2,
             not_before=9.5, history=[{"to": "pending"}, {"to": "running"}], outcome={"status": "x"},
             submitted_by="k1")
    row = t.row()
    fields = {f: getattr(t, f) for f in ("task_id", "type", "state", "attempt", "submitted_at", "updated_at", "digest",
                                         "worker_id", "retries_used", "not_before", "history", "outcome", "seq",
                                         "submitted_by")}
    assert row == TaskRow(**fields, priority=7, spec=t.spec_dict, run_id="run-0123456789ab")
    assert row.history is not t.history  # a snapshot: later transitions do not change a saved row
    assert set(msgspec.structs.asdict(row)) == set(fields) | {"priority", "spec", "reason", "run_id"}

    change = change_of(msgspec.structs.replace(row, reason="why"), 1)
    assert change == TaskChange(task_id="t1", state="running", attempt=3, updated_at=2.5, base=1,
                                entries=[{"to": "running"}], worker_id="w9", reason="why", retries_used=2,
                                not_before=9.5, outcome={"status": "x"}, seq=42)


def test_assignment_and_result_row_match_their_fields_by_name() -> None:
    """``Task.assignment`` and the state's result rows, also built positionally."""
    (spec,) = parse_tasks([{"task_id": "t2", "type": "custom", "config": {"name": "noop"}, "timeout_s": 7.5,
                            "max_memory_mb": 300, "run_id": "run-0123456789ab"}])
    t = Task(spec=spec, spec_dict=spec_to_dict(spec), task_id="t2", type="custom", digest="d", seq=1, submitted_at=1.0,
             attempt=4, submitted_by="k2")
    gang = m.GangAssignment(node_rank=1, nnodes=2, master_addr="h", master_port=5, all_cuda=False, members=["a", "b"])
    assert t.assignment(gang) == m.TaskAssignment(
        task_id="t2", attempt=4, type="custom", config={"name": "noop"}, timeout_s=7.5, max_memory_mb=300, cache=False,
        gang=gang, bundle=None, python=[], submitted_by="k2", run_id="run-0123456789ab")

    state = CoordinatorState()
    reg = m.Register(worker_id="w1", name="w1", protocol_version=m.PROTOCOL_VERSION, hardware={}, capabilities=["cpu"],
                     tags=[], max_concurrent=1, handlers=["noop"])
    state.register(reg, "s1", 1.0, key_id="k")
    state.submit([spec], 1.0)
    result = m.TaskResult("t2", 1, "failed", 2.0, 3.0, {"o": 1}, "boom", "w1")
    saved = [c.record for c in state.results("w1", m.Results([result]), 4.0)
             if isinstance(c, Save) and isinstance(c.record, ResultRow)]
    assert saved == [ResultRow(task_id="t2", attempt=1, worker_id="w1", status="failed", started_at=2.0, finished_at=3.0,
                               received_at=4.0, output={"o": 1}, error="boom", task_type="custom")]
