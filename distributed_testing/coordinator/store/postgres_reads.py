"""The PostgreSQL store's read side: results, tasks by id, a page of tasks, task statistics, runs.

Each function builds its statements (``pgsql``) and runs them through ``read``, the store's read
on a pooled connection (``PostgresStore._read``: retried once a restart broke the connection,
any other failure a ``StoreError``); a page and the statistics read in one read-only
repeatable-read transaction, so their counts and rows agree.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg

from ...errors import ValidationError
from ..core.rows import ResultRow, RunRow, TaskRow
from ..core.runs import RunStats, add_stats
from .base import ResultQuery, TaskPage, TaskQuery, TaskStats
from .filters import Params
from .memory import page_of_runs, validate_query
from .pgsql import FAILED_SQL, RESULT_ORDER, RUN_ORDER, TABLES, TASK_ORDER, TERMINAL_SQL, where_sql

Read = Callable[[str, Callable[[asyncpg.Connection], Any]], Awaitable[Any]]
DECODE = {t: table.decoder() for t, table in TABLES.items()}


async def query_results(read: Read, query: ResultQuery) -> list[ResultRow]:
    """Results matching every filter of ``query`` (``filters``), newest first."""
    validate_query(query)
    p = Params()
    where = where_sql(query, p)
    t = TABLES[ResultRow]
    sql = (f"SELECT {t.column_list} FROM results WHERE {where} ORDER BY {RESULT_ORDER} "
           f"LIMIT {p.add(query.limit)} OFFSET {p.add(query.offset)}")
    fetched = await read("result query", lambda con: con.fetch(sql, *p.values))
    return [DECODE[ResultRow](r) for r in fetched]

async def get_tasks(read: Read, task_ids: Sequence[str]) -> dict[str, TaskRow]:
    t = TABLES[TaskRow]
    sql = f"SELECT {t.column_list} FROM tasks WHERE task_id = ANY($1::text[])"
    fetched = await read("task lookup", lambda con: con.fetch(sql, list(task_ids)))
    rows = [DECODE[TaskRow](r) for r in fetched]
    return {r.task_id: r for r in rows}

async def query_tasks(read: Read, query: TaskQuery) -> TaskPage:
    validate_query(query)
    p = Params()
    where = where_sql(query, p)
    t = TABLES[TaskRow]
    count_sql = f"SELECT count(*) FROM tasks WHERE {where}"
    page_sql = (f"SELECT {t.column_list} FROM tasks WHERE {where} ORDER BY {TASK_ORDER} "
                f"LIMIT {p.add(query.limit)} OFFSET {p.add(query.offset)}")
    n_filter = len(p.values) - 2

    async def run(con: asyncpg.Connection) -> tuple[int, list[Any]]:
        async with con.transaction(isolation="repeatable_read", readonly=True):
            total = await con.fetchval(count_sql, *p.values[:n_filter])
            return int(total), await con.fetch(page_sql, *p.values)

    total, fetched = await read("task query", run)
    return TaskPage(tasks=[DECODE[TaskRow](r) for r in fetched], total=total)

async def task_stats(read: Read, since: float, bucket_s: float, buckets: int, failures: int) -> TaskStats:
    if not bucket_s > 0 or buckets < 0 or failures < 0:
        raise ValidationError([{"field": "(stats)", "error": "bucket_s must be > 0, buckets and failures >= 0"}])
    # A loose upper bound for the index; the bucket index itself decides (memory.bucket_of).
    end = since + bucket_s * (buckets + 1)
    t = TABLES[TaskRow]
    bucket = "floor(({col} - $1) / $2)::bigint"
    submitted_sql = (f"SELECT {bucket.format(col='submitted_at')} AS b, count(*) FROM tasks "
                     "WHERE submitted_at >= $1 AND submitted_at < $3 GROUP BY b")
    finished_sql = (f"SELECT {bucket.format(col='updated_at')} AS b, count(*) FROM tasks "
                    f"WHERE updated_at >= $1 AND updated_at < $3 AND {TERMINAL_SQL} GROUP BY b")
    failed_sql = (f"SELECT {t.column_list} FROM tasks WHERE {FAILED_SQL} "
                  "ORDER BY updated_at DESC, seq DESC, task_id DESC LIMIT $1")

    async def run(con: asyncpg.Connection) -> tuple[list[Any], list[Any], list[Any]]:
        async with con.transaction(isolation="repeatable_read", readonly=True):
            sub = await con.fetch(submitted_sql, since, bucket_s, end)
            fin = await con.fetch(finished_sql, since, bucket_s, end)
            return sub, fin, await con.fetch(failed_sql, failures)

    sub, fin, failed = await read("task statistics", run)

    def spread(counts: list[Any]) -> list[int]:
        out = [0] * buckets
        for b, n in counts:
            if 0 <= b < buckets:
                out[b] += int(n)
        return out

    return TaskStats(submitted=spread(sub), finished=spread(fin),
                     recent_failures=[DECODE[TaskRow](r) for r in failed])


async def get_runs(read: Read, run_ids: Sequence[str]) -> dict[str, RunRow]:
    t = TABLES[RunRow]
    sql = f"SELECT {t.column_list} FROM runs WHERE run_id = ANY($1::text[])"
    fetched = await read("run lookup", lambda con: con.fetch(sql, list(run_ids)))
    return {r.run_id: r for r in (DECODE[RunRow](v) for v in fetched)}


async def query_runs(read: Read, limit: int, offset: int, submitted_by: str | None) -> list[RunRow]:
    page_of_runs([], limit, offset, None)  # the same refusal of a negative page as every store
    t = TABLES[RunRow]
    where = "submitted_by = $3" if submitted_by is not None else "TRUE"
    sql = f"SELECT {t.column_list} FROM runs WHERE {where} ORDER BY {RUN_ORDER} LIMIT $1 OFFSET $2"
    args = [limit, offset] + ([submitted_by] if submitted_by is not None else [])
    fetched = await read("run query", lambda con: con.fetch(sql, *args))
    return [DECODE[RunRow](v) for v in fetched]


# A task's first dispatch (core/runs.py, ``first_dispatch``), as duckdbsql.FIRST_DISPATCH_SQL
FIRST_DISPATCH_SQL = "CASE WHEN history->1->>'to' = 'assigned' THEN (history->1->>'at')::float8 END"


async def run_stats(read: Read, run_ids: Sequence[str]) -> dict[str, RunStats]:
    out = {r: RunStats(counts={}) for r in run_ids}
    sql = (f"SELECT run_id, state, count(*), min({FIRST_DISPATCH_SQL}), max(updated_at) FROM tasks "
           "WHERE run_id = ANY($1::text[]) GROUP BY run_id, state")
    for run_id, state, n, dispatched, updated in await read("run statistics", lambda con: con.fetch(sql, list(out))):
        add_stats(out[run_id], {state: int(n)}, dispatched, updated)
    return out
