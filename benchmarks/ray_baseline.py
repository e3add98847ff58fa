"""Ray on the workload of ``dispatch.py``, for a same-machine, same-hour comparison.

The issue's reference figures (Ray about 1,250 no-op tasks/s and 2.3 ms) were taken on this kind of
machine at some other time; its speed drifts by tens of percent over an hour, so only figures
taken side by side compare. This script runs Ray's equivalent of each phase of ``dispatch.py``:

* throughput: ``--tasks`` no-op remote functions submitted at once, then all awaited;
* latency: ``--latency-samples`` of ``ray.get(noop.remote())`` one at a time.

Ray keeps nothing on disk and signs nothing, so it does less work per task than ``dispatch.py``
(which fsyncs every submission and result and HMAC-signs every message).

Ray is not a dependency of this project: run it from its own environment, e.g.
``python -m venv /tmp/rayvenv && /tmp/rayvenv/bin/pip install ray`` then
``/tmp/rayvenv/bin/python benchmarks/ray_baseline.py``.

``--serve`` is for ``vs_ray.py``, which interleaves Ray's phases with ours: after the warm-up it
prints ``ready`` and then answers each line on stdin, ``latency N`` (N serial samples) or
``throughput N`` (N tasks at once), with one JSON line (a list of seconds, or tasks/s).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from latency_stats import summary_ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=20000)
    ap.add_argument("--latency-samples", type=int, default=1000)
    ap.add_argument("--serve", action="store_true", help="answer phase requests on stdin (see vs_ray.py)")
    args = ap.parse_args()
    try:
        import ray
    except ImportError:
        print("ray is not installed in this environment; see the module docstring", file=sys.stderr)
        return 2

    ray.init(include_dashboard=False, log_to_driver=False)

    @ray.remote
    def noop() -> None:
        return None

    def throughput(n: int) -> float:
        t0 = time.perf_counter()
        ray.get([noop.remote() for _ in range(n)])
        return n / (time.perf_counter() - t0)

    def latency(n: int) -> list[float]:
        xs = []
        for _ in range(n):
            t = time.perf_counter()
            ray.get(noop.remote())
            xs.append(time.perf_counter() - t)
        return xs

    try:
        ray.get([noop.remote() for _ in range(2000)])  # warm-up: workers started, functions exported
        if args.serve:
            return serve({"latency": latency, "throughput": throughput})
        tps = throughput(args.tasks)
        xs = latency(args.latency_samples)
    finally:
        ray.shutdown()
    print(f"ray {ray.__version__} baseline: local cluster, no-op remote functions")
    print(f"  throughput: {tps:,.0f} tasks/s over {args.tasks} tasks")
    print(f"  latency submit->result (n={len(xs)}): {summary_ms(xs)}")
    return 0


def serve(phases: dict[str, Callable[[int], Any]]) -> int:
    print("ready", flush=True)
    for line in sys.stdin:
        name, n = line.split()
        print(json.dumps(phases[name](int(n))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
