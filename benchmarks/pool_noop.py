"""Throughput of noop tasks through CustomExecutor's pool of child processes, one at a time and
all at once: the cost of a custom task's round trip to its child, without the coordinator.

    .venv/bin/python benchmarks/pool_noop.py --tasks 2000 --pool-size 2
    .venv/bin/python benchmarks/pool_noop.py --compare-confined --repeat 5

``--compare-confined`` alternates rounds of an unconfined pool with rounds of a pool whose children
run in the worker's deny-list confinement (worker/confine.py: started in bwrap once, each task in
a scratch directory emptied after it) and reports the ratio of their medians.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
from pathlib import Path

from distributed_testing.worker.confine import Confinement
from distributed_testing.worker.executors import CustomExecutor, TaskContext

logger = logging.getLogger("bench_pool_noop")


async def measure(tasks: int, pool_size: int, timeout_s: float | None,
                  confinement: Confinement | None = None) -> dict[str, float]:
    """Tasks/s for ``tasks`` noops run one after another and all at once through the pool."""
    ex = CustomExecutor(pool_size, confinement=confinement)
    await ex.start()
    try:
        ctx = TaskContext("bench", 1, "custom", {"name": "noop", "parameters": {}}, timeout_s=timeout_s)
        for _ in range(100):  # warm-up
            await ex.run(ctx)
        t0 = time.perf_counter()
        for _ in range(tasks):
            await ex.run(ctx)
        sequential = time.perf_counter() - t0
        t0 = time.perf_counter()
        outcomes = await asyncio.gather(*(ex.run(ctx) for _ in range(tasks)))
        concurrent = time.perf_counter() - t0
    finally:
        await ex.close()
    failed = [o for o in outcomes if o.status != "succeeded"]
    if failed:
        raise RuntimeError(f"{len(failed)} noop tasks did not succeed: {failed[0]}")
    return {
        "sequential_tasks_per_s": tasks / sequential,
        "sequential_us_per_task": sequential / tasks * 1e6,
        "concurrent_tasks_per_s": tasks / concurrent,
        "concurrent_us_per_task": concurrent / tasks * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--pool-size", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=None, help="per-task timeout (adds a watchdog)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds; best and median are reported")
    parser.add_argument("--compare-confined", action="store_true",
                        help="alternate unconfined and confined rounds and report the ratio")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.compare_confined:
        compare(args)
        return
    rounds = [asyncio.run(measure(args.tasks, args.pool_size, args.timeout_s)) for _ in range(args.repeat)]
    for key in ("sequential_tasks_per_s", "concurrent_tasks_per_s"):
        values = sorted(r[key] for r in rounds)
        logger.info(
            "%d noops, pool size %d, timeout %s, %s: best %.0f, median %.0f (%.1f us/task at best)",
            args.tasks, args.pool_size, args.timeout_s, key, values[-1], statistics.median(values),
            1e6 / values[-1],
        )


def compare(args: argparse.Namespace) -> None:
    """Unconfined and confined rounds, alternating, in one run; medians and their ratio."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "scratch"
        root.mkdir()
        confinement = Confinement(hide=(Path(tmp) / "state",), scratch_root=root)
        rounds: dict[str, list[dict[str, float]]] = {"unconfined": [], "confined": []}
        for _ in range(args.repeat):
            rounds["unconfined"].append(asyncio.run(measure(args.tasks, args.pool_size, args.timeout_s)))
            rounds["confined"].append(asyncio.run(measure(args.tasks, args.pool_size, args.timeout_s, confinement)))
    for key in ("sequential_tasks_per_s", "concurrent_tasks_per_s"):
        medians = {name: statistics.median(r[key] for r in rs) for name, rs in rounds.items()}
        logger.info("%d noops, pool size %d, %d rounds, %s median: unconfined %.0f, confined %.0f, ratio %.3f",
                    args.tasks, args.pool_size, args.repeat, key, medians["unconfined"], medians["confined"],
                    medians["confined"] / medians["unconfined"])


if __name__ == "__main__":
    main()
