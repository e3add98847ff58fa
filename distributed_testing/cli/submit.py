"""``dt submit``: send a task file, and with ``--wait`` follow every task to its end.

Every task without a ``task_id`` gets one before it is sent (``TYPE-dt`` + 20 hex digits), so a
submission whose answer was lost in a failover is re-sent as the same tasks (idempotent), also to
one URL, which may be a load balancer's in front of a group (``client.ApiClient`` retries it for
the failover bound), and the wait goes on against whichever member leads.

With ``--bundle DIR`` every ``test`` task that names no ``requirements.python`` of its own
carries the Python environment ``dt`` runs in (:mod:`..bundles.environment`: the installed
distributions, ``name==version``), so the workers run its tests in that set; a
``requirements.txt`` at DIR's root replaces it and ``--no-env`` sends none. Other kinds run this
package's own runner in the child, beside the worker's packages: they take an explicit list.

The wait polls ``GET /api/v1/tasks/{id}`` for each unfinished task every ``POLL_S`` seconds (at
most ``MAX_POLLS_PER_ROUND`` requests a round, taking the unfinished tasks in turn), feeds a
:mod:`.progress` display, and ends when every task is final, when ``--timeout`` passes, or, with
``--fail-if-unschedulable S``, when a task has been unschedulable (no connected worker meets its
requirements) for S seconds. Tasks it stops waiting for stay queued on the coordinator; Ctrl-C
(SIGINT) ends the wait with one line naming the tasks that keep running and the ``dt cancel``
command for them (exit 130, no traceback).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
import urllib.parse
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bundles.environment import LocalInstallError, capture
from ..bundles.upload import UploadError, upload_with_stats
from ..config import environ
from ..errors import ConfigError, ValidationError
from . import compare, runs
from .common import output_file, seconds
from .http import ApiClient, ApiError
from .progress import LiveProgress, NoProgress, PlainProgress, Progress, Tracker
from .report import print_summary, summary_row, write_json, write_junit

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNSCHEDULABLE, EXIT_GAVE_UP = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C ended
POLL_S = 0.5
MAX_POLLS_PER_ROUND = 100
DEFAULT_TIMEOUT_S = 3600.0  # how long --wait waits without --timeout
GAVE_UP, UNSCHEDULABLE = "wait_timeout", "unschedulable"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``submit`` subcommand to ``sub``."""
    sp = sub.add_parser("submit", help="submit a task JSON file (one task or a list)")
    sp.add_argument("file", type=Path, help="task JSON file, or - for stdin")
    sp.add_argument("--bundle", type=Path, metavar="DIR",
                    help="upload DIR as a bundle (only the files the coordinator lacks; .gitignore and .dtignore "
                         "honoured) and run every task on that tree; needs a key created with --allow-code")
    sp.add_argument("--no-env", action="store_true",
                    help="with --bundle: send no Python environment (default: each test task without its own "
                         "requirements.python carries the distributions installed where dt runs; a requirements.txt "
                         "at the bundle's root replaces them)")
    sp.add_argument("--wait", action="store_true", help="wait for every task to finish, showing progress on stderr")
    sp.add_argument("--timeout", type=seconds, metavar="S",
                    help="stop waiting after S seconds, exit 4 (default 3600); the tasks stay queued "
                         "(implies --wait)")
    sp.add_argument("--fail-if-unschedulable", type=seconds, metavar="S", dest="unschedulable_s",
                    help="stop waiting, exit 3, once a task has had no connected worker that meets its "
                         "requirements for S seconds (implies --wait)")
    sp.add_argument("--progress", choices=["auto", "live", "plain", "off"], default="auto",
                    help="while waiting: live = a redrawn table (needs a terminal), plain = one timestamped "
                         "line per state change, off = nothing; auto = live on a terminal, else plain")
    sp.add_argument("--junit", type=output_file, metavar="PATH", help="write a JUnit XML report (implies --wait)")
    sp.add_argument("--json", type=output_file, metavar="PATH", dest="json_out",
                    help="write the tasks, their results and the summary as JSON (implies --wait)")
    sp.add_argument("--run-name", metavar="NAME",
                    help="name the run these tasks make (default: the CI job's, from GITHUB_WORKFLOW, CI_JOB_NAME, "
                         "BUILDKITE_PIPELINE_SLUG or JOB_NAME and their build and commit variables; else the file's name)")
    compare.add_arguments(sp, for_submit=True)
    sp.set_defaults(run=cmd_submit)
    rr = runs.register_rerun(sub, cmd_rerun)
    rr.add_argument("--progress", choices=["auto", "live", "plain", "off"], default="auto",
                    help="with --wait: as dt submit's --progress")


