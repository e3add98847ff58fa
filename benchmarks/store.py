"""Coordinator store write path: appends/s and append->durable latency.

Scenarios (each on a fresh DuckDB file in a fresh directory under ``--dir``):

- ``seq``: one appender, each ``append([TaskRow])`` awaited before the next.
- ``c50``: 50 concurrent appenders doing the same (group commit shares fsyncs between them).
- ``c50 + 1 querier``: the same, plus one client looping ``query_results(task_id=...)``: its
  latency and what it costs the appenders.
- ``raw``: DuckDB alone, one ``INSERT OR REPLACE`` + commit per row (no journal), for comparison.

With ``--postgres`` (``postgresql``: a temporary database on the local server, dropped after; or a
``postgresql://`` URL) the three store scenarios also run on ``PostgresStore``, whose "fsyncs" are
its commits (one statement per batch).

The DuckDB store runs with its background checkpointer on, as in production, so the figures
include the checkpointer competing for the GIL and the disk.

Run::

    .venv/bin/python benchmarks/store.py [--seconds 3] [--dir /path/on/the/disk/to/test]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb

from distributed_testing.coordinator.core.rows import TaskRow
from distributed_testing.coordinator.store.base import ResultQuery
from distributed_testing.coordinator.store.duckdb import DuckDBStore
from distributed_testing.coordinator.store.duckdbsql import TABLES
from distributed_testing.coordinator.store.postgres import PostgresStore

Store = DuckDBStore | PostgresStore


@dataclass
class Figures:
    name: str
    ops: int
    seconds: float
    latencies: list[float]
    fsyncs: int | None = None

    def row(self) -> str:
        lat = sorted(self.latencies)
        p50 = statistics.median(lat) * 1e3
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3
        per_fsync = f"{self.ops / self.fsyncs:.1f}" if self.fsyncs else "-"
        return (
            f"{self.name:<34} {self.ops:>8} {self.ops / self.seconds:>10.0f} {p50:>9.3f} {p99:>9.3f} "
            f"{lat[-1] * 1e3:>9.3f} {per_fsync:>10}"
        )


HEADER = (
    f"{'scenario':<34} {'appends':>8} {'appends/s':>10} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9} {'rec/fsync':>10}"
)


def make_task(i: int, state: str = "queued") -> TaskRow:
    spec = {
        "type": "benchmark",
        "config": {"model": "bert-base-uncased", "batch_sizes": [1, 2, 4, 8], "precision": "fp16", "iterations": 10},
        "requirements": {"hardware": ["cuda"], "tags": []},
        "priority": 0,
        "max_retries": 2,
    }
    now = time.time()
    return TaskRow(
        f"task-{i:09d}",
        "benchmark",
        state,
        1,
        0,
        now,
        now,
        "sha256:" + "ab" * 32,
        spec,
        history=[{"at": now, "state": state, "cause": "submitted"}],
    )


async def appender(store: Store, ids: range, deadline: float, out: list[float]) -> None:
    for i in ids:
        if time.perf_counter() >= deadline:
            return
        t0 = time.perf_counter()
        await store.append([make_task(i)])
        out.append(time.perf_counter() - t0)


async def querier(store: Store, deadline: float, out: list[float]) -> None:
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        await store.query_results(ResultQuery(task_id="task-000000001", limit=10))
        out.append(time.perf_counter() - t0)


async def run_store(
    directory: Path | str, name: str, concurrency: int, args: argparse.Namespace, query: bool = False
) -> list[Figures]:
    """``directory``: where the DuckDB file goes, or a ``postgresql://`` URL (a PostgresStore)."""
    store: Store
    if isinstance(directory, str):
        store = PostgresStore(directory)
    else:
        store = DuckDBStore(
            directory / "bench.duckdb",
            checkpoint_interval_s=args.checkpoint_interval_s,
            checkpoint_max_records=args.checkpoint_max_records,
        )
    await store.open()
    latencies: list[float] = []
    start = time.perf_counter()
    deadline = start + args.seconds
    per = 10_000_000
    queries: list[float] = []
    await asyncio.gather(
        *(appender(store, range(c * per, (c + 1) * per), deadline, latencies) for c in range(concurrency)),
        *([querier(store, deadline, queries)] if query else []),
    )
    elapsed = time.perf_counter() - start
    fsyncs = store.journal.flush_count if isinstance(store, DuckDBStore) else store.batch_count
    t0 = time.perf_counter()
    await store.close()
    print(f"  {name}: final checkpoint + close took {(time.perf_counter() - t0) * 1e3:.0f} ms")
    figs = [Figures(name, len(latencies), elapsed, latencies, fsyncs)]
    if query:
        figs.append(Figures("  query_results(task_id) meanwhile", len(queries), elapsed, queries))
    return figs


