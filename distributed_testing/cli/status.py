"""``dt status TASK``'s human format: what a person asks of one task (its state, worker,
duration, result, the start of its error and, for a test run, the tests that failed with where
each crashed), in a few lines instead of the whole document (``--json``: every pytest report of
every test, its spec and history, hundreds of lines for a handful of tests).

:func:`render` is pure: the task as ``GET /api/v1/tasks/{id}`` answers it (times in epoch
seconds) and the clock in, lines out.
"""

from __future__ import annotations

import time
from typing import Any

from .report import (
    crash_location,
    error_summary,
    failing_tests,
    first_line,
    iso_time,
    result_summary,
    task_duration,
)

MAX_ERROR_LINES = 8  # of the error text, before "... N more lines"
MAX_FAILED_TESTS = 10  # listed before "... and N more"
OPEN_STATES = ("pending", "assigned", "running")


def render(task: dict[str, Any], local: bool = False, now: float | None = None) -> list[str]:
    """The lines of ``task``'s human format; ``local``: times in the local zone."""
    now = time.time() if now is None else now
    outcome = task.get("outcome") or {}
    result = task.get("result") or {}
    output: dict[str, Any] = result["output"] if isinstance(result.get("output"), dict) else {}
    rows: list[tuple[str, str]] = [("task", f"{task['task_id']} ({task.get('type') or '?'})"),
                                   ("state", _state(task))]
    worker = outcome.get("worker_id") or task.get("worker_id")
    if worker:
        rows.append(("worker", str(worker)))
    submitted = iso_time(task.get("submitted_at"), local)
    if submitted:
        by = task.get("submitted_by")
        rows.append(("submitted", submitted + (f" by key {by}" if by else "")))
    rows += _timing(task, local, now)
    if task["state"] == "pending" and task.get("pending_reason"):
        prefix = "no connected worker can run it: " if task.get("unschedulable") else ""
        rows.append(("waiting", prefix + str(task["pending_reason"])))
    summary = result_summary(output, task.get("type"), result.get("status")) if result else None
    if summary:
        rows.append(("result", summary))
    error = outcome.get("error")
    if error:
        rows.append(("error", error_summary(error) or ""))  # the failing tests are listed below it
    lines = [f"{name:<10} {value}".rstrip() for name, value in rows]
    lines += _error_lines(error)
    lines += _failed_tests(output)
    lines.append("(dt status --json shows the whole task: spec, history, every test's report)")
    return lines


def _state(task: dict[str, Any]) -> str:
    attempt, retries = task.get("attempt"), task.get("retries_used")
    text = str(task["state"])
    if attempt:
        text += f", attempt {attempt}"
    if retries:
        text += f" ({retries} retr{'y' if retries == 1 else 'ies'} used)"
    return text


def _timing(task: dict[str, Any], local: bool, now: float) -> list[tuple[str, str]]:
    """``running for`` an open task since it entered its state; ``finished`` with the duration
    of a final one."""
    if task["state"] in OPEN_STATES:
        since = task.get("updated_at")
        if task["state"] != "pending" and isinstance(since, int | float):
            return [(task["state"], f"for {max(0.0, now - since):.0f} s (since {iso_time(since, local)})")]
        return []
    duration = task_duration(task)
    finished = (task.get("result") or {}).get("finished_at") or task.get("updated_at")
    text = iso_time(finished, local) if isinstance(finished, int | float) else None
    if duration is not None:
        text = f"{text}, after {duration:.3f} s" if text else f"after {duration:.3f} s"
    return [("finished", text)] if text else []


def _error_lines(error: Any) -> list[str]:
    """The error text after its first line, indented: up to ``MAX_ERROR_LINES`` lines (a
    traceback, pip's output), then how many were left out."""
    lines = [line.rstrip() for line in str(error or "").strip().splitlines()][1:]
    shown = [f"           {line}".rstrip() for line in lines[:MAX_ERROR_LINES]]
    if len(lines) > MAX_ERROR_LINES:
        shown.append(f"           ... {len(lines) - MAX_ERROR_LINES} more line(s)")
    return shown


def _failed_tests(output: dict[str, Any]) -> list[str]:
    """One line per failed or errored test: node id, outcome, the first line of its crash
    message and where it crashed."""
    failing = failing_tests(output)
    if not failing:
        return []
    lines = [f"failed tests ({len(failing)}):"]
    for entry in failing[:MAX_FAILED_TESTS]:
        where = crash_location(entry)
        message = first_line(entry.get("message"))
        lines.append(f"  {entry['nodeid']}" + (" (error)" if entry.get("outcome") == "error" else "")
                     + (f": {message}" if message else "") + (f" [{where}]" if where else ""))
    if len(failing) > MAX_FAILED_TESTS:
        lines.append(f"  ... and {len(failing) - MAX_FAILED_TESTS} more")
    return lines
