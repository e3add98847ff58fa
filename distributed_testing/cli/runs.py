"""Runs in ``dt``: ``dt submit`` makes one per task file, and ``dt runs``, ``dt run RUN``, ``dt rerun
RUN`` and ``dt cancel --run RUN`` read and act on them (REST: ``/api/v1/runs``, docs/tasks.md, "Runs").

A run's name is ``--run-name``, else what the CI job's variables say (``ci_name``: GitHub Actions,
GitLab CI, Buildkite, Jenkins), else the task file's name. Each new run is announced on stderr
by one line, ``run RUN_ID (NAME): URL``, the URL being its dashboard page when ``--dashboard-url``
(``DT_DASHBOARD_URL``) says where the dashboard is, else its REST path on the coordinator.

``dt runs`` and ``dt run`` show a person's format on a terminal (``--text`` elsewhere too) and the
API's JSON elsewhere (``--json`` on a terminal too), as ``dt status`` does.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import urllib.parse
from collections.abc import Mapping
from typing import Any

from ..config import environ
from .http import ApiClient
from .options import Setting, resolve
from .report import first_line, iso_time, print_table, with_iso_times

DASHBOARD_SETTING = Setting(
    "--dashboard-url", env="DT_DASHBOARD_URL", metavar="URL",
    help="where the dashboard is (e.g. http://host:8080/dashboard): the line announcing a new run links its "
         "page there (default: the run's REST path on the coordinator)")
# (variable, what it says) per CI system, in the order tried: the first system whose first variable
# is set names the run from those of its variables that are set
CI_NAMES: tuple[tuple[str, ...], ...] = (
    ("GITHUB_WORKFLOW", "GITHUB_JOB", "GITHUB_RUN_NUMBER", "GITHUB_SHA"),
    ("CI_JOB_NAME", "CI_PIPELINE_ID", "CI_COMMIT_SHORT_SHA"),
    ("BUILDKITE_PIPELINE_SLUG", "BUILDKITE_BUILD_NUMBER", "BUILDKITE_COMMIT"),
    ("JOB_NAME", "BUILD_NUMBER", "GIT_COMMIT"),
)
LABELS = {"GITHUB_SHA": "commit", "CI_COMMIT_SHA": "commit", "BUILDKITE_COMMIT": "commit", "GIT_COMMIT": "commit",
          "GITHUB_REF_NAME": "branch", "CI_COMMIT_REF_NAME": "branch", "BUILDKITE_BRANCH": "branch",
          "GIT_BRANCH": "branch"}
SHORT_SHA = 12
MAX_NAME = 200


def ci_name(env: Mapping[str, str]) -> str | None:
    """A run name from the CI job's variables (``CI_NAMES``), e.g. ``tests build 41 3f2a9c1d0e4b``; None outside CI."""
    for names in CI_NAMES:
        if env.get(names[0]):
            parts = [env[n][:SHORT_SHA] if n.endswith(("SHA", "COMMIT")) else env[n] for n in names if env.get(n)]
            return " ".join(parts)[:MAX_NAME]
    return None


def ci_labels(env: Mapping[str, str]) -> dict[str, str]:
    """``commit`` and ``branch`` labels from the CI job's variables, where set."""
    out: dict[str, str] = {}
    for var, label in LABELS.items():
        if env.get(var) and label not in out:
            out[label] = env[var][:256]
    return out


def run_name(given: str | None, env: Mapping[str, str], fallback: str) -> str:
    """``--run-name``, else the CI job's (``ci_name``), else ``fallback``."""
    return (given or ci_name(env) or fallback)[:MAX_NAME]


def short_id(run_id: str) -> str:
    """What a run's task ids end with after ``@`` (``run-0123456789ab`` -> ``0123456789ab``)."""
    return run_id.removeprefix("run-")


def derived_id(task_id: str, run_id: str, max_len: int = 128) -> str:
    """``task_id@<short id>``, cut to fit ``max_len`` (the coordinator's re-runs name tasks so too)."""
    suffix = "@" + short_id(run_id)
    return task_id[: max_len - len(suffix)] + suffix


