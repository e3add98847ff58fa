"""Per-key quotas in the scheduling core (``coordinator/core/quota.py``): a submission past either cap
is refused whole with RateLimited, a task stops counting when it ends, resubmissions cost nothing,
and a restore (a restart, or an HA member taking over) rebuilds the counts from the active tasks."""

from __future__ import annotations

from typing import Any

import pytest
from sim_support import T0, Sim

from distributed_testing.coordinator.core.policy import Policy
from distributed_testing.coordinator.core.quota import RETRY_AFTER_S, payload_size
from distributed_testing.coordinator.core.state import CoordinatorState
from distributed_testing.errors import RateLimited
from distributed_testing.tasks import spec as specs


def spec(task_id: str, blob: str = "") -> specs.TaskSpec:
    doc: dict[str, Any] = {"task_id": task_id, "type": "custom", "config": {"name": "noop", "parameters": {"b": blob}}}
    return specs.parse_tasks(doc)[0]


def test_a_key_past_its_task_quota_is_refused_whole_until_its_tasks_end() -> None:
    state = CoordinatorState(Policy(max_queued_per_key=3))
    state.submit([spec("a"), spec("b")], T0, submitted_by="k1")
    with pytest.raises(RateLimited) as err:
        state.submit([spec("c"), spec("d")], T0, submitted_by="k1")
    assert err.value.retry_after_s == RETRY_AFTER_S and "--max-queued-per-key" in str(err.value)
    assert "c" not in state.tasks  # nothing of a refused submission is kept
    state.submit([spec("a"), spec("b"), spec("c")], T0, submitted_by="k1")  # a resubmission costs nothing
    state.submit([spec("x"), spec("y"), spec("z")], T0, submitted_by="k2")  # another key has its own
    state.cancel("a", T0)
    state.submit([spec("d")], T0, submitted_by="k1")
    assert state.quota.usage("k1")[0] == 3


def test_a_key_past_its_payload_quota_is_refused() -> None:
    big = "x" * 4000
    size = payload_size(specs.spec_to_dict(specs.with_id(spec("p1", big))))
    state = CoordinatorState(Policy(max_payload_bytes_per_key=2 * size + 5000))
    state.submit([spec("p1", big), spec("p2", big)], T0, submitted_by="k1")
    with pytest.raises(RateLimited, match="--max-payload-mb-per-key"):
        state.submit([spec("p3", big)], T0, submitted_by="k1")
    state.submit([spec("small")], T0, submitted_by="k1")  # what still fits is taken


def test_a_restore_counts_the_active_tasks_again() -> None:
    """What keeps the quota across an HA takeover: the new leader restores the active work."""
    sim = Sim(Policy(max_queued_per_key=2))
    sim.state.submit([spec("a"), spec("b")], T0, submitted_by="k1")
    sim.run([])
    sim.journal += [t.row() for t in sim.state.tasks.values()]
    taken_over = CoordinatorState(Policy(max_queued_per_key=2))
    taken_over.restore(sim.snapshot(), T0 + 1)
    assert taken_over.quota.usage("k1") == sim.state.quota.usage("k1")
    with pytest.raises(RateLimited):
        taken_over.submit([spec("c")], T0 + 1, submitted_by="k1")
