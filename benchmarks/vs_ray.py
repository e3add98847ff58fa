"""Ray and this project on the same workload, interleaved, so both meet the same machine.

This VM's speed drifts by up to 2x within minutes (CPU steal, disk latency), so figures from
``dispatch.py`` and ``ray_baseline.py`` run one after the other compare only loosely. This script
keeps a cluster of each up at once (ours: a coordinator and ``--workers`` worker processes as in
``dispatch.py``; Ray: ``ray_baseline.py --serve`` in Ray's own environment) and alternates:

* latency: blocks of ``--block`` serial no-op tasks, ours then Ray's, until each side has
  ``--samples``; ours through ``POST /api/v1/tasks?wait=`` with aiohttp's client (as
  ``dispatch.py``), and, in the same rounds, with Python's synchronous ``http.client`` on one
  keep-alive connection (a CI script's client; it costs the client less CPU per request);
* throughput: ``--tasks`` no-op tasks each, ours then Ray's, ``--rounds`` times, submitted as
  JSON lists of 500 from ``--clients`` concurrent clients (4, the issue's shape), on two of our
  clusters: workers as a new user starts them (``defaults``: one slot, the pipelining window,
  INFO logs, outbox in memory) and the tuned row (``64 slots``: ``--max-concurrent-tasks 64
  --log-level WARNING``); each round takes the three in turn, so all meet the same machine.

Latency is measured on the ``defaults`` cluster. Prints each side's figures and ours relative to Ray's. Ray does less per task (no signing, nothing
on disk): see ``ray_baseline.py``.

``--before CHECKOUT`` adds a third cluster of ours, the defaults row started from another checkout
(an older commit in a worktree), to the same rounds, and its serial latency to the latency blocks:
before and after meet the same machine as Ray.

Run: ``python benchmarks/vs_ray.py --ray-python /tmp/rayvenv/bin/python [--before /tmp/base]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from dispatch import ROOT, Cluster, SyncClient, settle, submit_waiting, throughput
from latency_stats import pct, summary_ms

from distributed_testing.process import aio

# Our two worker configurations: the workers' flags ([] = as a new user starts them).
CONFIGS: dict[str, list[str]] = {
    "defaults": [],
    "64 slots": ["--max-concurrent-tasks", "64", "--log-level", "WARNING"],
}


class RayServer:
    """``ray_baseline.py --serve`` in Ray's interpreter, answering one phase per request."""

    def __init__(self, python: str) -> None:
        self.proc = subprocess.Popen([python, str(ROOT / "benchmarks" / "ray_baseline.py"), "--serve"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"ray_baseline.py --serve did not start (exit {self.proc.poll()})")

    def run(self, phase: str, n: int) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{phase} {n}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def ours_block(http: aiohttp.ClientSession, sync: SyncClient, c: Cluster, n: int) -> tuple[list[float], list[float]]:
    """``n`` serial tasks through each client, alternating sample by sample."""
    a, s = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        body = await submit_waiting(http, c.base, c.admin)
        t1 = time.perf_counter()
        assert body["state"] == "succeeded", body
        body = sync.submit_waiting()
        s.append(time.perf_counter() - t1)
        a.append(t1 - t0)
        assert body["state"] == "succeeded", body
    return a, s


async def latency(c: Cluster, ray: RayServer, samples: int, block: int,
                  before: Cluster | None = None) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"ours (aiohttp client)": [], "ours (http.client)": [], "ray": []}
    sync = SyncClient(c.base, c.admin)
    old = None if before is None else SyncClient(before.base, before.admin)
    if old is not None:
        out["before (aiohttp client)"], out["before (http.client)"] = [], []
    async with aiohttp.ClientSession() as http:
        await ours_block(http, sync, c, 100)  # warm-up
        if before is not None and old is not None:
            await ours_block(http, old, before, 100)
        ray.run("latency", 100)
        while len(out["ray"]) < samples:
            a, s = await ours_block(http, sync, c, block)
            out["ours (aiohttp client)"] += a
            out["ours (http.client)"] += s
            if before is not None and old is not None:
                a, s = await ours_block(http, old, before, block)
                out["before (aiohttp client)"] += a
                out["before (http.client)"] += s
            out["ray"] += ray.run("latency", block)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ray-python", required=True, help="a Python with ray installed (see ray_baseline.py)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--samples", type=int, default=1000, help="serial tasks per side")
    ap.add_argument("--block", type=int, default=50, help="serial tasks per side per turn")
    ap.add_argument("--tasks", type=int, default=20000, help="tasks per throughput round")
    ap.add_argument("--rounds", type=int, default=3, help="throughput rounds per side")
    ap.add_argument("--clients", type=int, default=4, help="concurrent submitters in the throughput phase")
    ap.add_argument("--before", type=Path, help="another checkout: its defaults row in the same rounds")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="dt-vs-ray-"))
    clusters: dict[str, Cluster] = {}
    ray: RayServer | None = None
    try:
        configs = [(name, ROOT, worker_args) for name, worker_args in CONFIGS.items()]
        if args.before is not None:
            configs.append(("defaults, before", args.before.resolve(), CONFIGS["defaults"]))
        for name, root, worker_args in configs:
            (tmp / name).mkdir()
            clusters[name] = Cluster(tmp / name, workers=args.workers, slots=1, worker_outbox="memory",
                                     worker_args=worker_args, root=root)
            aio.run(throughput(clusters[name].base, clusters[name].admin, 2000, 500, args.clients))  # warm-up
        ray = RayServer(args.ray_python)
        tput: dict[str, list[float]] = {**{f"ours, {n}": [] for n in clusters}, "ray": []}
        for _ in range(args.rounds):
            for name, c in clusters.items():
                tput[f"ours, {name}"].append(aio.run(throughput(c.base, c.admin, args.tasks, 500, args.clients)))
                settle(c.procs)
            tput["ray"].append(ray.run("throughput", args.tasks))
        lat = aio.run(latency(clusters["defaults"], ray, args.samples, args.block,
                              clusters.get("defaults, before")))
        print(f"interleaved: {args.workers} worker processes, no-op tasks in lists of 500 from {args.clients} clients; "
              "ours signs and persists (DuckDB), Ray does neither")
        for side, xs in tput.items():
            print(f"  throughput {side:16s}: " + " / ".join(f"{x:,.0f}" for x in xs) + " tasks/s")
        for name in clusters:
            print(f"  throughput ours, {name} / ray: "
                  f"{statistics.mean(tput[f'ours, {name}']) / statistics.mean(tput['ray']):.2f}x")
        print(f"  throughput defaults / 64 slots: "
              f"{statistics.mean(tput['ours, defaults']) / statistics.mean(tput['ours, 64 slots']):.2f}")
        for side, xs in lat.items():
            print(f"  latency {side:22s} (n={len(xs)}): {summary_ms(xs)}")
        for side in ("ours (aiohttp client)", "ours (http.client)"):
            print(f"  p50 {side} / ray: {pct(lat[side], 50) / pct(lat['ray'], 50):.2f}")
        if args.before is not None:
            med = {k: statistics.median(v) for k, v in tput.items()}
            print(f"  throughput median defaults / defaults, before: {med['ours, defaults'] / med['ours, defaults, before']:.2f}x; "
                  f"serial p50 (http.client) after / before: "
                  f"{pct(lat['ours (http.client)'], 50) / pct(lat['before (http.client)'], 50):.2f}")
        print(f"  load average {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
        return 0
    finally:
        if ray is not None:
            ray.stop()
        for c in clusters.values():
            c.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
