"""Real suites three ways: plain pytest, ``pytest -n 2`` (pytest-xdist) and ``pytest
--dt-coordinator`` through a coordinator with two worker processes (one slot each), interleaved
round by round so that the load of a shared machine hits every mode alike.

**Registry suites, shipped** (issue 37's table): ``--registry toolz,attrs`` fetches each suite's
sdist (``distributed_testing/testing/suite_registry.py``), runs it locally, with ``-n 2``, and through the
plugin twice with a shipped tree (``--accept-bundles`` workers, bwrap): the first run builds the
submitter's environment on the workers, the second finds it cached and has the first's durations
(pytest's cache; not for ``--base``, whose plugin sent ``-o cache_dir`` on to the workers). A
suite's ``env`` (what its user exports) is set in every mode and named by ``--dt-env`` for the fleet. ``--base DIR`` (an older checkout, ``git worktree add DIR COMMIT``) runs the
cluster modes a second time with that checkout's coordinator, workers and plugin, in the same
rounds, so old and new meet the same load. Prints, per round and in a table: the wall times, the
ratio to ``-n 2``, whether every test's outcome (JUnit) equals the local run's, and the fixed cost
of each cluster run: from pytest's start to the setup of the first test on a worker (the local
``--collect-only`` time beside it: what pytest spends before any test anyway)::

    python benchmarks/plugin_suites.py --registry toolz,attrs --rounds 2 --base /tmp/base-s

``--workers 2,4`` measures a cluster of each size (one-slot workers) in the same rounds (how the
ratio scales), ``--pin`` puts worker i, and what it starts, on core i modulo this machine's cores.

**Local trees, shared** (issue 26): the older form below.

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
import collections
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

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


def start_cluster(procs: Procs, tmp: Path, worker_args: list[str], allow_code: bool = False, workers: int = 2,
                  pin: bool = False) -> tuple[str, str]:
    """A coordinator and ``workers`` one-slot worker processes started with ``worker_args`` (``pin``:
    worker i and everything it starts on core i modulo this machine's cores, by ``taskset``); its
    URL and a submitter key (``allow_code``: one that may ship bundles)."""
    _, port = start_coordinator_process(procs, tmp / "state" / "coordinator.duckdb")
    url = f"http://127.0.0.1:{port}"
    admin = Rest(url, (tmp / "state" / "admin.key").read_text().strip())
    cores = sorted(os.sched_getaffinity(0))
    for i in range(workers):
        key_file = tmp / f"worker{i}.key"
        key_file.write_text(admin.create_key("worker", f"bench-{i}"))
        key_file.chmod(0o600)
        procs.start(["-m", "distributed_testing.cli.worker", "--coordinator", url, "--api-key-file", str(key_file),
                     "--worker-id", f"bench-{i}", *worker_args, "--max-concurrent-tasks", "1",
                     "--db-path", str(tmp / f"worker{i}.duckdb")], tmp / f"worker{i}.log",
                    prefix=["taskset", "-c", str(cores[i % len(cores)])] if pin else ())
    try:
        wait_until(lambda: sum(w["state"] != "disconnected" for w in admin.workers().values()) == workers, 120,
                   "workers")
    except TimeoutError:
        for i in range(workers):
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


IMPLS = ("new", "base")


def first_remote_test(url: str, key: str, since: float) -> float | None:
    """The epoch at which the first test's setup began on a worker, of the tasks submitted after
    ``since`` (each report's ``start``)."""
    rest = Rest(url, key)
    tasks = rest.ok("GET", "/api/v1/tasks", params={"limit": "500"})["tasks"]
    starts = []
    for t in tasks:
        if t["task_id"].startswith("pytest-") and float(t.get("submitted_at") or 0) >= since:
            output = ((rest.ok("GET", f"/api/v1/tasks/{t['task_id']}").get("result") or {}).get("output") or {})
            # a test that freezes the clock (freezegun's) reports a start in its frozen time: not one
            starts += [float(r["start"]) for e in output.get("tests") or [] for r in e.get("reports") or []
                       if r.get("start") and float(r["start"]) >= since]
    return min(starts) if starts else None


def bench_registry(names: list[str], rounds: int, base: Path | None, work: Path, sizes: tuple[int, ...] = (2,),
                   pin: bool = False) -> None:
    """The registry suites, shipped (module docstring); a cluster of each size in ``sizes`` (one-slot
    workers) per checkout."""
    from distributed_testing.testing.suites import SUITES, fetch, run_pytest, submitter_env

    repos = {"new": REPO, **({"base": base.resolve()} if base is not None else {})}
    # a cluster per checkout and size, named "new", "base" (two workers) or "new w4"
    impls = {impl if n == 2 else f"{impl} w{n}": (repo, n) for impl, repo in repos.items() for n in sizes}
    rows: list[tuple[str, int, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="dt-plugin-bench-") as t:
        tmp = Path(t)
        clusters: dict[str, tuple[str, str]] = {}
        procs = {impl: Procs(tmp / impl.replace(" ", "-"), cwd=repo) for impl, (repo, _) in impls.items()}
        try:
            for impl, (_, n) in impls.items():
                (tmp / impl.replace(" ", "-")).mkdir()
                clusters[impl] = start_cluster(procs[impl], tmp / impl.replace(" ", "-"), ["--accept-bundles"],
                                               allow_code=True, workers=n, pin=pin)
            for name in names:
                suite = SUITES[name]
                tree = fetch(suite, work / "sdists")
                extra = [str(tree)] if suite.install_tree else []
                envs = {impl: submitter_env(work / f"venv-{name}-{impl}", [*suite.requirements, "pytest-xdist", *extra],
                                            repo / "distributed_testing") for impl, repo in repos.items()}
                pythons = {impl: envs[impl.split()[0]] for impl in impls}
                for r in range(rounds):
                    local_python = pythons["new"]
                    runs: dict[str, Any] = {}
                    collect = run_pytest(local_python, tree, [*suite.args, "--collect-only"], work / f"{name}-co.xml",
                                         suite.env)
                    runs["local"] = run_pytest(local_python, tree, list(suite.args), work / f"{name}-local.xml", suite.env)
                    runs["-n 2"] = run_pytest(local_python, tree, [*suite.args, "-n", "2"], work / f"{name}-n2.xml",
                                              suite.env)
                    fixed: dict[str, float | None] = {}
                    for label in ("1st", "2nd"):
                        for impl in impls:
                            url, key = clusters[impl]
                            since = time.time()
                            run = run_pytest(pythons[impl], tree, [*suite.fleet_args, "--dt-coordinator", url],
                                             work / f"{name}-{impl}-{label}.xml", {**suite.env, "DT_API_KEY": key},
                                             # an older plugin sends -o cache_dir to the workers, whose pytest refuses it
                                             cache=work / f"cache-{name}-{impl.replace(' ', '-')}-r{r}"
                                             if impl.startswith("new") else None)
                            runs[f"{impl} {label}"] = run
                            first = first_remote_test(url, key, since - 1)
                            fixed[f"{impl} {label}"] = None if first is None else first - since
                    for label, run in runs.items():
                        same = run.outcomes == runs["local"].outcomes
                        print(f"{name} round {r + 1} {label:9} {run.seconds:7.1f} s "
                              f"{dict(collections.Counter(run.outcomes.values()))} "
                              f"{'same as local' if same else 'DIFFERS'}"
                              + (f"; first remote test {fixed[label]:.2f} s after pytest's start"
                                 if fixed.get(label) is not None else ""), flush=True)
                    print(f"{name} round {r + 1} local --collect-only {collect.seconds:.2f} s; "
                          f"load average {os.getloadavg()[0]:.1f}", flush=True)
                    rows.append((name, r + 1, {"runs": runs, "fixed": fixed, "collect": collect.seconds,
                                               "load": os.getloadavg()[0]}))
        finally:
            for p in procs.values():
                p.close()
    cluster_labels = [f"{impl} {label}" for impl in impls for label in ("1st", "2nd")]
    print("\n| suite (round) | local | -n 2 | " + " | ".join(f"cluster {c}" for c in cluster_labels)
          + " | outcomes equal local | first remote test after start (" + ", ".join(cluster_labels)
          + "); local --collect-only | load |")
    print("|---" * (5 + 2 * len(cluster_labels) - len(cluster_labels) + 1) + "|")
    for name, r, row in rows:
        runs, n2 = row["runs"], row["runs"]["-n 2"].seconds
        equal = all(run.outcomes == runs["local"].outcomes for run in runs.values())
        cells = [f"{runs['local'].seconds:.1f} s", f"{n2:.1f} s"]
        cells += [f"{runs[c].seconds:.1f} s ({runs[c].seconds / n2:.2f}x)" for c in cluster_labels]
        firsts = ", ".join("-" if row["fixed"][c] is None else f"{row['fixed'][c]:.2f}" for c in cluster_labels)
        total = collections.Counter(runs["local"].outcomes.values())
        print(f"| {name} ({', '.join(f'{n} {k}' for k, n in sorted(total.items()))}) ({r}) | " + " | ".join(cells)
              + f" | {'yes' if equal else 'NO'} | {firsts}; {row['collect']:.2f} s | {row['load']:.1f} |")


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
    ap.add_argument("suites", nargs="*", metavar="NAME=DIR[:SUBPATH]")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--registry", metavar="NAMES", help="registry suites, shipped (comma-separated: toolz,attrs)")
    ap.add_argument("--base", type=Path, metavar="DIR", help="an older checkout to measure beside this one")
    ap.add_argument("--work", type=Path, metavar="DIR", help="where sdists and environments are kept")
    ap.add_argument("--workers", default="2", metavar="N[,N...]",
                    help="registry suites: a cluster of N one-slot workers per size, in the same rounds (default 2)")
    ap.add_argument("--pin", action="store_true",
                    help="registry suites: worker i and its children on core i modulo this machine's cores (taskset)")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()}", flush=True)
    if args.registry:
        work = args.work or Path(tempfile.mkdtemp(prefix="dt-plugin-suites-"))
        sizes = tuple(int(n) for n in args.workers.split(","))
        bench_registry(args.registry.split(","), args.rounds, args.base, work, sizes, args.pin)
        print(f"load average after: {os.getloadavg()}")
        return
    table = ["| suite | mode | wall s, median (each round) | / -n 2 | counts (last round) |", "|---|---|---|---|---|"]
    for item in args.suites:
        name, _, spec = item.partition("=")
        table += bench_suite(name, spec, args.rounds)
    print(f"load average after: {os.getloadavg()}")
    print("\n".join(table))


if __name__ == "__main__":
    main()
