"""``GET /api/v1/tasks/{task_id}/logs``: a task's output, while it runs and after; and
``GET /api/v1/tasks/{task_id}/reports``: the tests of its running attempt that ended there.

A running attempt's output is what its worker streamed (``tasklogs.TaskLogs``, in memory); a
finished task's is what its result carries (``output["log"]``: ``tasks/log.py``; a result from an
older worker: its ``stdout_tail`` or ``stderr_tail``). Offsets are byte positions in everything
the attempt wrote; what is no longer kept (the middle of a long output) reads as one
``[... N bytes left out ...]`` line. With ``follow=1`` the answer waits (up to ``wait`` seconds)
until there is something past ``offset`` or the task ends, so a client follows a task by asking
again from ``next_offset`` until ``complete`` is true (``dt logs -f``, the dashboard's task page).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from ..errors import ValidationError
from ..tasks.log import LOG_KEY, TaskLog
from .core.entities import Task
from .rest import json_response
from .runtime import RUNTIME, Runtime
from .store.base import ResultQuery
from .tasklogs import TaskLogs, TestReports
from .views import find_task

# Without ``wait`` a follow waits less than a client's first-byte bound (client.FIRST_BYTE_S), so a
# client or an HA standby forwarding it, which add only the ``wait`` they see, does not give up first.
DEFAULT_FOLLOW_WAIT_S = 4.0
MAX_FOLLOW_WAIT_S = 60.0
MAX_OFFSET = 2**63 - 1
_PARAMS = {"offset", "follow", "wait", "attempt"}


def _int(query: Any, name: str, default: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    try:
        v = int(raw)
    except ValueError:
        raise ValidationError([{"field": name, "error": f"not an integer: {raw!r}"}]) from None
    if not 0 <= v <= MAX_OFFSET:
        raise ValidationError([{"field": name, "error": f"must be between 0 and {MAX_OFFSET}"}])
    return v


def _params(query: Any) -> tuple[int, bool, float, int | None]:
    errors = [{"field": k, "error": "unknown query parameter"} for k in sorted(set(query) - _PARAMS)]
    if query.get("follow", "0") not in ("0", "1"):
        errors.append({"field": "follow", "error": "must be 0 or 1"})
    wait = DEFAULT_FOLLOW_WAIT_S
    if "wait" in query:
        try:
            wait = float(query["wait"])
        except ValueError:
            wait = -1.0
        if not 0 <= wait <= MAX_FOLLOW_WAIT_S:
            errors.append({"field": "wait", "error": f"must be a number of seconds from 0 to {MAX_FOLLOW_WAIT_S:g}"})
    if errors:
        raise ValidationError(errors)
    attempt = _int(query, "attempt", 0) if "attempt" in query else None
    return _int(query, "offset", 0), query.get("follow") == "1", wait, attempt


async def _final_log(rt: Runtime, t: Task) -> TaskLog | None:
    """The output the result of ``t``'s outcome carries (None: no result, or none kept)."""
    assert t.outcome is not None
    rows = await rt.store.query_results(ResultQuery(task_id=t.task_id, limit=1000))
    mine = [r for r in rows if r.attempt == t.outcome.get("attempt")]
    if not mine:
        return None
    out = mine[0].output or {}
    if (log := TaskLog.from_json(out.get(LOG_KEY))) is not None:
        return log
    old = next((v for k in ("stdout_tail", "stderr_tail") if isinstance(v := out.get(k), str) and v), None)
    return None if old is None else TaskLog.of_text(old)


async def _snapshot(rt: Runtime, task_id: str) -> tuple[Task, int, TaskLog | None, str]:
    """The task now, the attempt whose output is shown, that output, and where it comes from."""
    t = await find_task(rt.state, rt.store, task_id)
    (t,) = await rt.settled([t.task_id], MAX_FOLLOW_WAIT_S)  # an outcome is shown once it is on disk
    if t.outcome is not None:
        log = await _final_log(rt, t)
        return t, int(t.outcome.get("attempt", t.attempt)), log, "result" if log is not None else "none"
    held = rt.logs.get(t.task_id)
    if held is not None and held[0] == t.attempt:
        return t, t.attempt, held[1], "live"
    return t, t.attempt, None, "none"


