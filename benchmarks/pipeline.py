"""Pipelining (issue 19 §1): what the window buys a worker started with default flags, and what it
must not cost. Three clusters are up at once (a coordinator and ``--workers`` worker processes
each, as in ``dispatch.py``; workers with the in-memory outbox, as a new user starts them) and
the phases alternate between them, so every configuration meets the same machine:

* **no-op throughput**: ``--tasks`` no-op custom tasks in JSON lists of ``--chunk`` from
  ``--clients`` concurrent submitters; tasks/s from the first submit to the last outcome. Workers
  with default flags (one slot, ``--pipeline-depth 16``), with ``--pipeline-depth 0`` (one slot,
  no window: what default flags meant before), and with ``--max-concurrent-tasks 64 --log-level
  WARNING --pipeline-depth 0`` (the tuned figure of the issue). Goal: defaults within 20 % of 64.
* **mixed durations**: ``--short`` tasks sleeping 1 ms and ``--long`` tasks sleeping 2 s, shuffled
  (fixed seed) and submitted in lists of ``--chunk``; makespan from the first submit to the last
  outcome, with the window (defaults) and without (``--pipeline-depth 0``). Goal: no worse.

Each phase runs ``--rounds`` times per configuration, in turn; ratios are taken within a round.
``--also-depth N`` (repeatable) adds a cluster whose workers run ``--pipeline-depth N`` to the
throughput phase (how deep the default should be).

Run: ``python benchmarks/pipeline.py --rounds 3``
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from dispatch import Cluster, _count_done, cpu_seconds, settle, throughput

from distributed_testing.process import aio

CONFIGS: dict[str, list[str]] = {
    "defaults": [],
    "--pipeline-depth 0": ["--pipeline-depth", "0"],
    "64 slots": ["--max-concurrent-tasks", "64", "--log-level", "WARNING", "--pipeline-depth", "0"],
}
MIXED = ("defaults", "--pipeline-depth 0")


def sleep_task(seconds: float) -> dict[str, Any]:
    return {"type": "custom", "config": {"name": "sleep", "parameters": {"seconds": seconds}}}


async def makespan(base: str, key: str, docs: list[dict[str, Any]], chunk: int) -> float:
    """Seconds from the first submit of ``docs`` to the last of their outcomes."""
    h = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as http:
        before = await _count_done(http, base, h)
        t0 = time.perf_counter()
        for i in range(0, len(docs), chunk):
            async with http.post(f"{base}/api/v1/tasks", json=docs[i:i + chunk], headers=h) as r:
                assert r.status == 201, await r.text()
        while await _count_done(http, base, h) < before + len(docs):
            await asyncio.sleep(0.01)
        return time.perf_counter() - t0


def mixed_docs(short: int, long: int, seed: int) -> list[dict[str, Any]]:
    docs = [sleep_task(0.001) for _ in range(short)] + [sleep_task(2.0) for _ in range(long)]
    random.Random(seed).shuffle(docs)
    return docs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=20000, help="no-op tasks per throughput run")
    ap.add_argument("--chunk", type=int, default=500)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--short", type=int, default=2000, help="1 ms tasks per mixed run")
    ap.add_argument("--long", type=int, default=10, help="2 s tasks per mixed run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip", choices=["throughput", "mixed"], help="leave one phase out")
    ap.add_argument("--also-depth", type=int, action="append", default=[], metavar="N",
                    help="also measure no-op throughput with --pipeline-depth N (repeatable)")
    args = ap.parse_args()
    configs = {**CONFIGS, **{f"--pipeline-depth {n}": ["--pipeline-depth", str(n)] for n in args.also_depth}}
    tmp = Path(tempfile.mkdtemp(prefix="dt-pipeline-"))
    clusters: dict[str, Cluster] = {}
    try:
        for name, worker_args in configs.items():
            d = tmp / name.replace(" ", "_").replace("-", "")
            d.mkdir()
            clusters[name] = Cluster(d, workers=args.workers, slots=1, worker_outbox="memory", worker_args=worker_args)
        procs = [p for c in clusters.values() for p in c.procs]
        for c in clusters.values():
            aio.run(throughput(c.base, c.admin, 2000, args.chunk, args.clients))  # warm-up: children, windows
        settle(procs)
        print(f"pipelining benchmark: {args.workers} worker processes per cluster, signing on, coordinator DuckDB "
              f"store, worker outbox in memory, event loop {aio.loop_choice()}; clusters up at once, runs in turn")
        tps: dict[str, list[float]] = {n: [] for n in configs}
        cpu: dict[str, list[dict[str, float]]] = {n: [] for n in configs}  # CPU µs per task, by process kind
        spans: dict[str, list[float]] = {n: [] for n in MIXED}
        for r in range(args.rounds):
            if args.skip != "throughput":
                for name, c in clusters.items():
                    before = cpu_seconds(c.procs)
                    tps[name].append(aio.run(throughput(c.base, c.admin, args.tasks, args.chunk, args.clients)))
                    after = cpu_seconds(c.procs)
                    cpu[name].append({k: (after[k] - before[k]) / args.tasks * 1e6 for k in before})
                    settle(procs)
                print(f"  round {r + 1} no-op tasks/s: " + ", ".join(f"{n} {v[-1]:,.0f}" for n, v in tps.items()),
                      flush=True)
            if args.skip != "mixed":
                docs = mixed_docs(args.short, args.long, seed=r)
                for name in MIXED:
                    c = clusters[name]
                    spans[name].append(aio.run(makespan(c.base, c.admin, docs, args.chunk)))
                    settle(procs)
                print(f"  round {r + 1} mixed makespan: " + ", ".join(f"{n} {v[-1]:.2f} s" for n, v in spans.items()),
                      flush=True)
        report(args, tps, cpu, spans)
        return 0
    finally:
        for c in clusters.values():
            c.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def report(args: argparse.Namespace, tps: dict[str, list[float]], cpu: dict[str, list[dict[str, float]]],
           spans: dict[str, list[float]]) -> None:
    if args.skip != "throughput":
        print(f"no-op throughput ({args.tasks} tasks, lists of {args.chunk}, {args.clients} clients), tasks/s:")
        for name, xs in tps.items():
            print(f"  {name:20s} " + " / ".join(f"{x:,.0f}" for x in xs) + f"  (median {statistics.median(xs):,.0f})")
        print("CPU per task, µs (median over rounds):")
        for name, rows in cpu.items():
            print(f"  {name:20s} " + ", ".join(f"{k} {statistics.median(r[k] for r in rows):.0f}" for k in rows[0])
                  + f"; total {statistics.median(sum(r.values()) for r in rows):.0f}")
        for other in [n for n in tps if n != "defaults"]:
            ratios = [a / b for a, b in zip(tps["defaults"], tps[other], strict=True)]
            print(f"  defaults / {other}: " + " / ".join(f"{x:.2f}" for x in ratios))
    if args.skip != "mixed":
        work = args.short * 0.001 + args.long * 2.0
        print(f"mixed: {args.short} x 1 ms + {args.long} x 2 s over {args.workers} workers "
              f"(work {work:.1f} s, {work / args.workers:.2f} s per worker at best), makespan s:")
        for name, xs in spans.items():
            print(f"  {name:20s} " + " / ".join(f"{x:.2f}" for x in xs))
        ratios = [a / b for a, b in zip(spans["defaults"], spans["--pipeline-depth 0"], strict=True)]
        print("  defaults / --pipeline-depth 0: " + " / ".join(f"{x:.3f}" for x in ratios))


if __name__ == "__main__":
    sys.exit(main())