def load_doc(path: Path) -> Any:
    """The JSON document in ``path`` (``-``: stdin); ConfigError naming the file otherwise."""
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from exc
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from exc
    except ValueError as exc:  # _no_constant's
        raise ConfigError(f"{path}: not valid JSON: {exc}") from exc
    except RecursionError:
        raise ConfigError(f"{path}: not valid JSON: nested too deeply") from None


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is beyond what a JSON number may be here (a double)")
    return value


def _no_constant(name: str) -> Any:
    """Python's json reads NaN and Infinity; JSON (RFC 8259) has no such values, nor does the API."""
    raise ValueError(f"{name} is not a JSON value (RFC 8259 has no NaN or Infinity): use a number or null")


def cmd_submit(api: ApiClient, ns: argparse.Namespace) -> int:
    doc = load_doc(ns.file)
    if ns.baseline:  # the comparison's flags and baseline before the tasks run, not after the wait
        compare.policy_from_args(ns)
        compare.check_baseline(api, ns.baseline)
    if ns.bundle is not None:
        doc = with_environment(doc, bundle_environment(ns.bundle, ns.no_env))  # refused before anything is sent
        doc = with_bundle(doc, upload_bundle(api, ns.bundle))
    env = environ()
    run = runs.create_run(api, runs.run_name(ns.run_name, env, "stdin" if str(ns.file) == "-" else ns.file.name),
                          runs.ci_labels(env))
    # ids make a re-send after a lost answer harmless (the same tasks), with one URL too: it may be
    # a load balancer's in front of a group
    doc = with_run(with_task_ids(doc), run["run_id"])
    try:
        answer = api.post("/api/v1/tasks", doc, repeatable=all_have_ids(doc))
    except ApiError as exc:
        if exc.status != 409:
            raise
        # an id of the file holds another body (the code or the file changed since): this run's
        # tasks take ids of their own, as dt rerun's, instead of making the user rename them
        doc = with_run_ids(doc, run["run_id"])
        print(f"dt: {exc}; this run's tasks are named ID@{runs.short_id(run['run_id'])}", file=sys.stderr)
        answer = api.post("/api/v1/tasks", doc, repeatable=True)
    for warning in answer.get("warnings", []):  # e.g. a deprecated spelling, accepted this time
        print(f"dt: warning: {warning}", file=sys.stderr)
    runs.announce(api, ns, run)  # once it holds the tasks (a refused file leaves an empty run, unannounced)
    accepted = answer["tasks"]
    for a in accepted:
        print(a["task_id"], flush=True)
    if kept := [a["task_id"] for a in accepted if not a["created"]]:
        print(f"dt: {len(kept)} task(s) already existed with the same body and stay in the run they joined first "
              f"(dt rerun RUN runs a run's tasks again): {' '.join(kept)}", file=sys.stderr)
    if not (ns.wait or ns.junit or ns.json_out or ns.baseline or ns.unschedulable_s is not None
            or ns.timeout is not None):
        return EXIT_OK
    return wait_and_report(api, ns, [a["task_id"] for a in accepted], run["run_id"], kept)


def cmd_rerun(api: ApiClient, ns: argparse.Namespace) -> int:
    """``dt rerun RUN [--failed] [--wait]`` (``runs.rerun``), waiting as ``dt submit --wait``."""
    ids, run_id = runs.rerun(api, ns)
    return wait_and_report(api, ns, ids, run_id) if ns.wait else EXIT_OK


def wait_and_report(api: ApiClient, ns: argparse.Namespace, task_ids: list[str], run_id: str | None = None,
                    outside: Sequence[str] = ()) -> int:
    """The wait of ``dt submit`` (and ``dt rerun --wait``): progress, the summary, the reports
    asked for; the exit status. ``run_id``: the run the tasks were submitted in, less the ids in
    ``outside`` (unchanged tasks that stayed in the run they joined first)."""
    timeout = getattr(ns, "timeout", None)
    junit, json_out, baseline = (getattr(ns, k, None) for k in ("junit", "json_out", "baseline"))
    progress = make_progress(ns.progress, ns.local_time)
    try:
        waited = wait_tasks(api, task_ids, timeout if timeout is not None else DEFAULT_TIMEOUT_S,
                            getattr(ns, "unschedulable_s", None), progress)
    except Interrupted as stop:
        progress.close()  # the live table stays above the line, not drawn over it
        print(interrupted_line(stop.unfinished, run_id, outside), file=sys.stderr)
        return EXIT_INTERRUPTED
    except BaseException:
        progress.close()
        raise
    progress.close()
    print_summary(waited.tasks, sys.stderr)
    if junit:
        write_junit(junit, waited.tasks)
    if json_out:
        write_json(json_out, {"tasks": waited.tasks, "summary": [summary_row(t) for t in waited.tasks]})
    code = waited.exit_code()
    if baseline and compare.run(api, [t["task_id"] for t in waited.tasks], ns, junit=ns.junit,
                                   append_junit=True) == EXIT_FAILED:
        code = EXIT_FAILED  # a regression counts as a failed task
    return code


