"""The read side for lists and summaries: task pages and the overview, computed where the data is.

Every task is held in the coordinator's memory (the store restores them at start), so a page of
tasks is filtered and cut here, on the server, and only that page travels: ``list_tasks``
selects the newest ``offset + limit`` matches with a heap instead of sorting them all. Pure:
functions of the state and ``now``; no I/O.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from ..errors import ValidationError
from .state import CoordinatorState, Task

SERIES_BUCKET_S = 60.0
SERIES_SPAN_S = 3600.0
RECENT_FAILURES = 10
FAILED_STATES = frozenset({"failed", "timed_out", "error"})


class TaskFilter(msgspec.Struct, frozen=True):
    """``GET /api/v1/tasks`` query: each given field must match; times are UNIX seconds on
    ``submitted_at`` (``since`` inclusive, ``until`` exclusive)."""

    state: str | None = None
    type: str | None = None
    worker_id: str | None = None
    tag: str | None = None
    submitted_by: str | None = None
    since: float | None = None
    until: float | None = None
    limit: int = 100
    offset: int = 0


def parse_filter(query: dict[str, str]) -> TaskFilter:
    """The filter from query parameters; ValidationError naming the bad one."""
    unknown = set(query) - set(TaskFilter.__struct_fields__)
    if unknown:
        raise ValidationError([{"field": k, "error": "unknown query parameter"} for k in sorted(unknown)])
    try:
        f = msgspec.convert(query, TaskFilter, strict=False)
    except msgspec.ValidationError as exc:
        raise ValidationError([{"field": "(query)", "error": str(exc)}]) from exc
    errors = []
    if not 1 <= f.limit <= 10_000:
        errors.append({"field": "limit", "error": "must be between 1 and 10000"})
    if not 0 <= f.offset <= 10_000_000:
        errors.append({"field": "offset", "error": "must be between 0 and 10000000"})
    if errors:
        raise ValidationError(errors)
    return f


def _predicate(f: TaskFilter) -> Callable[[Task], bool]:
    checks: list[Callable[[Task], bool]] = []
    if f.state:
        checks.append(lambda t: t.state == f.state)
    if f.type:
        checks.append(lambda t: t.type == f.type)
    if f.worker_id:
        checks.append(lambda t: t.worker_id == f.worker_id)
    if f.submitted_by:
        checks.append(lambda t: t.submitted_by == f.submitted_by)
    if f.tag:
        checks.append(lambda t: f.tag in t.spec.requirements.tags)
    if f.since is not None:
        checks.append(lambda t: t.submitted_at >= f.since)  # type: ignore[operator]
    if f.until is not None:
        checks.append(lambda t: t.submitted_at < f.until)  # type: ignore[operator]
    return lambda t: all(c(t) for c in checks)


def list_tasks(state: CoordinatorState, f: TaskFilter) -> tuple[list[Task], int]:
    """One page of matching tasks, newest submission first, and how many match in all."""
    pred = _predicate(f)
    matching: Iterable[Task] = (t for t in state.tasks.values() if pred(t))
    total = 0

    def counted() -> Iterable[tuple[float, int, Task]]:
        nonlocal total
        for t in matching:
            total += 1
            yield t.submitted_at, t.seq, t

    top = heapq.nlargest(f.offset + f.limit, counted(), key=lambda x: (x[0], x[1]))
    return [t for _, _, t in top[f.offset:]], total


def overview(state: CoordinatorState, now: float) -> dict[str, Any]:
    """Workers and tasks by state, per-minute series over the last hour (tasks submitted and
    finished per second, queue depth at each minute's end), and the latest failures.

    Queue depth counts a task as waiting from its submission to its first dispatch (its second
    history entry), so a requeued task's later waits are not counted."""
    start = now - SERIES_SPAN_S
    n = int(SERIES_SPAN_S // SERIES_BUCKET_S)
    submitted, finished, depth_delta = [0] * n, [0] * n, [0] * (n + 1)
    failures: list[Task] = []
    for t in state.tasks.values():
        if t.submitted_at >= start:
            submitted[min(n - 1, int((t.submitted_at - start) // SERIES_BUCKET_S))] += 1
        if t.outcome is not None and t.updated_at >= start:
            finished[min(n - 1, int((t.updated_at - start) // SERIES_BUCKET_S))] += 1
        # waiting over [submitted_at, left): counted at each minute's end inside it
        left = t.history[1]["at"] if len(t.history) > 1 else (now + SERIES_BUCKET_S if t.state == "pending" else t.updated_at)
        if left > start:
            i0 = max(0, math.ceil((t.submitted_at - start) / SERIES_BUCKET_S - 1))
            i1 = min(n, max(0, math.ceil((left - start) / SERIES_BUCKET_S - 1)))
            if i0 < i1:
                depth_delta[i0] += 1
                depth_delta[i1] -= 1
        if t.state in FAILED_STATES:
            failures.append(t)
    depth, running = [], 0
    for i in range(n):
        running += depth_delta[i]
        depth.append(running)
    workers = Counter(w.health if w.connected else "disconnected" for w in state.workers.values())
    recent = heapq.nlargest(RECENT_FAILURES, failures, key=lambda t: t.updated_at)
    return {
        "now": now, "tasks_by_state": {k: v for k, v in state.counts.items() if v},
        "workers_by_state": dict(workers), "queue_depth": state.counts.get("pending", 0),
        "series": {"bucket_s": SERIES_BUCKET_S, "start": start,
                   "submitted_per_s": [c / SERIES_BUCKET_S for c in submitted],
                   "finished_per_s": [c / SERIES_BUCKET_S for c in finished], "queue_depth": depth},
        "recent_failures": [{"task_id": t.task_id, "type": t.type, "state": t.state, "updated_at": t.updated_at,
                             "worker_id": t.worker_id, "error": (t.outcome or {}).get("error")} for t in recent],
    }
