"""Placement: who may run a task, who gets it, and the reason given when nobody does."""

from __future__ import annotations

import pytest

from distributed_testing.coordinator.core.placement import (
    WorkerView,
    pending_reason,
    pick_worker,
    requirement_key,
    unmet,
)
from distributed_testing.tasks.spec import Requirements

ANY = requirement_key(Requirements())


def worker(
    wid: str,
    *,
    caps: tuple[str, ...] = ("cpu",),
    tags: tuple[str, ...] = (),
    memory_gb: float = 8.0,
    slots: int = 1,
    running: int = 0,
    accepting: bool = True,
) -> WorkerView:
    return WorkerView(
        wid,
        frozenset(caps),
        frozenset(tags),
        memory_gb,
        slots,
        running={f"{wid}-t{i}" for i in range(running)},
        accepting=accepting,
    )


def test_requirement_key_ignores_order_and_duplicates() -> None:
    a = requirement_key(Requirements(hardware=["cuda", "cpu", "cuda"], tags=["b", "a"], min_memory_gb=4))
    b = requirement_key(Requirements(hardware=["cpu", "cuda"], tags=["a", "b", "a"], min_memory_gb=4.0))
    assert a == b
    assert requirement_key(Requirements(min_memory_gb=None)) == requirement_key(Requirements(min_memory_gb=0))


def test_pick_prefers_most_free_slots() -> None:
    ws = [worker("a", slots=4, running=3), worker("b", slots=4, running=1), worker("c", slots=2)]
    assert pick_worker(ANY, ws).worker_id == "b"  # type: ignore[union-attr]


def test_pick_breaks_ties_by_lowest_worker_id_whatever_the_order() -> None:
    ws = [worker("w3", slots=2), worker("w1", slots=2), worker("w2", slots=2)]
    assert pick_worker(ANY, ws).worker_id == "w1"  # type: ignore[union-attr]
    assert pick_worker(ANY, list(reversed(ws))).worker_id == "w1"  # type: ignore[union-attr]


def test_pick_skips_full_draining_and_ineligible_workers() -> None:
    key = requirement_key(Requirements(hardware=["cuda"], tags=["big"], min_memory_gb=32))
    ws = [
        worker("full", caps=("cuda",), tags=("big",), memory_gb=64, slots=1, running=1),
        worker("draining", caps=("cuda",), tags=("big",), memory_gb=64, slots=8, accepting=False),
        worker("cpu", tags=("big",), memory_gb=64, slots=8),
        worker("untagged", caps=("cuda",), memory_gb=64, slots=8),
        worker("small", caps=("cuda",), tags=("big",), memory_gb=16, slots=8),
    ]
    assert pick_worker(key, ws) is None
    ok = worker("ok", caps=("cpu", "cuda"), tags=("big", "x"), memory_gb=32, slots=1)
    assert pick_worker(key, [*ws, ok]) is ok


def test_pick_with_no_workers() -> None:
    assert pick_worker(ANY, []) is None


def test_unmet_lists_everything_missing() -> None:
    key = requirement_key(Requirements(hardware=["cuda", "rocm"], tags=["t1"], min_memory_gb=16))
    assert unmet(key, worker("w", memory_gb=4)) == [
        "hardware cuda",
        "hardware rocm",
        "tag t1",
        "16 GB memory (has 4.0)",
    ]
    assert unmet(key, worker("w", caps=("cuda", "rocm"), tags=("t1",), memory_gb=16)) == []


def test_free_slots() -> None:
    assert worker("w", slots=3, running=1).free_slots == 2
    assert worker("w", slots=1, running=2).free_slots == 0  # never negative
    assert worker("w", slots=3, accepting=False).free_slots == 0


def test_reason_no_workers() -> None:
    assert pending_reason(ANY, []) == "no worker is connected"


def test_reason_nobody_eligible_names_each_worker_and_what_it_lacks() -> None:
    key = requirement_key(Requirements(hardware=["cuda"], tags=["llm"]))
    reason = pending_reason(key, [worker("cpu-1"), worker("gpu-1", caps=("cuda",))])
    assert reason.startswith("no connected worker satisfies the requirements")
    assert "cpu-1 lacks hardware cuda, tag llm" in reason
    assert "gpu-1 lacks tag llm" in reason


def test_reason_nobody_eligible_with_many_workers_stays_short() -> None:
    key = requirement_key(Requirements(hardware=["cuda"]))
    reason = pending_reason(key, [worker(f"w{i}") for i in range(50)])
    assert reason.count("lacks") == 5


def test_reason_all_eligible_busy() -> None:
    cpu = requirement_key(Requirements(hardware=["cpu"]))
    ws = [worker("a", slots=1, running=1), worker("b", slots=2, running=2), worker("gpu-only", caps=("cuda",))]
    assert pending_reason(cpu, ws) == "waiting for a free slot on 2 eligible worker(s)"


def test_reason_all_eligible_constrained() -> None:
    ws = [worker("a", accepting=False), worker("b", accepting=False)]
    assert pending_reason(ANY, ws) == "all 2 eligible worker(s) are constrained or draining"


@pytest.mark.parametrize("memory_gb", [16.0, 64.0])
def test_min_memory_is_inclusive(memory_gb: float) -> None:
    key = requirement_key(Requirements(min_memory_gb=16))
    assert unmet(key, worker("w", memory_gb=memory_gb)) == []


# ------------------------------------------------------------------ memory offered by workers


def test_task_memory_limit_needs_a_worker_offering_that_much() -> None:
    key = requirement_key(Requirements(), max_memory_mb=2000)
    small = worker("small")
    small.available_memory_mb = 1500.0
    assert unmet(key, small) == ["2000 MB memory for the task (offers 1500 MB after its memory buffer)"]
    assert pick_worker(key, [small]) is None
    assert "small lacks 2000 MB memory for the task" in pending_reason(key, [small])
    big = worker("big")
    big.available_memory_mb = 2000.0
    assert pick_worker(key, [small, big]) is big


def test_workers_not_reporting_memory_and_tasks_without_a_limit_are_unaffected() -> None:
    silent = worker("silent")  # no --memory-buffer: available_memory_mb stays None
    assert unmet(requirement_key(Requirements(), max_memory_mb=10**6), silent) == []
    busy = worker("busy")
    busy.available_memory_mb = 0.0
    assert unmet(ANY, busy) == []


def test_requirement_key_separates_memory_limits() -> None:
    assert requirement_key(Requirements(), max_memory_mb=None) == ANY
    assert requirement_key(Requirements(), max_memory_mb=512) != ANY


@pytest.mark.parametrize(("hardware", "tags", "implied"), [
    ([], [], ()), ([], [], ("cuda",)), (["cuda", "cpu", "cuda"], [], ()), ([], ["b", "a", "b"], ()),
    (["cpu"], ["x"], ("cuda", "cpu")),
])
def test_requirement_key_is_sorted_and_unique_with_or_without_requirements(
        hardware: list[str], tags: list[str], implied: tuple[str, ...]) -> None:
    """The key's hardware and tags, whether the task names any (the empty case takes no sets)."""
    key = requirement_key(Requirements(hardware=hardware, tags=tags), implied)  # type: ignore[arg-type]
    assert key[0] == tuple(sorted(set(hardware) | set(implied)))
    assert key[1] == tuple(sorted(set(tags)))
    assert key == requirement_key(Requirements(hardware=list(reversed(hardware)), tags=list(reversed(tags))),  # type: ignore[arg-type]
                                  tuple(reversed(implied)))
