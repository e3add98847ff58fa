"""What a run shows, derived from its tasks: its state, counts, start and end, and each task's
line (``GET /api/v1/runs`` and ``/runs/{id}``); the ids a re-run gives its tasks. Pure: the
tasks are passed in (a ``Task`` from memory or a stored ``TaskRow``: the fields read are the
same), and so is everything the result rows say about tests.

A run's state:

- ``queued``: no task has left ``pending`` yet (a run without tasks too);
- ``running``: some task is not finished and some task has left ``pending``;
- once every task is finished: ``failed`` if any failed, timed out or errored, else
  ``cancelled`` if any was cancelled, else ``succeeded``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

from ...tasks.states import TERMINAL
from .rows import RunRow, TaskRow

FAILED = frozenset({"failed", "timed_out", "error"})
# What ``rerun --failed`` submits again: every task that did not succeed.
RERUN_FAILED = FAILED | {"cancelled"}
RUN_STATES = ("queued", "running", "succeeded", "failed", "cancelled")
MAX_ERROR_LINE = 300
MAX_FAILING_TESTS = 20
TEST_COUNTS = ("passed", "failed", "skipped", "xfailed", "errors")


def run_state(counts: Mapping[str, int]) -> str:
    """The run's state from its tasks' counts by state (the module doc)."""
    total = sum(counts.values())
    finished = sum(n for s, n in counts.items() if s in TERMINAL)
    if finished < total or total == 0:
        return "queued" if counts.get("pending", 0) == total else "running"
    if any(counts.get(s, 0) for s in FAILED):
        return "failed"
    return "cancelled" if counts.get("cancelled", 0) else "succeeded"


def started_at(t: Any) -> float | None:
    """When the task's latest attempt started (its history: running, or else sent to its worker,
    which may answer without saying it started), else None."""
    for entry in reversed(t.history):
        if entry.get("to") in ("running", "assigned"):
            return float(entry["at"])
    return None


def error_line(t: Any) -> str | None:
    """The first non-empty line of the task's error, cut to ``MAX_ERROR_LINE`` characters."""
    error = (t.outcome or {}).get("error")
    if not isinstance(error, str):
        return None
    line = next((ln.strip() for ln in error.splitlines() if ln.strip()), "")
    return line[:MAX_ERROR_LINE] or None