async def get_logs(request: web.Request) -> web.Response:
    """A task's output (stdout, stderr, pytest's report) from byte offset, while it runs and after.

    With ``follow=1`` the answer waits up to ``wait`` seconds for output past ``offset`` or the
    task's end. ``attempt``: the attempt the client read before; when the task shows another one
    now, the answer starts at offset 0 (and says which attempt it shows)."""
    rt: Runtime = request.app[RUNTIME]
    offset, follow, wait, seen = _params(request.query)
    task_id = request.match_info["task_id"]
    t, attempt, log, source = await _snapshot(rt, task_id)
    if seen is not None and seen != attempt:
        offset = 0
    if follow and t.outcome is None and (log is None or offset >= log.total):
        await _wait_more(rt, t.task_id, wait, rt.logs)
        t, attempt, log, source = await _snapshot(rt, task_id)
        if seen is not None and seen != attempt:
            offset = 0
    done = t.outcome is not None
    started = _started_at(t)
    finished = t.history[-1].get("at") if done and t.history else None
    ended = finished if isinstance(finished, int | float) else rt.clock()
    data, next_offset = log.read(offset, final=done) if log is not None else (b"", offset)
    return json_response({
        "task_id": t.task_id, "attempt": attempt, "state": t.state, "source": source, "offset": offset,
        "next_offset": next_offset, "bytes": log.total if log is not None else 0,
        "text": data.decode(errors="replace"), "complete": done,
        "started_at": started, "finished_at": finished if done else None,
        "elapsed_s": None if started is None else round(max(0.0, ended - started), 3)})


async def _wait_more(rt: Runtime, task_id: str, wait: float, kept: TaskLogs | TestReports) -> None:
    """Until what ``kept`` holds of ``task_id`` grows, it ends (outcome on disk), or ``wait`` seconds pass."""
    more = asyncio.ensure_future(kept.changed(task_id, wait))
    ended = asyncio.ensure_future(rt.wait_finished([task_id], wait))
    try:
        await asyncio.wait({more, ended}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for f in (more, ended):
            f.cancel()
        await asyncio.gather(more, ended, return_exceptions=True)


def _started_at(t: Task) -> float | None:
    """When the current attempt began: it started running, else it was assigned (a short task is
    never announced as running)."""
    for h in reversed(t.history):
        if h.get("to") in ("running", "assigned") and h.get("attempt") == t.attempt:
            at = h.get("at")
            return float(at) if isinstance(at, int | float) else None
    return None


_REPORT_PARAMS = {"after", "wait", "attempt"}


async def get_reports(request: web.Request) -> web.Response:
    """The tests of a task's running attempt that ended there, from the ``after``-th (0-based):
    each test's entry as its result will carry it (``output["tests"]``), sent by its worker as the
    test ends (docs/protocol.md, "Test reports"). ``wait``: seconds to wait, when there is none
    past ``after`` yet, for one or the task's end. ``attempt``: the attempt read before; when the
    task is at another one now, the answer starts at its first test. Once ``complete`` (the task
    ended), nothing more comes here: the task's result carries every test."""
    rt: Runtime = request.app[RUNTIME]
    query = request.query
    errors = [{"field": k, "error": "unknown query parameter"} for k in sorted(set(query) - _REPORT_PARAMS)]
    for check in (lambda: _params({k: v for k, v in query.items() if k == "wait"}),
                  lambda: _int(query, "after", 0), lambda: _int(query, "attempt", 0)):
        try:
            check()
        except ValidationError as exc:
            errors += exc.errors
    if errors:
        raise ValidationError(errors)
    after = _int(query, "after", 0)
    wait = float(query.get("wait", 0))
    seen = _int(query, "attempt", 0) if "attempt" in query else None
    task_id = request.match_info["task_id"]
    for waited in (False, True):
        t = await find_task(rt.state, rt.store, task_id)
        (t,) = await rt.settled([t.task_id], MAX_FOLLOW_WAIT_S)  # complete once the outcome is on disk, as logs
        kept = rt.reports.get(t.task_id) if t.outcome is None else None
        if kept is not None and kept.attempt != t.attempt:
            kept = None
        start = 0 if seen is not None and seen != t.attempt else after
        if waited or wait <= 0 or t.outcome is not None or (kept is not None and len(kept.tests) > start):
            break
        await _wait_more(rt, t.task_id, wait, rt.reports)
    tests = kept.tests[start:] if kept is not None else []
    return json_response({
        "task_id": t.task_id, "attempt": t.attempt, "state": t.state, "worker_id": t.worker_id,
        "complete": t.outcome is not None,
        "tree": kept.tree if kept is not None else None, "after": start, "next": start + len(tests),
        "tests": tests})


ROUTES: list[tuple[str, str, Any, str | None]] = [
    ("GET", "/api/v1/tasks/{task_id}/logs", get_logs, "tasks:read"),
    ("GET", "/api/v1/tasks/{task_id}/reports", get_reports, "tasks:read"),
]
