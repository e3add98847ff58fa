"""One event that changes a task twice journals only its final row, with the whole history."""

from distributed_testing.coordinator.core.commands import Save
from distributed_testing.coordinator.core.rows import MetaRow, TaskRow
from distributed_testing.coordinator.core.state import CoordinatorState
from distributed_testing.coordinator.runtime import _coalesce
from distributed_testing.protocol import messages as m
from distributed_testing.tasks.spec import parse_tasks


def test_submit_that_dispatches_at_once_journals_one_row_per_task() -> None:
    s = CoordinatorState()
    s.register(m.Register(worker_id="w", name="w", protocol_version=1, hardware={}, capabilities=["cpu"],
                          tags=[], max_concurrent=4), "sess", 0.0, key_id="k")
    _, cmds = s.submit(parse_tasks([{"task_id": f"t{i}", "type": "custom", "config": {"name": "noop"}} for i in range(3)]), 1.0)
    rows = [c.record for c in cmds if isinstance(c, Save)]
    assert len(rows) == 6  # pending + assigned for each
    kept = _coalesce([*rows, MetaRow("k", "v")])
    tasks = [r for r in kept if isinstance(r, TaskRow)]
    assert [(r.task_id, r.state) for r in tasks] == [("t0", "assigned"), ("t1", "assigned"), ("t2", "assigned")]
    assert [h["to"] for h in tasks[0].history] == ["pending", "assigned"]
    assert isinstance(kept[-1], MetaRow)
