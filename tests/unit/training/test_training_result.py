from typing import Any

import pytest

from distributed_testing.coordinator.core.gang import scaling_efficiency
from distributed_testing.training.result import build_result

CONFIG = {
    "model": "mlp",
    "nodes": 2,
    "nproc_per_node": 1,
    "batch_size": 10,
    "steps": 4,
    "warmup_steps": 1,
    "backend": "gloo",
    "precision": "fp32",
    "load_balance": "proportional",
    "rebalance_interval": 0,
}


def rank(index: int, measured_s: float, loss: float, local: int) -> dict[str, Any]:
    return {"rank": index, "measured_s": measured_s, "last_loss": loss, "last_local_batch": local}


def test_build_result_uses_the_slowest_rank_and_weights_the_loss() -> None:
    result = build_result(CONFIG, [rank(1, 2.0, 1.0, 4), rank(0, 1.5, 2.0, 6)], [(-1, [5, 5]), (0, [6, 4])])
    assert result["global_samples_per_s"] == pytest.approx(10 * 4 / 2.0)
    assert result["measured_s"] == 2.0
    assert result["final_loss"] == pytest.approx((2.0 * 6 + 1.0 * 4) / 10)
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    assert result["shares"] == {
        "initial": [5, 5],
        "final": [6, 4],
        "history": [{"after_step": -1, "shares": [5, 5]}, {"after_step": 0, "shares": [6, 4]}],
    }
    assert (result["world_size"], result["nnodes"], result["global_batch"]) == (2, 2, 10)


def test_build_result_rejects_missing_ranks() -> None:
    with pytest.raises(ValueError, match="ranks 0..1"):
        build_result(CONFIG, [rank(0, 1.0, 1.0, 5), rank(2, 1.0, 1.0, 5)], [(-1, [5, 5])])


def summary(nnodes: int, sps: float, **overrides: Any) -> dict[str, Any]:
    return {"model": "mlp", "global_batch": 64, "precision": "fp32", "nnodes": nnodes,
            "global_samples_per_s": sps, **overrides}  # fmt: skip


def test_scaling_efficiency() -> None:
    assert scaling_efficiency(summary(2, 180.0), summary(1, 100.0)) == pytest.approx(0.9)
    assert scaling_efficiency(summary(4, 400.0), summary(1, 100.0)) == pytest.approx(1.0)


def test_scaling_efficiency_refuses_different_runs() -> None:
    with pytest.raises(ValueError, match="global_batch"):
        scaling_efficiency(summary(2, 180.0, global_batch=128), summary(1, 100.0))
    with pytest.raises(ValueError, match="baseline"):
        scaling_efficiency(summary(2, 180.0), summary(1, 0.0))
