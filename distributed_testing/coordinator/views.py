"""The read side: the task, worker and overview views that the REST API serves and the dashboard
reads (through the API), one implementation for both.

Memory holds the active work and a bounded cache of finished tasks (``state``'s docstring); the
history is in the store. So:

- a page of tasks (``GET /api/v1/tasks``) is filtered, ordered, counted and cut by the store
  (``Store.query_tasks``); only that page travels, and each task on it is shown from memory when
  it is there (fresher: its live ``pending_reason``), else from its stored row;
- one task (``GET /api/v1/tasks/{id}``) is read from memory, else from the store into the cache
  (``find_task``, ``load_missing``);
- workers are all in memory (each one is live state); their page is cut here, by worker id;
- the overview's last hour is kept in memory by ``Activity`` (bounded: one counter pair and one
  queue-depth sample per minute, the latest failures), seeded from ``Store.task_stats`` at start.

Nothing here scans every task ever submitted, so a read costs the same at 200,000 tasks of history
as at 200.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import ValidationError
from ..tasks.states import WORKER_STATES
from .core.entities import Task
from .core.state import CoordinatorState
from .store.base import Store, TaskQuery, TaskStats
from .store.filters import parse_query

SERIES_BUCKET_S = 60.0
SERIES_SPAN_S = 3600.0
RECENT_FAILURES = 10
FAILED_STATES = frozenset({"failed", "timed_out", "error"})
MAX_PAGE = 10_000
MAX_OFFSET = 10_000_000
LIST_HIDDEN = ("spec", "history")  # left out of list entries; GET /api/v1/tasks/{id} has them


# ------------------------------------------------------------------- tasks


def parse_filter(query: Mapping[str, str]) -> TaskQuery:
    """``GET /api/v1/tasks``'s query parameters as a ``TaskQuery`` (its docstring has the
    semantics); ValidationError naming the bad parameter. An empty parameter (a form's blank
    field) filters nothing."""
    q = parse_query(query, TaskQuery, blank_is_absent=True)
    errors = _page_errors(q.limit, q.offset)
    if errors:
        raise ValidationError(errors)
    return q


def _page_errors(limit: int, offset: int) -> list[dict[str, str]]:
    errors = []
    if not 1 <= limit <= MAX_PAGE:
        errors.append({"field": "limit", "error": f"must be between 1 and {MAX_PAGE}"})
    if not 0 <= offset <= MAX_OFFSET:
        errors.append({"field": "offset", "error": f"must be between 0 and {MAX_OFFSET}"})
    return errors


def task_view(state: CoordinatorState, t: Task) -> dict[str, Any]:
    """One task as ``GET /api/v1/tasks/{id}`` shows it (``pending_reason`` and
    ``unschedulable`` from the live worker set)."""
    return {"task_id": t.task_id, "type": t.type, "state": t.state, "attempt": t.attempt, "worker_id": t.worker_id,
            "priority": t.spec.priority, "submitted_at": t.submitted_at, "updated_at": t.updated_at,
            "pending_reason": state.why_pending(t), "unschedulable": state.unschedulable(t), "outcome": t.outcome,
            "retries_used": t.retries_used, "submitted_by": t.submitted_by, "run_id": t.spec.run_id,
            "spec": t.spec_dict,
            "history": t.history, "gang": state.gang_view(t), "progress": t.progress_view()}


async def task_page(state: CoordinatorState, store: Store, q: TaskQuery) -> tuple[list[dict[str, Any]], int]:
    """One page of tasks (list entries: ``task_view`` without spec and history), newest
    submission first, and how many match in all; filtered and cut by the store."""
    page = await store.query_tasks(q)
    out = []
    for row in page.tasks:
        t = state.tasks.get(row.task_id) or Task.from_row(row)
        out.append({k: v for k, v in task_view(state, t).items() if k not in LIST_HIDDEN})
    return out, page.total


async def load_missing(state: CoordinatorState, store: Store, task_ids: Iterable[str]) -> None:
    """Read the tasks among ``task_ids`` that are not in memory from the store into the finished
    cache (``state.load``), so the event that follows, run with no await in between, sees every
    one of them that exists. Awaits nothing when all are in memory."""
    ids = list(task_ids)
    checked: set[str] = set()
    found = {}
    while need := [tid for tid in state.missing(ids) if tid not in checked]:
        found.update(await store.get_tasks(need))  # a task retired and evicted meanwhile is read next round
        checked.update(need)
    if found:
        state.load(found.values())


async def find_task(state: CoordinatorState, store: Store, task_id: str) -> Task:
    """The task from memory, else from the store (it then joins the finished cache); NotFound."""
    await load_missing(state, store, [task_id])
    return state.get(task_id)


# ----------------------------------------------------------------- workers


def parse_page(query: Mapping[str, str], default_limit: int = MAX_PAGE) -> tuple[int, int]:
    """``limit`` and ``offset`` (with ``state``, the parameters of ``GET /api/v1/workers``);
    ValidationError naming a bad or unknown one."""
    unknown = set(query) - {"limit", "offset", "state"}
    errors = [{"field": k, "error": "unknown query parameter"} for k in sorted(unknown)]
    if query.get("state", WORKER_STATES[0]) not in WORKER_STATES:
        errors.append({"field": "state", "error": f"must be one of {', '.join(WORKER_STATES)}, got {query['state']!r}"})
    values = {"limit": default_limit, "offset": 0}
    for name in ("limit", "offset"):
        raw = query.get(name)
        if raw is None:
            continue
        try:
            values[name] = int(raw)
        except ValueError:
            errors.append({"field": name, "error": f"not an integer: {raw!r}"})
    if not errors:
        errors = _page_errors(values["limit"], values["offset"])
    if errors:
        raise ValidationError(errors)
    return values["limit"], values["offset"]


def worker_page(state: CoordinatorState, limit: int, offset: int,
                only: str | None = None) -> tuple[list[dict[str, Any]], int]:
    """One page of workers in worker id order (``only``: those in that state), and how many
    there are."""
    ids = state.worker_ids()
    if only is not None:
        ids = [wid for wid in ids if state.workers[wid].state == only]
    out = []
    for wid in ids[offset:offset + limit]:
        w = state.workers[wid]
        out.append({"worker_id": w.worker_id, "name": w.name, "state": w.state,
                    "reason": w.health_reason, "capabilities": sorted(w.view.capabilities),
                    "tags": sorted(w.view.tags), "max_concurrent": w.view.max_concurrent,
                    "accept_bundles": w.view.accept_bundles,
                    "running": sorted(w.view.running), "load": w.load, "last_seen": w.last_seen,
                    "hardware": w.hardware, "pipeline": {"depth": w.pace.limit, "window": w.view.window}})
    return out, len(ids)


# ---------------------------------------------------------------- overview


def failure_entry(t: Any) -> dict[str, Any]:
    """A failed task (a ``Task`` or a stored ``TaskRow``) as the overview lists it."""
    return {"task_id": t.task_id, "type": t.type, "state": t.state, "updated_at": t.updated_at,
            "worker_id": t.worker_id, "error": (t.outcome or {}).get("error")}


class Activity:
    """The overview's last hour, in memory and bounded: per bucket of ``bucket_s`` (buckets are
    aligned to multiples of it), the tasks submitted and finished and the last queue depth
    sampled, and the latest ``failures`` failed tasks. ``seed`` fills in the history from the
    store at start; ``submitted``, ``finished`` and ``sample_depth`` add what happens after."""

    def __init__(self, bucket_s: float = SERIES_BUCKET_S, span_s: float = SERIES_SPAN_S,
                 failures: int = RECENT_FAILURES) -> None:
        self.bucket_s = bucket_s
        self.n = max(1, int(span_s // bucket_s))
        self.failures_kept = failures
        self._counts: dict[int, list[int]] = {}  # bucket index -> [submitted, finished]
        self._depth: dict[int, int] = {}  # bucket index -> the last queue depth sampled in it
        self._failures: deque[dict[str, Any]] = deque(maxlen=failures)  # newest first

    def first_bucket(self, now: float) -> int:
        """The index of the oldest bucket of the window that ends with the one holding ``now``."""
        return math.floor(now / self.bucket_s) - self.n + 1

    def since(self, now: float) -> float:
        """Where the window of ``now`` starts (what to pass ``Store.task_stats``)."""
        return self.first_bucket(now) * self.bucket_s

    def seed(self, stats: TaskStats, since: float) -> None:
        """The store's history (``Store.task_stats(since, bucket_s, n, failures)``), taken before
        anything is added here."""
        first = math.floor(since / self.bucket_s)
        for i, (sub, fin) in enumerate(zip(stats.submitted, stats.finished, strict=True)):
            if sub or fin:
                c = self._counts.setdefault(first + i, [0, 0])
                c[0] += sub
                c[1] += fin
        for row in stats.recent_failures[:self.failures_kept]:
            self._failures.append(failure_entry(row))

    def _bucket(self, at: float) -> list[int]:
        i = math.floor(at / self.bucket_s)
        c = self._counts.get(i)
        if c is None:
            c = self._counts[i] = [0, 0]
            self._prune(i)
        return c

    def _prune(self, newest: int) -> None:
        for store in (self._counts, self._depth):
            for old in [k for k in store if k <= newest - self.n]:
                del store[old]

    def submitted(self, at: float, n: int = 1) -> None:
        if n:
            self._bucket(at)[0] += n

    def finished(self, t: Task) -> None:
        """``t`` reached its outcome (durably) at ``t.updated_at``."""
        self._bucket(t.updated_at)[1] += 1
        if t.state in FAILED_STATES:
            self._failures.appendleft(failure_entry(t))

    def sample_depth(self, now: float, depth: int) -> None:
        i = math.floor(now / self.bucket_s)
        if i not in self._depth:
            self._prune(i)
        self._depth[i] = depth

    def series(self, now: float, depth_now: int) -> dict[str, Any]:
        """The window ending with ``now``'s bucket: rates per second and the queue depth at each
        bucket's last sample (``depth_now`` for the current one; 0 where none was taken)."""
        first = self.first_bucket(now)
        idx = range(first, first + self.n)
        zero = [0, 0]
        depth = [self._depth.get(i, 0) for i in idx]
        depth[-1] = depth_now
        return {"bucket_s": self.bucket_s, "start": first * self.bucket_s,
                "submitted_per_s": [self._counts.get(i, zero)[0] / self.bucket_s for i in idx],
                "finished_per_s": [self._counts.get(i, zero)[1] / self.bucket_s for i in idx],
                "queue_depth": depth}

    def recent_failures(self) -> list[dict[str, Any]]:
        return list(self._failures)


def overview(state: CoordinatorState, activity: Activity, now: float) -> dict[str, Any]:
    """Workers and tasks by state (every task, finished ones included), the last hour's
    per-minute series (tasks submitted and finished per second, queue depth sampled at each
    minute's end) and the latest failures."""
    workers = Counter(w.state for w in state.workers.values())
    pending = state.counts.get("pending", 0)
    return {
        "now": now, "tasks_by_state": {k: v for k, v in state.counts.items() if v},
        "workers_by_state": dict(workers), "queue_depth": pending,
        "series": activity.series(now, pending), "recent_failures": activity.recent_failures(),
    }
