"""The training result document and scaling efficiency. Pure: no torch, no I/O.

Result (written by global rank 0, returned by ``launch`` on node 0 as ``metrics``)::

    {"kind": "training", "model": str, "backend": "gloo"|"nccl", "precision": str,
     "load_balance": str, "rebalance_interval": int, "nnodes": int, "world_size": int,
     "global_batch": int, "steps": int, "warmup_steps": int,
     "global_samples_per_s": float,   # global_batch * steps / slowest rank's measured time
     "measured_s": float,             # that slowest measured time
     "final_loss": float,             # mean loss of the last step over the global batch
     "shares": {"initial": [int], "final": [int],
                "history": [{"after_step": int, "shares": [int]}]},   # step -1: the start
     "ranks": [{"rank", "node_rank", "local_rank", "hostname", "device",
                "samples", "steps", "measured_s",
                "samples_per_s",            # samples this rank processed / its measured time
                "compute_samples_per_s",    # samples / compute time (its capacity)
                "mean_step_s", "mean_compute_s",
                "allreduce_wait_s", "mean_allreduce_wait_s",   # time blocked in gradient all-reduce
                "rebalance_gather_s",       # time spent exchanging throughputs to rebalance
                "peak_memory_bytes", "peak_memory_kind",       # "cuda_max_allocated" | "process_max_rss"
                "last_loss", "last_local_batch"}, ...]}       # in rank order
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

RESULT_KIND = "training"


def build_result(
    config: Mapping[str, Any],
    ranks: Sequence[Mapping[str, Any]],
    history: Sequence[tuple[int, list[int]]],
) -> dict[str, Any]:
    """Assemble the result from the resolved config, per-rank summaries and the share history."""
    ordered = sorted(ranks, key=lambda r: int(r["rank"]))
    if [int(r["rank"]) for r in ordered] != list(range(len(ordered))):
        raise ValueError(f"rank summaries are not ranks 0..{len(ordered) - 1}")
    global_batch = int(config["batch_size"])
    steps = int(config["steps"])
    measured_s = max(float(r["measured_s"]) for r in ordered)
    weighted_loss = sum(float(r["last_loss"]) * int(r["last_local_batch"]) for r in ordered)
    return {
        "kind": RESULT_KIND,
        "model": config["model"],
        "backend": config["backend"],
        "precision": config["precision"],
        "load_balance": config["load_balance"],
        "rebalance_interval": config["rebalance_interval"],
        "nnodes": int(config["nodes"]),
        "world_size": len(ordered),
        "global_batch": global_batch,
        "steps": steps,
        "warmup_steps": int(config["warmup_steps"]),
        "global_samples_per_s": global_batch * steps / measured_s if measured_s > 0 else 0.0,
        "measured_s": measured_s,
        "final_loss": weighted_loss / global_batch,
        "shares": {
            "initial": list(history[0][1]),
            "final": list(history[-1][1]),
            "history": [{"after_step": step, "shares": list(s)} for step, s in history],
        },
        "ranks": [dict(r) for r in ordered],
    }
