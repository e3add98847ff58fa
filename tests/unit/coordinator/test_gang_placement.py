"""Gang placement pieces on their own: picking members, the pending reason, rendezvous ports and
the scaling-efficiency baseline. Pure functions, no state machine."""

from __future__ import annotations

import pytest

from distributed_testing.coordinator.core.entities import Gang
from distributed_testing.coordinator.core.gang import Baselines, PortPool, nodes_summary, training_summary
from distributed_testing.coordinator.core.placement import (
    WorkerView,
    describe,
    gang_pending_reason,
    pick_gang,
    requirement_key,
)
from distributed_testing.protocol import messages as m
from distributed_testing.tasks.kinds import BUILTIN
from distributed_testing.tasks.spec import Requirements

ANY = requirement_key(Requirements())
CUDA = requirement_key(Requirements(hardware=["cuda"], tags=["ddp"]))


def worker(wid: str, *, slots: int = 1, running: int = 0, caps: tuple[str, ...] = ("cpu",),
           tags: tuple[str, ...] = (), accepting: bool = True) -> WorkerView:
    return WorkerView(wid, frozenset(caps), frozenset(tags), 8.0, slots,
                      running={f"t{i}" for i in range(running)}, accepting=accepting)


def test_pick_gang_is_all_or_nothing_and_ordered() -> None:
    ws = [worker("b", slots=2), worker("a"), worker("c", slots=3, running=1), worker("d", running=1)]
    assert [w.worker_id for w in pick_gang(ANY, 3, ws) or []] == ["b", "c", "a"]
    assert pick_gang(ANY, 4, ws) is None  # d has no free slot: no partial answer


def test_pick_gang_only_takes_eligible_workers() -> None:
    ws = [worker("a", caps=("cpu", "cuda"), tags=("ddp",)), worker("b", caps=("cpu", "cuda")),
          worker("c", caps=("cpu", "cuda"), tags=("ddp",)), worker("d", caps=("cpu", "cuda"), tags=("ddp",), accepting=False)]
    assert [w.worker_id for w in pick_gang(CUDA, 2, ws) or []] == ["a", "c"]
    assert pick_gang(CUDA, 3, ws) is None


def test_gang_pending_reasons() -> None:
    assert describe(ANY) == "" and describe(CUDA) == "hardware cuda, tags ddp"
    assert gang_pending_reason(CUDA, 3, [worker("a", caps=("cuda",), tags=("ddp",)), worker("b")]) == \
        "needs 3 worker(s) matching hardware cuda, tags ddp, 1 connected"
    assert gang_pending_reason(ANY, 2, [worker("a"), worker("b", accepting=False)]) == \
        "needs 2 worker(s), 2 connected but only 1 accepting work (others constrained or draining)"
    assert gang_pending_reason(ANY, 2, [worker("a"), worker("b", running=1)]) == \
        "needs 2 worker(s) with a free slot at once; 1 of 2 have one now"


def test_training_needs_cuda_only_for_nccl_or_fp16() -> None:
    base = {"model": "mlp", "nodes": 2, "batch_size": 8, "steps": 1}
    training, bench, custom = BUILTIN.get("training"), BUILTIN.get("benchmark"), BUILTIN.get("custom")
    assert training.hardware(training.decode(base)) == ()
    assert training.hardware(training.decode({**base, "backend": "auto"})) == ()
    assert training.hardware(training.decode({**base, "backend": "nccl"})) == ("cuda",)
    assert training.hardware(training.decode({**base, "precision": "fp16"})) == ("cuda",)
    assert training.gang_size(training.decode(base)) == 2 and bench.gang_size(bench.decode({"model": "mlp"})) == 0
    assert custom.gang_size(custom.decode({"name": "noop"})) == 0


def test_port_pool_unique_per_address_rotating_and_bounded() -> None:
    pool = PortPool(29500, 29502)
    assert [pool.take("a"), pool.take("a"), pool.take("b")] == [29500, 29501, 29500]
    pool.release("a", 29500)
    assert pool.take("a") == 29502  # the cursor moves on before reusing a released port
    assert pool.take("a") == 29500
    assert pool.take("a") is None  # all three held on "a"
    pool.release("a", 29501)
    assert pool.take("a") == 29501 and pool.in_use("a") == {29500, 29501, 29502}
    pool.hold("c", 29501)
    assert pool.take("c") == 29500 and pool.take("c") == 29502
    with pytest.raises(ValueError):
        PortPool(0, 10)


def test_training_summary_reads_node_zero_metrics_defensively() -> None:
    good = {"metrics": {"model": "mlp", "global_batch": 64, "precision": "fp32", "nnodes": 2,
                        "global_samples_per_s": 10.5}}
    assert training_summary(good) == {"model": "mlp", "global_batch": 64, "precision": "fp32", "nnodes": 2,
                                      "global_samples_per_s": 10.5}
    for bad in ({}, {"metrics": None}, {"metrics": {"model": "mlp"}},
                {"metrics": {**good["metrics"], "global_samples_per_s": "fast"}},
                {"metrics": {**good["metrics"], "global_samples_per_s": float("nan")}},
                {"metrics": {**good["metrics"], "nnodes": 0}}):
        assert training_summary(bad) is None


def test_baselines_keep_the_latest_single_node_run_per_key() -> None:
    b = Baselines()
    s1 = {"model": "mlp", "global_batch": 64, "precision": "fp32", "nnodes": 1, "global_samples_per_s": 100.0}
    b.record("old", 1, s1, at=10.0)
    b.record("new", 2, {**s1, "global_samples_per_s": 150.0}, at=20.0)
    b.record("older", 1, {**s1, "global_samples_per_s": 1.0}, at=5.0)  # arrives late (restore order)
    b.record("multi", 1, {**s1, "nnodes": 2}, at=30.0)  # never a baseline
    multi = {**s1, "nnodes": 3, "global_samples_per_s": 360.0}
    eff, used = b.scaling(multi)
    assert eff == pytest.approx(0.8) and used == {"task_id": "new", "attempt": 2, "global_samples_per_s": 150.0, "nnodes": 1}
    eff, why = b.scaling({**multi, "global_batch": 128})
    assert eff is None and "batch_size 128" in str(why) and "nodes=1" in str(why)
    eff, why = b.scaling(s1)
    assert eff is None and "is the baseline" in str(why)


def test_nodes_summary_covers_every_rank() -> None:
    g = Gang(2)
    g.place(["w1", "w2"], ["10.0.0.1", "10.0.0.2"], 29500, False, now=1.0)
    g.held["w2"] = m.TaskResult("t", 1, "error", 1.0, 3.0, output={"wall_s": 1.25}, error="peer gone")
    assert nodes_summary(g, {"w1": "stopped: peer gone"}) == [
        {"node_rank": 0, "worker_id": "w1", "address": "10.0.0.1", "status": None, "wall_s": None,
         "error": "stopped: peer gone"},
        {"node_rank": 1, "worker_id": "w2", "address": "10.0.0.2", "status": "error", "wall_s": 1.25,
         "error": "peer gone"},
    ]
    assert g.assignment(1) == m.GangAssignment(1, 2, "10.0.0.1", 29500, False, ["w1", "w2"])