def tests_of(output: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A test task's counts and the node ids of its failing tests, from its result's output."""
    if not output or "passed" not in output:
        return None
    counts = {k: int(output.get(k) or 0) for k in TEST_COUNTS}
    failing = [str(e.get("nodeid")) for e in output.get("tests") or []
               if isinstance(e, dict) and e.get("outcome") in ("failed", "error")]
    return {**counts, "failing": failing[:MAX_FAILING_TESTS]}


def task_line(t: Any, output: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One task of a run as its detail lists it; ``output``: its outcome's result output, if known."""
    start = started_at(t)
    end = t.updated_at if t.state in TERMINAL else None
    duration = (t.outcome or {}).get("duration_s")
    if duration is None and start is not None and end is not None:
        duration = round(end - start, 6)
    return {"task_id": t.task_id, "type": t.type, "state": t.state, "worker_id": t.worker_id,
            "started_at": start, "finished_at": end, "duration_s": duration, "error_line": error_line(t),
            "tests": tests_of(output) if t.type == "test" else None}


def _rank(line: Mapping[str, Any]) -> int:
    state = line["state"]
    return 0 if state in FAILED else 1 if state in ("running", "assigned") else 2 if state == "cancelled" else 3


def ordered(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Failures first, then running tasks, then cancelled ones, then the rest; by task id within each."""
    return sorted(lines, key=lambda x: (_rank(x), x["task_id"]))


def run_view(run: RunRow) -> dict[str, Any]:
    """The run's own fields, as ``POST /api/v1/runs`` answers them."""
    return {"run_id": run.run_id, "name": run.name, "labels": run.labels, "submitted_by": run.submitted_by,
            "created_at": run.created_at}


class RunStats(msgspec.Struct):
    """What a run's summary needs of its tasks (``Store.run_stats``): how many are in each state,
    when the first of them was first sent to a worker (``first_dispatch``), and the latest
    ``updated_at`` of any (None without tasks)."""

    counts: dict[str, int] = {}
    first_dispatch: float | None = None
    last_update: float | None = None


def first_dispatch(t: Any) -> float | None:
    """When the task was first sent to a worker: its history's second entry (the first is its
    submission) when that is the move to ``assigned``; None when it never was."""
    h = t.history
    return float(h[1]["at"]) if len(h) > 1 and h[1].get("to") == "assigned" else None


def stats_of(tasks: Iterable[Any]) -> RunStats:
    """``RunStats`` of one run's ``tasks`` (stored rows, or tasks from memory)."""
    s = RunStats(counts={})
    for t in tasks:
        add_stats(s, {t.state: 1}, first_dispatch(t), t.updated_at)
    return s


def stats_of_runs(rows: Iterable[TaskRow], run_ids: Iterable[str]) -> dict[str, RunStats]:
    """``Store.run_stats`` in Python: ``RunStats`` of each of ``run_ids`` (every one present,
    empty without tasks) from stored ``rows`` (those of other runs are skipped)."""
    out = {r: RunStats(counts={}) for r in run_ids}
    for t in rows:
        s = out.get(t.run_id) if t.run_id is not None else None
        if s is not None:
            add_stats(s, {t.state: 1}, first_dispatch(t), t.updated_at)
    return out


def add_stats(s: RunStats, counts: Mapping[str, int], dispatched: float | None, updated: float | None) -> None:
    """Fold tasks' counts, earliest dispatch and latest update into ``s``."""
    for state, n in counts.items():
        s.counts[state] = s.counts.get(state, 0) + n
    if dispatched is not None and (s.first_dispatch is None or dispatched < s.first_dispatch):
        s.first_dispatch = dispatched
    if updated is not None and (s.last_update is None or updated > s.last_update):
        s.last_update = updated


def summary_of(run: RunRow, stats: RunStats) -> dict[str, Any]:
    """The run with its state, counts by task state, total, start (its first task's first
    dispatch) and end (the last task's end, once every task has finished)."""
    total = sum(stats.counts.values())
    done = total > 0 and all(state in TERMINAL for state in stats.counts)
    return {**run_view(run), "state": run_state(stats.counts), "counts": dict(sorted(stats.counts.items())),
            "total": total, "started_at": stats.first_dispatch, "ended_at": stats.last_update if done else None}


def summary(run: RunRow, tasks: Iterable[Any]) -> dict[str, Any]:
    """``summary_of`` the run's ``tasks`` (rows, or tasks from memory)."""
    return summary_of(run, stats_of(tasks))


def short_id(run_id: str) -> str:
    """The part of a run id a re-run's task ids carry (``run-0123456789ab`` -> ``0123456789ab``)."""
    return run_id.removeprefix("run-")


def derived_id(task_id: str, source: RunRow, new_run_id: str, max_len: int = 128) -> str:
    """The id a re-run gives a task of ``source``: ``<id>@<new run's short id>``, where ``<id>``
    drops the suffix ``source`` itself added when it was a re-run (so ids do not grow with each
    re-run), cut to fit ``max_len``."""
    base = task_id
    parent = source.labels.get("rerun_of")
    if parent is not None and base.endswith("@" + short_id(source.run_id)):
        base = base[: -len(short_id(source.run_id)) - 1]
    suffix = "@" + short_id(new_run_id)
    return base[: max_len - len(suffix)] + suffix


def to_rerun(tasks: Sequence[Any], failed_only: bool) -> list[Any]:
    """The tasks a re-run submits again: all, or with ``failed_only`` those that did not succeed
    (failed, timed out, errored, cancelled)."""
    return [t for t in tasks if not failed_only or t.state in RERUN_FAILED]
