"""Liveness matrix over long windows: worker heartbeat intervals × a default coordinator.

A coordinator with default liveness flags (in this process, memory store) and, per interval, three
``run_worker_example.py`` processes: one left alone ("steady": must keep its first session for the
whole window), one frozen with SIGSTOP ("frozen": sends nothing, connection open; only the TTL can
find it) and one SIGKILLed ("killed": its connection closes with it). Reports per worker the
interval and TTL the coordinator gave it, the sessions it registered during the window (1 = no
false death), and for the victims how long after the signal, and after their last frame, they
were declared dead.

Run: ``python benchmarks/liveness.py --window 60`` (``--intervals 0.5,1,10`` by default).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from distributed_testing.testing import run_cluster, wait_for

ROOT = Path(__file__).resolve().parent.parent


def _cell(v: float | None) -> str:
    return f"{v:.2f}s" if v is not None else "-"


def hidden_accelerators(tmp: Path) -> dict[str, str]:
    """torch and openvino fail to import in the workers, so their accelerator probe is instant."""
    hide = tmp / "hide"
    for name in ("torch", "openvino"):
        (hide / name).mkdir(parents=True, exist_ok=True)
        (hide / name / "__init__.py").write_text(f"raise ImportError('{name} hidden by benchmarks/liveness.py')\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(hide), str(ROOT), os.environ.get("PYTHONPATH"))
                                                        if p), "PYTHONUNBUFFERED": "1"}


async def run(intervals: list[float], window_s: float, tmp: Path) -> None:
    env = hidden_accelerators(tmp)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    registrations: dict[str, int] = {}
    async with run_cluster(tmp, workers=0) as c:
        state = c.runtime.state
        real_register = state.register

        def counting(reg, session_id, now, *, key_id):  # type: ignore[no-untyped-def]
            registrations[reg.worker_id] = registrations.get(reg.worker_id, 0) + 1
            return real_register(reg, session_id, now, key_id=key_id)

        state.register = counting  # type: ignore[method-assign]
        try:
            for i in intervals:
                for kind in ("steady", "frozen", "killed"):
                    wid = f"{kind}-{i:g}"
                    key = await c.create_key("worker")
                    with open(tmp / f"{wid}.log", "wb") as out:
                        procs[wid] = subprocess.Popen(
                            [sys.executable, "run_worker_example.py", "--coordinator", c.base_url, "--api-key", key,
                             "--worker-id", wid, "--heartbeat-interval", f"{i:g}", "--reconnect-interval", "0.2"],
                            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
            await wait_for(lambda: all(w in c.runtime.sessions for w in procs), timeout=120, what="every worker")
            signalled = time.time()
            for wid, p in procs.items():
                if wid.startswith("frozen"):
                    p.send_signal(signal.SIGSTOP)
                elif wid.startswith("killed"):
                    p.send_signal(signal.SIGKILL)
            found: dict[str, tuple[float, float]] = {}
            false_deaths: dict[str, float] = {}
            end = signalled + window_s
            while time.time() < end:
                for wid in procs:
                    w = state.workers[wid]
                    if not w.connected and wid not in found and not wid.startswith("steady"):
                        found[wid] = (time.time() - signalled, time.time() - w.last_seen)
                    if wid.startswith("steady") and not w.connected and wid not in false_deaths:
                        false_deaths[wid] = time.time() - signalled
                await asyncio.sleep(0.02)
            print(f"window {window_s:g}s after the signals; coordinator flags at their defaults "
                  f"(--heartbeat-interval 1, --worker-ttl 3, --max-heartbeat-interval 60)")
            print(f"{'worker':<14}{'interval':>9}{'TTL':>7}{'sessions':>10}{'found after':>13}{'silent for':>12}")
            for wid in procs:
                w = state.workers[wid]
                after, silent = found.get(wid, (None, None))
                extra = f"  FALSE DEATH at {false_deaths[wid]:.1f}s" if wid in false_deaths else ""
                print(f"{wid:<14}{w.liveness.interval_s:>8g}s{w.liveness.ttl_s:>6g}s{registrations.get(wid, 0):>10}"
                      f"{_cell(after):>13}{_cell(silent):>12}{extra}")
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
                    p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--window", type=float, default=60.0, help="seconds observed after the signals (default 60)")
    ap.add_argument("--intervals", default="0.5,1,10", help="worker --heartbeat-interval values (default 0.5,1,10)")
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dt-liveness-") as tmp:
        asyncio.run(run([float(x) for x in ns.intervals.split(",")], ns.window, Path(tmp)))


if __name__ == "__main__":
    main()
