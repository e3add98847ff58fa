"""Real suites three ways: plain pytest, ``pytest -n 2`` (pytest-xdist) and ``pytest
--dt-coordinator`` through a coordinator with two worker processes (one slot each), interleaved
round by round so that the load of a shared machine hits every mode alike.

Each suite is an unpacked sdist (networkx 3.6.1: ``pip download --no-deps --no-binary :all:
networkx==3.6.1 -d DIR`` then unpack; more-itertools 10.5.0 likewise) given as ``NAME=DIR``; the
tests run from DIR (its own copy of the package comes first on ``sys.path``), which is also both
workers' ``--test-root`` (the shared-tree mode). The cluster mode keeps pytest's cache in a
scratch directory, so round 1 has no duration history and later rounds have it.

Usage::

    .venv/bin/python benchmarks/plugin_suites.py networkx=/work/plugin-bench/networkx-3.6.1 \\
        more-itertools=/work/plugin-bench/more-itertools-10.5.0:tests --rounds 2

``NAME=DIR:SUBPATH`` runs only SUBPATH (relative to DIR). Prints one line per run and a table
of median wall time, the ratio to ``-n 2`` and the outcome counts; the load average is printed
before and after.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from distributed_testing.testing import Procs, Rest, start_coordinator_process, wait_until  # noqa: E402

MODES = ("local", "xdist -n 2", "cluster (2 workers)")
_COUNT = re.compile(r"(\d+) ((?:subtests )?(?:passed|failed)|skipped|xfailed|xpassed|errors?|deselected|warnings?)")


def counts(out: str) -> dict[str, int]:
    """Outcome counts from pytest's last summary line."""
    lines = [line for line in out.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    found = {k.rstrip("s") if k.startswith(("error", "warning")) else k.replace("subtests ", "sub"): int(n)
             for n, k in _COUNT.findall(lines[-1] if lines else "")}
    found.pop("warning", None)
    return found


def start_cluster(procs: Procs, tmp: Path, worker_args: list[str], allow_code: bool = False) -> tuple[str, str]:
    """A coordinator and two one-slot worker processes started with ``worker_args``; its URL and a
    submitter key (``allow_code``: one that may ship bundles)."""
    _, port = start_coordinator_process(procs, tmp / "state" / "coordinator.duckdb")
    url = f"http://127.0.0.1:{port}"
    admin = Rest(url, (tmp / "state" / "admin.key").read_text().strip())
    for i in range(2):
        key_file = tmp / f"worker{i}.key"
        key_file.write_text(admin.create_key("worker", f"bench-{i}"))
        key_file.chmod(0o600)
        procs.start(["-m", "distributed_testing.cli.worker", "--coordinator", url, "--api-key-file", str(key_file),
                     "--worker-id", f"bench-{i}", *worker_args, "--max-concurrent-tasks", "1",
                     "--db-path", str(tmp / f"worker{i}.duckdb")], tmp / f"worker{i}.log")
    try:
        wait_until(lambda: sum(w["state"] != "disconnected" for w in admin.workers().values()) == 2, 120, "workers")
    except TimeoutError:
        for i in range(2):
            print((tmp / f"worker{i}.log").read_text()[-2000:])
        raise
    return url, str(admin.ok("POST", "/api/v1/keys", json={"role": "submitter", "name": "bench",
                                                            "allow_code": allow_code})["key"])


def run_mode(mode: str, root: Path, target: str, url: str, key: str, cache: Path) -> tuple[float, str]:
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", f"--rootdir={root}", target]
    env = {**os.environ}
    if mode == MODES[0]:
        argv += ["-p", "no:cacheprovider"]
    elif mode == MODES[1]:
        argv += ["-p", "no:cacheprovider", "-n", "2"]
    else:
        argv += ["-o", f"cache_dir={cache}", "--dt-coordinator", url, "--dt-shared-tree"]
        env["DT_API_KEY"] = key
    started = time.perf_counter()
    proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=3600, check=False)
    return time.perf_counter() - started, proc.stdout + proc.stderr


def bench_suite(name: str, spec: str, rounds: int) -> list[str]:
    root_s, _, target = spec.partition(":")
    root = Path(root_s).resolve()
    rows: dict[str, list[tuple[float, dict[str, int]]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="dt-plugin-bench-") as t:
        tmp = Path(t)
        procs = Procs(tmp, cwd=REPO)
        try:
            url, key = start_cluster(procs, tmp, ["--test-root", str(root)])
            for r in range(rounds):
                for mode in MODES:
                    wall, out = run_mode(mode, root, target or ".", url, key, tmp / "cache")
                    c = counts(out)
                    rows[mode].append((wall, c))
                    print(f"{name} round {r + 1} {mode}: {wall:.1f} s {c}", flush=True)
                    if not c:
                        print(out[-3000:], flush=True)
        finally:
            procs.close()
    base = statistics.median(w for w, _ in rows[MODES[1]])
    table = []
    for mode in MODES:
        walls = [w for w, _ in rows[mode]]
        each = ", ".join(f"{w:.1f}" for w in walls)
        table.append(f"| {name} | {mode} | {statistics.median(walls):.1f} ({each}) | "
                     f"{statistics.median(walls) / base:.2f} | {rows[mode][-1][1]} |")
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("suites", nargs="+", metavar="NAME=DIR[:SUBPATH]")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()}", flush=True)
    table = ["| suite | mode | wall s, median (each round) | / -n 2 | counts (last round) |", "|---|---|---|---|---|"]
    for item in args.suites:
        name, _, spec = item.partition("=")
        table += bench_suite(name, spec, args.rounds)
    print(f"load average after: {os.getloadavg()}")
    print("\n".join(table))


if __name__ == "__main__":
    main()
