"""Throughput and serial latency of two checkouts at once, rounds alternating (issue 30 §5).

One cluster per checkout (``--root``; the first one defaults to this checkout), all up at once:
a coordinator with its DuckDB store and ``--workers`` workers with their default flags, outbox in
memory, as ``vs_ray.py``'s ``defaults`` row starts them. Then ``--rounds`` rounds, each taking
every cluster in turn:

* throughput: ``--tasks`` no-op tasks in JSON lists of 500 from ``--clients`` concurrent clients
  (the issue's shape), tasks/s from the first submit to the last terminal state, and the
  coordinator's CPU (psutil) per task;
* serial latency: ``--block`` no-op tasks one at a time, ``POST /api/v1/tasks?wait=`` over one
  keep-alive ``http.client`` connection (a CI script's client), and the CPU each process group
  spent per serial task (mean over the rounds).

Prints per checkout the rounds, their median, the coordinator's CPU per task, the serial p50 and
p90 over all blocks, and every figure's ratio to the first checkout's. The machine drifts: only
figures from the same run compare.

Run: ``PYTHONPATH=. python benchmarks/write_path.py --root . --root /tmp/before``
(``--profile DIR``: also a py-spy profile of each coordinator over one extra throughput round,
``DIR/<label>.txt``, when ``py-spy`` is on the PATH.)
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from dispatch import ROOT, Cluster, cpu_seconds, settle, sync_latency, throughput
from latency_stats import pct

from distributed_testing.process import aio


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", action="append", type=Path, help="a checkout to measure (repeat; default: this one)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=10000, help="tasks per throughput round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--block", type=int, default=300, help="serial tasks per cluster per round")
    ap.add_argument("--profile", type=Path, help="write a py-spy profile per checkout here")
    args = ap.parse_args()
    roots = [r.resolve() for r in (args.root or [ROOT])]
    labels = [f"{i}:{r.name}" for i, r in enumerate(roots)]
    tmp = Path(tempfile.mkdtemp(prefix="dt-write-path-"))
    clusters: list[Cluster] = []
    tput: dict[str, list[float]] = {lb: [] for lb in labels}
    cpu: dict[str, list[float]] = {lb: [] for lb in labels}
    wcpu: dict[str, list[float]] = {lb: [] for lb in labels}
    lat: dict[str, list[float]] = {lb: [] for lb in labels}
    scpu: dict[str, list[float]] = {lb: [] for lb in labels}  # coordinator, workers, children per serial task
    load0 = os.getloadavg()
    try:
        for lb, root in zip(labels, roots, strict=True):
            (tmp / lb).mkdir()
            c = Cluster(tmp / lb, workers=args.workers, slots=1, worker_outbox="memory", root=root, worker_args=[])
            clusters.append(c)
            aio.run(throughput(c.base, c.admin, 2000, 500, args.clients))  # warm-up
            settle(c.procs)
        for _ in range(args.rounds):
            for lb, c in zip(labels, clusters, strict=True):
                before = cpu_seconds(c.procs)
                tput[lb].append(aio.run(throughput(c.base, c.admin, args.tasks, 500, args.clients)))
                after = cpu_seconds(c.procs)
                cpu[lb].append((after["coordinator"] - before["coordinator"]) / args.tasks * 1e6)
                wcpu[lb].append((after["workers"] + after["worker children"] - before["workers"]
                                 - before["worker children"]) / args.tasks * 1e6)
                settle(c.procs)
            for lb, c in zip(labels, clusters, strict=True):
                before = cpu_seconds(c.procs)
                lat[lb] += sync_latency(c.base, c.admin, args.block)
                after = cpu_seconds(c.procs)
                scpu[lb] = [a + (after[k] - before[k]) / args.block * 1e6 / args.rounds
                            for a, k in zip(scpu[lb] or [0.0] * 3, ("coordinator", "workers", "worker children"),
                                            strict=True)]
                settle(c.procs)
        if args.profile and shutil.which("py-spy"):
            args.profile.mkdir(parents=True, exist_ok=True)
            for lb, c in zip(labels, clusters, strict=True):
                spy = subprocess.Popen(["py-spy", "record", "--pid", str(c.procs[0].pid), "--format", "raw",
                                        "--output", str(args.profile / f"{lb.replace(':', '-')}.txt"), "--threads"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                aio.run(throughput(c.base, c.admin, args.tasks, 500, args.clients))
                spy.send_signal(signal.SIGINT)  # py-spy writes its output on an interrupt
                spy.wait(30)
                settle(c.procs)
        print(f"{args.rounds} rounds alternating: {args.tasks} no-op tasks (lists of 500, {args.clients} clients), "
              f"then {args.block} serial POST ?wait (http.client); {args.workers} workers with default flags; "
              f"load average {load0[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
        first = labels[0]
        for lb in labels:
            med, p50 = statistics.median(tput[lb]), pct(lat[lb], 50) * 1e3
            print(f"  {lb}: tasks/s {' / '.join(f'{x:,.0f}' for x in tput[lb])} (median {med:,.0f}, "
                  f"x{med / statistics.median(tput[first]):.2f}); coordinator CPU/task "
                  f"{' / '.join(f'{x:.0f}' for x in cpu[lb])} us, workers' (with children) "
                  f"{' / '.join(f'{x:.0f}' for x in wcpu[lb])} us; serial p50 {p50:.3f} ms "
                  f"(x{p50 / (pct(lat[first], 50) * 1e3):.2f}), p90 {pct(lat[lb], 90) * 1e3:.3f} ms (n={len(lat[lb])}), "
                  f"CPU per serial task {' / '.join(f'{x:.0f}' for x in scpu[lb])} us (coordinator / workers / "
                  "their children)")
        return 0
    finally:
        for c in clusters:
            c.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