def create_run(api: ApiClient, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """A new run; its id chosen here, so the request is safe to send again (to the next member of
    a group, or through a load balancer during a failover)."""
    body = {"name": name, "labels": dict(labels), "run_id": f"run-{secrets.token_hex(6)}"}
    run: dict[str, Any] = api.post("/api/v1/runs", body, repeatable=True)
    return run


def run_url(run_id: str, dashboard_url: str | None, coordinator_url: str) -> str:
    quoted = urllib.parse.quote(run_id, safe="")
    if dashboard_url:
        return f"{dashboard_url.rstrip('/')}/runs/{quoted}"
    return f"{coordinator_url.rstrip('/')}/api/v1/runs/{quoted}"


def run_line(run: Mapping[str, Any], dashboard_url: str | None, coordinator_url: str) -> str:
    """``run RUN_ID (NAME): URL``: what dt and the pytest plugin say of a run they made."""
    return f"run {run['run_id']} ({run['name']}): {run_url(run['run_id'], dashboard_url, coordinator_url)}"


def announce(api: ApiClient, ns: argparse.Namespace, run: Mapping[str, Any]) -> None:
    dashboard = resolve((DASHBOARD_SETTING,), ns, environ())["dashboard_url"]
    print(run_line(run, dashboard, api.base_url), file=sys.stderr, flush=True)


# ------------------------------------------------------------------- commands


def _shape(p: argparse.ArgumentParser, what: str) -> None:
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_const", const="json", dest="shape",
                       help=f"{what} as the API's JSON (times in ISO 8601), also on a terminal")
    shape.add_argument("--text", action="store_const", const="text", dest="shape",
                       help="the human format, also when stdout is no terminal")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``runs`` and ``run`` to ``sub``."""
    text = "list runs (the tasks of one submission), newest first, with their state and counts"
    rs = sub.add_parser("runs", help=text, description=text)
    rs.add_argument("--limit", type=int, default=20, help="at most this many runs (1 to 200, default 20)")
    rs.add_argument("--state", choices=["queued", "running", "succeeded", "failed", "cancelled"],
                    help="only the runs in this state")
    _shape(rs, "the runs")
    rs.set_defaults(run=cmd_runs)
    text = "show one run: its state, counts and tasks, failures first with the first line of each error"
    r1 = sub.add_parser("run", help=text, description=text)
    r1.add_argument("run_id", metavar="RUN", help="the run's id (dt runs lists them)")
    _shape(r1, "the run")
    r1.set_defaults(run=cmd_run)


def register_rerun(sub: argparse._SubParsersAction[argparse.ArgumentParser], handler: Any) -> argparse.ArgumentParser:
    """Add ``rerun`` to ``sub``, run by ``handler`` (``submit.cmd_rerun``: it waits as submit does)."""
    text = ("submit a run's tasks again as a new run (new ids: <id>@<new run>); prints the new run's line on "
            "stderr and each new task id on stdout")
    rr = sub.add_parser("rerun", help=text, description=text)
    rr.add_argument("run_id", metavar="RUN", help="the run to run again")
    rr.add_argument("--failed", action="store_true",
                    help="only the tasks that failed, timed out, errored or were cancelled")
    rr.add_argument("--name", help="the new run's name (default: the old one's with '(re-run)')")
    rr.add_argument("--wait", action="store_true", help="wait for the new tasks to finish, as dt submit --wait")
    rr.set_defaults(run=handler)
    return rr


def _human(ns: argparse.Namespace) -> bool:
    return bool(ns.shape == "text" or (ns.shape is None and sys.stdout.isatty()))


def counts_text(counts: Mapping[str, int]) -> str:
    """``3 succeeded, 1 failed`` (failures first)."""
    order = ("failed", "timed_out", "error", "cancelled", "running", "assigned", "pending", "succeeded")
    return ", ".join(f"{counts[s]} {s}" for s in sorted(counts, key=lambda s: (order.index(s) if s in order else 99, s)))


def _duration(run: Mapping[str, Any]) -> str | None:
    start, end = run.get("started_at"), run.get("ended_at")
    return f"{end - start:.1f}s" if start is not None and end is not None else None


def cmd_runs(api: ApiClient, ns: argparse.Namespace) -> int:
    params = {"limit": str(ns.limit)} | ({"state": ns.state} if ns.state else {})
    runs = api.get("/api/v1/runs", params)["runs"]
    if not _human(ns):
        print(json.dumps(with_iso_times({"runs": runs}, ns.local_time), indent=2))
        return 0
    rows = [{"run_id": r["run_id"], "name": r["name"], "state": r["state"], "tasks": r["total"],
             "counts": counts_text(r["counts"]), "created_at": iso_time(r["created_at"], ns.local_time),
             "duration": _duration(r)} for r in runs]
    print_table(rows, ["run_id", "name", "state", "tasks", "counts", "created_at", "duration"])
    return 0


def render_run(run: Mapping[str, Any], local: bool = False) -> list[str]:
    """A run as ``dt run`` shows it on a terminal: a header, then one line per task (failures
    first), a failed test task's failing tests under it."""
    lines = [f"run {run['run_id']}: {run['name']}", f"  state: {run['state']} ({counts_text(run['counts'])})",
             f"  created: {iso_time(run['created_at'], local)} by {run['submitted_by'] or '-'}"]
    if run.get("started_at") is not None:
        lines.append(f"  started: {iso_time(run['started_at'], local)}")
    if run.get("ended_at") is not None:
        lines.append(f"  ended: {iso_time(run['ended_at'], local)} ({_duration(run)})")
    for k, v in sorted(run.get("labels", {}).items()):
        lines.append(f"  {k}: {v}")
    lines.append("")
    for t in run.get("tasks", []):
        took = f"{t['duration_s']:.2f}s" if t.get("duration_s") is not None else "-"
        line = f"{t['state']:<10} {t['task_id']}  ({t['type']}, {t['worker_id'] or 'no worker'}, {took})"
        if t.get("error_line"):
            line += f": {first_line(t['error_line'])}"
        lines.append(line)
        for nodeid in (t.get("tests") or {}).get("failing", []):
            lines.append(f"             failed: {nodeid}")
    return lines


