"""Where a shipped run's CPU goes: ``pytest -n 2`` and a cached ``--dt-coordinator`` run of one
registry suite, each with every process's CPU (utime + stime) read from ``/proc`` every 0.1 s, summed
by kind (the local pytest, xdist's workers, the sessions, worker and coordinator processes).

    python benchmarks/plugin_cpu.py toolz --rounds 2 [--work /tmp/psw]

A coordinator and two one-slot ``--accept-bundles`` workers of this checkout (``plugin_suites.start_cluster``);
each round runs the plugin once to warm the cluster, then ``-n 2``, then the measured plugin run.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

KINDS = [("coordinator", "run_coordinator"), ("worker", "cli.worker"), ("session", "pytest_serve"),
         ("xdist worker", "sys.stdin.readline"), ("local pytest", "pytest")]


def _kind(cmd: str) -> str:
    return next((k for k, pat in KINDS if pat in cmd), "other")


def sample(stop: list[bool], into: dict[tuple[str, str], list[Any]]) -> None:
    """Until ``stop[0]``: each process's CPU seconds since sampling began, by (pid, start)."""
    hz = os.sysconf("SC_CLK_TCK")
    began = float(Path("/proc/uptime").read_text().split()[0]) * hz
    while not stop[0]:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                st = Path(f"/proc/{pid}/stat").read_text()
                rest = st[st.rindex(")") + 2:].split()
                ticks, start = int(rest[11]) + int(rest[12]), rest[19]
                seen = into.get((pid, start))
                if seen is None:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    into[(pid, start)] = [_kind(cmd), 0.0, ticks if int(start) < began else 0]
                else:
                    seen[1] = (ticks - seen[2]) / hz
            except (OSError, ValueError, IndexError):
                continue
        time.sleep(0.1)


def measured(label: str, fn):  # type: ignore[no-untyped-def]
    import threading

    stop: list[bool] = [False]
    seen: dict[tuple[str, str], list[Any]] = {}
    t = threading.Thread(target=sample, args=(stop, seen))
    t.start()
    time.sleep(0.3)
    began = time.perf_counter()
    run = fn()
    took = time.perf_counter() - began
    time.sleep(0.3)
    stop[0] = True
    t.join()
    cpu: collections.Counter[str] = collections.Counter()
    for kind, secs, _ in seen.values():
        cpu[kind] += secs
    said = dict(collections.Counter(run.outcomes.values()))
    print(f"{label}: {took:.2f} s wall, {said}; CPU s: "
          + ", ".join(f"{k} {v:.2f}" for k, v in cpu.most_common() if k != "other"), flush=True)
    return run


def main() -> None:
    from plugin_suites import start_cluster

    from distributed_testing.testing import Procs
    from distributed_testing.testing.suites import SUITES, fetch, run_pytest, submitter_env

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("suite", choices=sorted(SUITES))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "dt-plugin-cpu")
    a = p.parse_args()
    suite = SUITES[a.suite]
    tree = fetch(suite, a.work / "sdists")
    extra = [str(tree)] if suite.install_tree else []  # a src layout's tests import the package installed from it
    py = submitter_env(a.work / f"venv-{a.suite}", [*suite.requirements, "pytest-xdist", *extra], REPO / "distributed_testing")
    with tempfile.TemporaryDirectory() as t:
        top = Path(t) / "cluster"
        top.mkdir()
        procs = Procs(top, cwd=REPO)
        try:
            url, key = start_cluster(procs, top, ["--accept-bundles"], allow_code=True)
            env, cache = {**suite.env, "DT_API_KEY": key}, a.work / f"cache-{a.suite}"
            fleet = [*suite.fleet_args, "--dt-coordinator", url]
            for r in range(a.rounds):
                run_pytest(py, tree, fleet, a.work / "warm.xml", env, cache=cache)
                measured(f"round {r + 1} -n 2", lambda: run_pytest(py, tree, [*suite.args, "-n", "2"], a.work / "n2.xml",
                                                                   suite.env))
                measured(f"round {r + 1} --dt-coordinator", lambda: run_pytest(py, tree, fleet, a.work / "dt.xml", env,
                                                                               cache=cache))
        finally:
            procs.close()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    main()