def run_raw(directory: Path, seconds: float) -> Figures:
    table = TABLES[TaskRow]
    con = duckdb.connect(str(directory / "raw.duckdb"))
    con.execute(table.ddl())
    sql = f"INSERT OR REPLACE INTO {table.name} ({table.column_list}) VALUES ({', '.join('?' * len(table.columns))})"
    latencies: list[float] = []
    start = time.perf_counter()
    i = 0
    while time.perf_counter() - start < seconds:
        row = table.to_arrow([make_task(i)]).to_pylist()[0]
        t0 = time.perf_counter()
        con.execute(sql, list(row.values()))  # autocommit: one transaction, one WAL fsync per row
        latencies.append(time.perf_counter() - t0)
        i += 1
    elapsed = time.perf_counter() - start
    con.close()
    return Figures("raw DuckDB insert+commit per row", len(latencies), elapsed, latencies, len(latencies))


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each scenario")
    parser.add_argument("--checkpoint-interval-s", type=float, default=0.2, help="DuckDBStore checkpoint interval")
    parser.add_argument("--checkpoint-max-records", type=int, default=5000, help="DuckDBStore checkpoint trigger")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where the files go")
    parser.add_argument("--postgres", metavar="URL",
                        help="also run the store scenarios on PostgreSQL: 'postgresql' (a temporary database on the "
                             "local server) or a postgresql:// URL")
    args = parser.parse_args(argv)
    print("command:", shlex.join([Path(sys.executable).name, "benchmarks/store.py", *argv]))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"files under {args.dir}; DuckDB {duckdb.__version__}, Python {sys.version.split()[0]}")
    print(f"{os.cpu_count()} CPUs, load average {load} at start\n")
    results = []
    scenarios = [
        ("DuckDBStore seq (1 appender)", 1, False),
        ("DuckDBStore c50 (50 appenders)", 50, False),
        ("DuckDBStore c50 + 1 querier", 50, True),
    ]
    for name, concurrency, query in scenarios:
        with tempfile.TemporaryDirectory(dir=args.dir) as d:
            results += await run_store(Path(d), name, concurrency, args, query)
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        results.append(await asyncio.to_thread(run_raw, Path(d), args.seconds))
    if args.postgres:
        results += await run_postgres(args, scenarios)
    print(HEADER)
    for fig in results:
        print(fig.row())


async def run_postgres(args: argparse.Namespace, scenarios: list[tuple[str, int, bool]]) -> list[Figures]:
    from distributed_testing.testing import create_pg_database, drop_pg_database, pg_schema_url

    temporary = args.postgres == "postgresql"
    url = await create_pg_database(prefix="dt_bench") if temporary else args.postgres
    results = []
    try:
        for i, (name, concurrency, query) in enumerate(scenarios):
            fresh = await pg_schema_url(url, f"bench_{i}") if temporary else url
            results += await run_store(fresh, name.replace("DuckDBStore", "PostgresStore"), concurrency, args, query)
    finally:
        if temporary:
            await drop_pg_database(url)
    return results


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