def cmd_run(api: ApiClient, ns: argparse.Namespace) -> int:
    run = api.get(f"/api/v1/runs/{urllib.parse.quote(ns.run_id, safe='')}")
    if _human(ns):
        print("\n".join(render_run(run, ns.local_time)))
    else:
        print(json.dumps(with_iso_times(run, ns.local_time), indent=2))
    return 0


def cancel_run(api: ApiClient, run_id: str) -> int:
    """``dt cancel --run RUN``: one ``ID: cancelled`` line per task cancelled; stderr says how many
    had already finished."""
    out = api.post(f"/api/v1/runs/{urllib.parse.quote(run_id, safe='')}/cancel", None, repeatable=True)
    for task_id in out["cancelled"]:
        print(f"{task_id}: cancelled", flush=True)
    print(f"dt: run {out['run_id']}: {len(out['cancelled'])} task(s) cancelled, {out['finished']} had already "
          "finished", file=sys.stderr)
    return 0


def rerun(api: ApiClient, ns: argparse.Namespace) -> tuple[list[str], str]:
    """``dt rerun``'s request: the new run announced, its task ids printed; returns them and the
    new run's id."""
    body: dict[str, Any] = {"failed": ns.failed} | ({"name": ns.name} if ns.name else {})
    run = api.post(f"/api/v1/runs/{urllib.parse.quote(ns.run_id, safe='')}/rerun", body)
    announce(api, ns, run)
    new_ids = list(run["task_ids"].values())
    for task_id in new_ids:
        print(task_id, flush=True)
    return new_ids, str(run["run_id"])