def upload_bundle(api: ApiClient, root: Path) -> str:
    """Upload ``root`` (``bundles.upload``); its manifest digest. One line on stderr says what
    was sent."""
    try:
        stats = upload_with_stats(api.base_url, api.credential, root, ssl_context=api.ssl_context)
    except UploadError as exc:
        raise ApiError(exc.status, f"uploading the bundle {root}: {exc}") from exc
    except ValidationError as exc:
        raise ConfigError(f"--bundle {root}: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"--bundle {root}: {exc.strerror or exc}") from exc
    print(f"bundle {stats.digest}: {stats.files} files ({stats.total_bytes} bytes), uploaded {stats.blobs_sent} "
          f"({stats.bytes_sent} bytes) in {stats.seconds:.2f} s", file=sys.stderr)
    return stats.digest


def with_bundle(doc: Any, digest: str) -> Any:
    """``doc`` with ``"bundle": digest`` on every task object."""
    if isinstance(doc, dict):
        return {**doc, "bundle": digest}
    if isinstance(doc, list):
        return [with_bundle(t, digest) if isinstance(t, dict) else t for t in doc]
    return doc


def bundle_environment(root: Path, no_env: bool) -> list[str]:
    """The distributions a bundle's test tasks run in (:mod:`..bundles.environment`); none with
    ``--no-env`` or where the bundle's own ``requirements.txt`` chooses (the worker reads it)."""
    if no_env or (root / "requirements.txt").is_file():
        return []
    try:
        return capture(root)
    except LocalInstallError as exc:
        raise ConfigError(f"--bundle {root}: the Python environment cannot travel: {exc} (--no-env sends none)") from exc


def with_environment(doc: Any, python: list[str]) -> Any:
    """``doc`` with ``requirements.python`` set to ``python`` on every ``test`` task object that
    has none of its own (its own list is the submitter's choice); anything else is left for the
    coordinator to judge."""
    def one(t: Any) -> Any:
        if not python or not isinstance(t, dict) or t.get("type") != "test":
            return t
        req = t.get("requirements", {})
        if not isinstance(req, dict) or req.get("python"):
            return t
        return {**t, "requirements": {**req, "python": python}}
    return [one(t) for t in doc] if isinstance(doc, list) else one(doc)


def with_task_ids(doc: Any) -> Any:
    """``doc`` with a fresh ``task_id`` on every task object that has none (``TYPE-dt`` + 20 hex
    digits); anything else is left for the coordinator to judge."""
    def one(t: Any) -> Any:
        if isinstance(t, dict) and "task_id" not in t:
            kind = t.get("type") if isinstance(t.get("type"), str) and t.get("type") else "task"
            return {"task_id": f"{kind}-dt{uuid.uuid4().hex[:20]}", **t}
        return t
    return [one(t) for t in doc] if isinstance(doc, list) else one(doc)


def with_run(doc: Any, run_id: str) -> Any:
    """``doc`` with ``run_id`` on every task object that names no run of its own."""
    def one(t: Any) -> Any:
        return {**t, "run_id": run_id} if isinstance(t, dict) and "run_id" not in t else t
    return [one(t) for t in doc] if isinstance(doc, list) else one(doc)


def with_run_ids(doc: Any, run_id: str) -> Any:
    """``doc`` with every task object's ``task_id`` suffixed ``@<the run's short id>``."""
    def one(t: Any) -> Any:
        if isinstance(t, dict) and isinstance(t.get("task_id"), str):
            return {**t, "task_id": runs.derived_id(t["task_id"], run_id)}
        return t
    return [one(t) for t in doc] if isinstance(doc, list) else one(doc)


def all_have_ids(doc: Any) -> bool:
    items = doc if isinstance(doc, list) else [doc]
    return bool(items) and all(isinstance(t, dict) and isinstance(t.get("task_id"), str) for t in items)


def make_progress(mode: str, local_time: bool) -> Progress:
    if mode == "auto":
        mode = "live" if sys.stderr.isatty() else "plain"
    if mode == "live":
        return LiveProgress(sys.stderr)
    return PlainProgress(sys.stderr, local_time) if mode == "plain" else NoProgress()


@dataclass
class Waited:
    """Every task as the wait left it (a task it stopped waiting for has an ``outcome`` with
    status ``wait_timeout`` or ``unschedulable`` and the reason), and why it stopped early."""

    tasks: list[dict[str, Any]]
    stopped: str | None  # None: every task is final; else GAVE_UP or UNSCHEDULABLE

    def exit_code(self) -> int:
        """1 if a final task did not succeed, else 3 after ``--fail-if-unschedulable``, 4 after
        ``--timeout``, 0 when every task succeeded."""
        finished = [t for t in self.tasks if (t.get("outcome") or {}).get("status") not in (GAVE_UP, UNSCHEDULABLE)]
        if any(t["state"] != "succeeded" for t in finished):
            return EXIT_FAILED
        return {None: EXIT_OK, UNSCHEDULABLE: EXIT_UNSCHEDULABLE}.get(self.stopped, EXIT_GAVE_UP)


class Interrupted(Exception):
    """Ctrl-C ended the wait; ``unfinished``: the ids of the tasks not seen final, which keep
    running (or waiting) on the coordinator."""

    def __init__(self, unfinished: list[str]) -> None:
        super().__init__(f"interrupted with {len(unfinished)} task(s) unfinished")
        self.unfinished = unfinished


def interrupted_line(unfinished: list[str], run_id: str | None = None, outside: Sequence[str] = ()) -> str:
    """What ``dt submit --wait`` says when Ctrl-C ends its wait: one line naming what goes on
    without it and the command that cancels it: ``dt cancel --run RUN`` for the run's tasks, and
    the ids of those outside it (``outside``), or every id without a run."""
    if not unfinished:
        return "dt: interrupted; every task had already finished"
    head = f"dt: interrupted; {len(unfinished)} task(s) keep running (or waiting) on the coordinator; cancel them with: "
    others = [i for i in unfinished if i in set(outside)] if run_id else unfinished
    commands = [f"dt cancel --run {shlex.quote(run_id)}"] if run_id and len(others) < len(unfinished) else []
    if others:
        commands.append(f"dt cancel {' '.join(shlex.quote(i) for i in others)}")
    return head + " and ".join(commands)


def wait_tasks(api: ApiClient, task_ids: list[str], timeout_s: float, unschedulable_s: float | None,
               progress: Progress, *, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> Waited:
    """Poll ``task_ids`` until each is final or the wait stops (see the module docstring).
    :class:`Interrupted` when Ctrl-C (KeyboardInterrupt) ends it."""
    ids = list(dict.fromkeys(task_ids))
    tracker = Tracker()
    try:
        return _wait(api, ids, tracker, timeout_s, unschedulable_s, progress, clock, sleep)
    except KeyboardInterrupt:
        raise Interrupted([i for i in ids if (tracker.views.get(i) or {}).get("outcome") is None]) from None


def _wait(api: ApiClient, ids: list[str], tracker: Tracker, timeout_s: float, unschedulable_s: float | None,
          progress: Progress, clock: Callable[[], float], sleep: Callable[[float], None]) -> Waited:
    unfinished = list(ids)
    blocked_since: dict[str, float] = {}
    deadline = clock() + timeout_s
    stopped: str | None = None
    while True:
        batch, unfinished = unfinished[:MAX_POLLS_PER_ROUND], unfinished[MAX_POLLS_PER_ROUND:]
        changes = []
        now = clock()
        for task_id in batch:
            view: dict[str, Any] = api.get(f"/api/v1/tasks/{urllib.parse.quote(task_id, safe='')}")
            change = tracker.update(view)
            if change is not None:
                changes.append(change)
            if view.get("unschedulable"):
                blocked_since.setdefault(task_id, now)
            else:
                blocked_since.pop(task_id, None)
            if view.get("outcome") is None:
                unfinished.append(task_id)
        progress.show(tracker, changes)
        now = clock()
        if not unfinished:
            break
        if unschedulable_s is not None and any(now - t >= unschedulable_s for t in blocked_since.values()):
            stopped = UNSCHEDULABLE
            break
        if now >= deadline:
            stopped = GAVE_UP
            break
        sleep(max(0.0, min(POLL_S, deadline - now)))
    views = [tracker.views[i] for i in ids]
    return Waited([v if v.get("outcome") is not None else _given_up(v, stopped, unschedulable_s) for v in views],
                  stopped)


def _given_up(view: dict[str, Any], stopped: str | None, unschedulable_s: float | None) -> dict[str, Any]:
    reason = view.get("pending_reason")
    if stopped == UNSCHEDULABLE and view.get("unschedulable"):
        error = f"dt: no connected worker can run it (waited {unschedulable_s:g}s): {reason}"
        return {**view, "outcome": {"status": UNSCHEDULABLE, "error": error}}
    error = f"dt: gave up waiting while {view['state']}" + (f": {reason}" if reason else "")
    return {**view, "outcome": {"status": GAVE_UP, "error": error}}
