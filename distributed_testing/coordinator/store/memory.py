"""``MemoryStore``: the in-memory twin of the DuckDB store, and the statement in Python of what
a query's order, paging and the overview's history mean.

Filters: every store evaluates the same description (``filters.describe``); here it is evaluated
in Python (``filters.holds``), the SQL stores render it (``filters.render``). ``ResultQuery`` and
``TaskQuery`` state what each filter field means.

Order of results: newest first by ``received_at``, ties broken by ``task_id`` then ``attempt``,
both descending; then ``offset`` and ``limit`` (both must be >= 0).

Task pages (``task_order_key``, ``filter_tasks``) and the overview's history (``stats_of``) state
:class:`TaskQuery` and :class:`TaskStats` in Python the same way.

Write semantics, as in every store: tasks, workers, keys and meta are upserts (the last appended
state wins); a result is keyed by ``(task_id, attempt)`` and the first one received is kept.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from ...errors import StoreError, ValidationError
from ..core.rows import FORGOTTEN, KeyRow, MetaRow, Record, ResultRow, RunRow, Snapshot, TaskRow, WorkerRow
from ..core.runs import RunStats, stats_of_runs
from .base import TERMINAL, ResultQuery, TaskPage, TaskQuery, TaskStats
from .filters import describe, holds

FAILED_STATES = frozenset({"failed", "timed_out", "error"})

_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(Record)


def validate_query(q: ResultQuery | TaskQuery) -> None:
    """Raise ``ValidationError`` for a query no store can answer (negative limit or offset)."""
    errors = [
        {"field": name, "error": "must be >= 0"}
        for name, value in (("limit", q.limit), ("offset", q.offset))
        if value < 0
    ]
    if errors:
        raise ValidationError(errors)


def result_matches(r: ResultRow, q: ResultQuery) -> bool:
    """True when ``r`` satisfies every filter given in ``q`` (``ResultQuery``'s docstring)."""
    return holds(describe(q), r)


def result_order_key(r: ResultRow) -> tuple[float, str, int]:
    """Sort key; results are returned in descending order of it."""
    return (r.received_at, r.task_id, r.attempt)


def filter_results(rows: list[ResultRow], q: ResultQuery) -> list[ResultRow]:
    """Apply ``q`` (filters, order, offset, limit) to ``rows`` in Python."""
    validate_query(q)
    f = describe(q)
    hits = sorted((r for r in rows if holds(f, r)), key=result_order_key, reverse=True)
    return hits[q.offset : q.offset + q.limit]


def task_matches(t: TaskRow, q: TaskQuery) -> bool:
    """True when ``t`` satisfies every filter given in ``q`` (``TaskQuery``'s docstring)."""
    return holds(describe(q), t)


def task_order_key(t: TaskRow) -> tuple[float, int]:
    """Sort key; task pages are returned in descending order of it."""
    return (t.submitted_at, t.seq)


def filter_tasks(rows: Iterable[TaskRow], q: TaskQuery) -> TaskPage:
    """Apply ``q`` (filters, order, offset, limit) to ``rows`` in Python; ``total`` counts every match."""
    validate_query(q)
    f = describe(q)
    hits = [t for t in rows if holds(f, t)]  # all of them: nlargest(0, ...) would read none
    top = heapq.nlargest(q.offset + q.limit, hits, key=task_order_key)
    return TaskPage(tasks=top[q.offset :], total=len(hits))


def run_order_key(r: RunRow) -> tuple[float, str]:
    """Sort key; runs are listed in descending order of it (``Store.query_runs``)."""
    return (r.created_at, r.run_id)


def page_of_runs(rows: Iterable[RunRow], limit: int, offset: int, submitted_by: str | None) -> list[RunRow]:
    """``Store.query_runs`` in Python."""
    if limit < 0 or offset < 0:
        raise ValidationError([{"field": "limit" if limit < 0 else "offset", "error": "must be >= 0"}])
    hits = [r for r in rows if submitted_by is None or r.submitted_by == submitted_by]
    return heapq.nlargest(offset + limit, hits, key=run_order_key)[offset:]


def bucket_of(at: float, since: float, bucket_s: float, buckets: int) -> int | None:
    """The index of the bucket of ``[since, since + buckets * bucket_s)`` holding ``at``, or None.

    The index is ``floor((at - since) / bucket_s)`` in float arithmetic, which SQL computes
    identically; Python's ``//`` differs at some edges (``1.0 // 0.1`` is 9, ``1.0 / 0.1`` is 10)."""
    if not at >= since:
        return None
    i = math.floor((at - since) / bucket_s)
    return i if i < buckets else None


def stats_of(rows: Iterable[TaskRow], since: float, bucket_s: float, buckets: int, failures: int) -> TaskStats:
    """``TaskStats`` (its docstring is the contract) of ``rows`` in Python."""
    if not bucket_s > 0 or buckets < 0 or failures < 0:
        raise ValidationError([{"field": "(stats)", "error": "bucket_s must be > 0, buckets and failures >= 0"}])
    submitted, finished = [0] * buckets, [0] * buckets
    failed: list[TaskRow] = []
    for t in rows:
        i = bucket_of(t.submitted_at, since, bucket_s, buckets)
        if i is not None:
            submitted[i] += 1
        if t.state in TERMINAL:
            j = bucket_of(t.updated_at, since, bucket_s, buckets)
            if j is not None:
                finished[j] += 1
            if t.state in FAILED_STATES:
                failed.append(t)
    recent = heapq.nlargest(failures, failed, key=lambda t: (t.updated_at, t.seq))
    return TaskStats(submitted=submitted, finished=finished, recent_failures=recent)


def _done_soon(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class MemoryStore:
    """Store twin for tests and ``memory://``: same semantics as ``DuckDBStore``, nothing on disk.

    State survives ``close()``/``open()`` on the same instance (a coordinator restart in tests).
    Records are copied through MessagePack on append, as the journal does, so a caller mutating a
    record's dicts afterwards changes nothing and an unencodable record fails the same way.
    ``append`` futures complete on the next event-loop iteration.
    """

    def __init__(self) -> None:
        self._tasks: dict[str, TaskRow] = {}
        self._workers: dict[str, WorkerRow] = {}
        self._keys: dict[str, KeyRow] = {}
        self._meta: dict[str, str] = {}
        self._results: dict[tuple[str, int], ResultRow] = {}
        self._runs: dict[str, RunRow] = {}
        self._open = False

    async def open(self) -> Snapshot:
        if self._open:
            raise StoreError("memory store is already open")
        self._open = True
        active = (t for t in self._tasks.values() if t.state not in TERMINAL)
        return Snapshot(
            tasks=sorted(active, key=lambda t: (t.seq, t.submitted_at, t.task_id)),
            workers=sorted(self._workers.values(), key=lambda w: w.worker_id),
            keys=sorted(self._keys.values(), key=lambda k: k.key_id),
            meta=dict(self._meta),
            task_counts=dict(Counter(t.state for t in self._tasks.values())),
            max_seq=max((t.seq for t in self._tasks.values()), default=0),
        )

    def append(self, records: list[Record], linger_s: float = 0.0) -> asyncio.Future[None]:
        if not self._open:
            raise StoreError("memory store is not open")
        copies = [self._copy(r) for r in records]
        for rec in copies:
            self._apply(rec)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        loop.call_soon(_done_soon, fut)
        return fut

    @staticmethod
    def _copy(rec: Record) -> Record:
        try:
            copy: Record = _decoder.decode(_encoder.encode(rec))
        except (TypeError, ValueError, OverflowError, msgspec.MsgspecError) as exc:
            raise StoreError(f"invalid store record {type(rec).__name__}: {exc}") from exc
        return copy

    def _apply(self, rec: Record) -> None:
        if isinstance(rec, TaskRow):
            self._tasks[rec.task_id] = rec
        elif isinstance(rec, ResultRow):
            self._results.setdefault((rec.task_id, rec.attempt), rec)
        elif isinstance(rec, WorkerRow):
            if rec.state == FORGOTTEN:  # deletes the row (base.FORGOTTEN)
                self._workers.pop(rec.worker_id, None)
            else:
                self._workers[rec.worker_id] = rec
        elif isinstance(rec, KeyRow):
            self._keys[rec.key_id] = rec
        elif isinstance(rec, RunRow):
            self._runs[rec.run_id] = rec
        elif isinstance(rec, MetaRow):
            if rec.value:
                self._meta[rec.key] = rec.value
            else:  # an empty value deletes the key (base.MetaRow)
                self._meta.pop(rec.key, None)
        else:
            raise StoreError(f"unknown store record {type(rec).__name__}")

    async def query_results(self, query: ResultQuery) -> list[ResultRow]:
        if not self._open:
            raise StoreError("memory store is not open")
        return filter_results(list(self._results.values()), query)

    async def get_tasks(self, task_ids: Sequence[str]) -> dict[str, TaskRow]:
        self._check_open()
        return {i: self._tasks[i] for i in task_ids if i in self._tasks}

    async def query_tasks(self, query: TaskQuery) -> TaskPage:
        self._check_open()
        return filter_tasks(self._tasks.values(), query)

    async def task_stats(self, since: float, bucket_s: float, buckets: int, failures: int) -> TaskStats:
        self._check_open()
        return stats_of(self._tasks.values(), since, bucket_s, buckets, failures)

    async def run_stats(self, run_ids: Sequence[str]) -> dict[str, RunStats]:
        self._check_open()
        return stats_of_runs(self._tasks.values(), run_ids)

    async def get_runs(self, run_ids: Sequence[str]) -> dict[str, RunRow]:
        self._check_open()
        return {i: self._runs[i] for i in run_ids if i in self._runs}

    async def query_runs(self, limit: int, offset: int = 0, submitted_by: str | None = None) -> list[RunRow]:
        self._check_open()
        return page_of_runs(self._runs.values(), limit, offset, submitted_by)

    def _check_open(self) -> None:
        if not self._open:
            raise StoreError("memory store is not open")

    async def watch(self) -> None:
        """Nothing runs in the background here: wait until cancelled."""
        await asyncio.get_running_loop().create_future()

    async def close(self) -> None:
        self._open = False
