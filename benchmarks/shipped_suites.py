"""Registry suites shipped as bundles: local pytest, ``pytest -n 2`` and the plugin through a
coordinator with two ``--accept-bundles`` worker processes (one slot each, bwrap), the cluster run
twice (the first builds the submitter's environment on the workers, the second finds it cached).

Each suite (``distributed_testing/testing/suite_registry.py``: toolz, pyparsing, more-itertools,
networkx) is fetched from the registry as an sdist and run from its unpacked tree in a virtual
environment holding its test dependencies and pytest-xdist; the outcomes of each run are read from
its JUnit report and compared with the local run's, test by test.

Usage::

    python -m benchmarks shipped_suites [--suites toolz,pyparsing,more-itertools,networkx] [--work DIR]

Prints one line per run and a table: wall time of each mode, the outcome counts, and whether every
test's outcome equals the local one; the load average before and after.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from plugin_suites import start_cluster  # noqa: E402  (benchmarks/ is on sys.path: python -m benchmarks)

from distributed_testing.testing import Procs  # noqa: E402
from distributed_testing.testing.suites import SUITES, Run, fetch, run_pytest, submitter_env  # noqa: E402


def summary(run: Run, local: Run) -> str:
    counts = collections.Counter(run.outcomes.values())
    same = run.outcomes == local.outcomes
    return f"{run.seconds:7.1f} s  {dict(sorted(counts.items()))}  {'same as local' if same else 'DIFFERS'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default=",".join(SUITES), help="comma-separated names (default: all)")
    parser.add_argument("--work", type=Path, default=None, help="where sdists and environments are kept")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="dt-shipped-suites-"))
    print(f"load average before: {os.getloadavg()}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        procs = Procs(Path(tmp), cwd=REPO)
        try:
            url, key = start_cluster(procs, Path(tmp), ["--accept-bundles"], allow_code=True)
            for name in args.suites.split(","):
                suite = SUITES[name]
                tree = fetch(suite, work / "sdists")
                python = submitter_env(work / f"venv-{name}", [*suite.requirements, "pytest-xdist"])
                runs = {"local": run_pytest(python, tree, list(suite.args), work / f"{name}-local.xml", suite.env)}
                runs["-n 2"] = run_pytest(python, tree, [*suite.args, "-n", "2"], work / f"{name}-n2.xml", suite.env)
                for label in ("cluster, 1st", "cluster, 2nd"):
                    runs[label] = run_pytest(python, tree, [*suite.fleet_args, "--dt-coordinator", url],
                                             work / f"{name}-{label[-3:]}.xml", {**suite.env, "DT_API_KEY": key})
                for label, run in runs.items():
                    print(f"{name:15} {label:13} {summary(run, runs['local'])}", flush=True)
                rows.append((name, runs))
        finally:
            procs.close()
    print(f"load average after: {os.getloadavg()}")
    print("\n| suite | local | -n 2 | cluster, 1st (env built) | cluster, 2nd (cached) | outcomes equal local |")
    print("|---|---|---|---|---|---|")
    for name, runs in rows:
        equal = all(r.outcomes == runs["local"].outcomes for r in runs.values())
        cells = " | ".join(f"{r.seconds:.1f} s" for r in runs.values())
        total = collections.Counter(runs["local"].outcomes.values())
        print(f"| {name} ({', '.join(f'{n} {k}' for k, n in sorted(total.items()))}) | {cells} | {'yes' if equal else 'NO'} |")


if __name__ == "__main__":
    main()
