"""Where the fixed cost of a shipped plugin run goes (issue 37): one registry suite (``--suite``,
default toolz) run ``--runs`` times through a coordinator and two one-slot ``--accept-bundles``
workers of this checkout (the first run builds the environment on the workers; the later ones
find it and the tree cached), printed as a timeline from pytest's start:

* **submitter**: when pytest configured, its session started, collection began and ended, and
  each of the plugin's calls (slots, environment capture, upload, run, each submit) began and
  ended, read by a plugin of this script's own (:class:`Marks`) that wraps the plugin's methods
  in the pytest process, which it joins through ``pytest.main(plugins=...)`` so that it is no
  option the tasks carry;
* **coordinator**: each task's submission, start and end on its worker (``session-*``: the warm
  tasks, ``pytest-*``: the tests'), and the first test's setup on a worker (its report's
  ``start``);
* **workers**: their log's lines on each session (prepared, started, ready: how long its
  pytest took to start and to collect).

Usage::

    python benchmarks/plugin_timeline.py --suite toolz --runs 4 [--work DIR]

``local --collect-only`` is printed first: what pytest spends before any test anyway.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# run in the submitter's environment: this file's folder first on its path, then pytest with Marks
RUNNER = ("import os, sys; sys.path.insert(0, os.getcwd()); sys.path.insert(1, sys.argv.pop(1)); "
          "import plugin_timeline, pytest; sys.exit(pytest.main(sys.argv[1:], plugins=[plugin_timeline.Marks()]))")


class Marks:
    """A pytest plugin (in the submitter's pytest) that writes a timestamp for each phase to the
    JSON file ``$TIMELINE_OUT``."""

    def __init__(self) -> None:
        self.out = os.environ["TIMELINE_OUT"]
        self.marks: list[tuple[str, float]] = []

    def mark(self, what: str) -> None:
        self.marks.append((what, time.time()))
        with open(self.out, "w") as f:
            json.dump(self.marks, f)

    def _wrap(self, owner: Any, name: str, label: str) -> None:
        orig = getattr(owner, name)

        @functools.wraps(orig)
        def timed(*a: Any, **k: Any) -> Any:
            self.mark(f"{label} <")
            try:
                return orig(*a, **k)
            finally:
                self.mark(f"{label} >")

        setattr(owner, name, timed)

    def pytest_cmdline_main(self, config: Any) -> None:
        import distributed_testing.bundles.upload as up
        import distributed_testing.pytest_plugin as pp

        self.mark("cmdline_main")
        self._wrap(pp.Fleet, "slots", "slots")
        self._wrap(pp.FleetRunner, "environment", "environment")
        self._wrap(pp if hasattr(pp, "upload_with_stats") else up, "upload_with_stats", "upload")
        self._wrap(pp.FleetRunner, "_new_run", "run")
        self._wrap(pp.Fleet, "submit", "submit")

    def pytest_configure(self, config: Any) -> None:
        self.mark("configure")

    def pytest_sessionstart(self, session: Any) -> None:
        self.mark("sessionstart")

    def pytest_collection(self, session: Any) -> None:
        self.mark("collection begins")

    def pytest_collection_finish(self, session: Any) -> None:
        self.mark("collection ends")

    def pytest_runtest_logreport(self, report: Any) -> None:
        if not any(w.startswith("first test reported") for w, _ in self.marks):
            self.mark("first test reported here")


def coordinator_events(rest: Any, since: float) -> list[tuple[float, str]]:
    events = []
    for t in rest.ok("GET", "/api/v1/tasks", params={"limit": "1000"})["tasks"]:
        if float(t.get("submitted_at") or 0) < since:
            continue
        full = rest.ok("GET", f"/api/v1/tasks/{t['task_id']}")
        res = full.get("result") or {}
        output = res.get("output") or {}
        kind, _, index = t["task_id"].rpartition("-")
        name = f"{kind.split('-')[0]}-{index}"
        if not name.startswith("pytest-") or index == "0":  # one submission of the tests' tasks
            events.append((float(t["submitted_at"]), f"{name} submitted"))
        if res.get("started_at"):
            events.append((float(res["started_at"]), f"{name} started on {res.get('worker_id')}"))
        if res.get("finished_at") and name.startswith("session-"):
            events.append((float(res["finished_at"]), f"{name} ended ({t.get('state')})"))
        starts = [float(r["start"]) for e in output.get("tests") or [] for r in e.get("reports") or [] if r.get("start")]
        if starts:
            events.append((min(starts), f"{name} first test's setup"))
    events.sort()
    first_test = next((i for i, (_, w) in enumerate(events) if w.endswith("first test's setup")), len(events))
    return events[:first_test + 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default="toolz")
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--work", type=Path, help="where the sdist and the submitter's environment are kept")
    args = ap.parse_args()
    # here, not at import: the submitter's pytest imports this module too, and this checkout's
    # metadata on its path would have pytest load the plugin a second time by its entry point
    sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]
    from plugin_suites import start_cluster

    from distributed_testing.testing import Procs, Rest
    from distributed_testing.testing.suites import PLUGIN, SUITES, fetch, submitter_env

    work = args.work or Path(tempfile.mkdtemp(prefix="dt-plugin-timeline-"))
    suite = SUITES[args.suite]
    tree = fetch(suite, work / "sdists")
    extra = [str(tree)] if suite.install_tree else []
    python = submitter_env(work / f"venv-{args.suite}", [*suite.requirements, "pytest-xdist", *extra], REPO / "distributed_testing")
    print(f"load average before: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="dt-plugin-timeline-") as t:
        tmp = Path(t)
        procs = Procs(tmp, cwd=REPO)
        try:
            url, key = start_cluster(procs, tmp, ["--accept-bundles"], allow_code=True)
            rest = Rest(url, key)
            began = time.time()
            subprocess.run([str(python), "-m", "pytest", "-p", PLUGIN, "-q", "-p", "no:cacheprovider", "--collect-only",
                            *suite.args], cwd=tree, capture_output=True, text=True, check=True)
            print(f"local --collect-only: {time.time() - began:.2f} s", flush=True)
            for run in range(args.runs):
                out = tmp / f"marks-{run}.json"
                env = {**os.environ, "DT_API_KEY": key, "TIMELINE_OUT": str(out)}
                began = time.time()
                done = subprocess.run([str(python), "-c", RUNNER, str(REPO / "benchmarks"), "-p", PLUGIN, "-q",
                                       "-o", f"cache_dir={tmp / 'cache'}", *suite.args, "--dt-coordinator", url],
                                      cwd=tree, env=env, capture_output=True, text=True, check=False)
                took = time.time() - began
                last = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
                print(f"\nrun {run + 1}{' (builds the environment)' if run == 0 else ''}: {took:.2f} s, {last}")
                events = [(when, f"submitter: {what}") for what, when in json.loads(out.read_text())]
                events += [(when, f"coordinator: {what}") for when, what in coordinator_events(rest, began - 1)]
                for when, what in sorted(events):
                    print(f"  {when - began:6.3f} s  {what}")
            for i in range(2):
                lines = (tmp / f"worker{i}.log").read_text().splitlines()
                print(f"\nworker {i}:")
                print("\n".join(line for line in lines if "test_session" in line))
        finally:
            procs.close()
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
