"""Paired serial latency: this checkout against another (``--against DIR``, e.g. a ``git worktree``
of the commit before a change), one cluster each, samples alternating between them.

This VM's speed drifts by up to 2x within minutes, so two runs of ``dispatch.py`` one after the
other cannot show a 5 % change; alternating samples puts both sides on the same machine at the
same moment. Prints each side's p50/p90 of ``POST /api/v1/tasks?wait=`` (submit -> result, one
no-op task at a time, idle cluster) and the median of the paired differences.

Run: ``git worktree add /tmp/before HEAD~1 && python benchmarks/latency_ab.py --against /tmp/before``
"""

from __future__ import annotations

import argparse
import functools
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from dispatch import ROOT, Cluster, SyncClient, settle, submit_waiting, throughput
from latency_stats import summary_ms

from distributed_testing.process import aio

Submit = Callable[[], Awaitable[dict[str, Any]]]


async def alternate(submits: list[Submit], samples: int) -> list[list[float]]:
    """``samples`` rounds of one serial task per side, timing each."""
    out: list[list[float]] = [[] for _ in submits]
    for _ in range(samples):
        for submit, xs in zip(submits, out, strict=True):
            t0 = time.perf_counter()
            body = await submit()
            xs.append(time.perf_counter() - t0)
            assert body["state"] == "succeeded", body
    return out


async def timed(clusters: list[Cluster], samples: int, client: str) -> list[list[float]]:
    """Through one aiohttp session, or one keep-alive ``http.client`` connection per cluster."""
    if client == "aiohttp":
        async with aiohttp.ClientSession() as http:
            return await alternate([functools.partial(submit_waiting, http, c.base, c.admin) for c in clusters], samples)
    syncs = [SyncClient(c.base, c.admin) for c in clusters]

    def blocking(s: SyncClient) -> Submit:
        async def submit() -> dict[str, Any]:
            return s.submit_waiting()  # blocks the loop, which has nothing else to do
        return submit

    try:
        return await alternate([blocking(s) for s in syncs], samples)
    finally:
        for s in syncs:
            s.conn.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", type=Path, required=True, help="another checkout of this repository")
    ap.add_argument("--samples", type=int, default=1500, help="per side, after 10 %% more as warm-up")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--client", choices=("aiohttp", "http.client"), default="aiohttp",
                    help="the client timing the requests (default: aiohttp's, as dispatch.py's first latency line)")
    args = ap.parse_args()
    if not (args.against / "run_coordinator.py").is_file():
        ap.error(f"--against {args.against}: no run_coordinator.py there")
    roots = [ROOT, args.against.resolve()]
    tmps = [Path(tempfile.mkdtemp(prefix="dt-ab-")) for _ in roots]
    clusters: list[Cluster] = []
    try:
        for root, tmp in zip(roots, tmps, strict=True):
            clusters.append(Cluster(tmp, workers=args.workers, slots=64, root=root))
            aio.run(throughput(clusters[-1].base, clusters[-1].admin, 2000, 500, 2))  # warm-up
        settle([p for c in clusters for p in c.procs])
        warm = args.samples // 10
        res = [xs[warm:] for xs in aio.run(timed(clusters, args.samples + warm, args.client))]
        for root, xs in zip(roots, res, strict=True):
            print(f"{root}: {summary_ms(xs)}")
        diffs = [a - b for a, b in zip(res[0], res[1], strict=True)]
        print(f"paired difference (this - against): median {statistics.median(diffs) * 1e3:+.3f} ms, "
              f"this side faster in {sum(d < 0 for d in diffs) / len(diffs):.0%} of {len(diffs)} pairs")
        return 0
    finally:
        for c in clusters:
            c.stop()
        for tmp in tmps:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
