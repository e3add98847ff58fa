"""The SQL of the DuckDB store (``duckdb.DuckDBStore``): how each record type maps to a table and
to Arrow, the schema migrations, and the query filters' dialect. Builds statements and converts
rows; the migrations run on the connection they are handed.

Nested fields (spec, history, outcome, output, hardware, ...) are JSON columns.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import duckdb
import msgspec
import pyarrow as pa

from ..core.rows import KeyRow, MetaRow, ResultRow, RunRow, Snapshot, TaskRow, WorkerRow
from .base import SCHEMA_VERSION, TERMINAL, RecordTable, ResultQuery, TaskQuery
from .changes import TaskChange
from .filters import DUCKDB, Params, describe, render
from .memory import FAILED_STATES


def _bind_workers_to_keys(con: duckdb.DuckDBPyConnection) -> None:
    """1 -> 2: ``workers.key_id``, the key a worker id is bound to. Existing rows stay unbound
    (NULL): the next key to register each id takes it."""
    con.execute("ALTER TABLE workers ADD COLUMN key_id VARCHAR")


def _keys_allow_code(con: duckdb.DuckDBPyConnection) -> None:
    """2 -> 3: ``api_keys.allow_code`` (``dt keys create --allow-code``); existing keys may not."""
    con.execute("ALTER TABLE api_keys ADD COLUMN allow_code JSON DEFAULT 'false'")  # as the table's other non-scalars
    con.execute("UPDATE api_keys SET allow_code = 'false'")


def _blob_holds(con: duckdb.DuckDBPyConnection) -> None:
    """3 -> 4: which keys hold which bundle blobs; a DuckDB store keeps that in files beside its
    blobs (store/blobs.py, DirBlobs), so its tables do not change."""


def _runs(con: duckdb.DuckDBPyConnection) -> None:
    """4 -> 5: runs (``runs``, ``tasks.run_id``; existing tasks belong to none)."""
    con.execute("ALTER TABLE tasks ADD COLUMN IF NOT EXISTS run_id VARCHAR")
    con.execute(TABLES[RunRow].ddl().replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1))


# Upgrades from schema version N to N + 1, run in one transaction with the version bump.
MIGRATIONS: dict[int, Callable[[duckdb.DuckDBPyConnection], None]] = {1: _bind_workers_to_keys, 2: _keys_allow_code,
                                                                      3: _blob_holds, 4: _runs}


def create_schema(con: duckdb.DuckDBPyConnection) -> None:
    """A new file's tables, at the current schema version, none applied from the journal yet."""
    con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    con.execute("CREATE TABLE checkpoint_state (applied_segment BIGINT NOT NULL)")
    con.execute("INSERT INTO checkpoint_state VALUES (0)")
    for table in TABLES.values():
        con.execute(table.ddl())
    con.execute("INSERT INTO schema_version VALUES (?)", [SCHEMA_VERSION])


def migrate_step(step: Callable[[duckdb.DuckDBPyConnection], None], to_version: int,
                 con: duckdb.DuckDBPyConnection) -> None:
    """One of ``MIGRATIONS``, and the version it reaches."""
    step(con)
    con.execute("UPDATE schema_version SET version = ?", [to_version])

_json_encode = msgspec.json.Encoder().encode
_json_decode = msgspec.json.Decoder().decode


@dataclass(frozen=True)
class Column:
    name: str
    sql: str
    arrow: pa.DataType
    json: bool
    nullable: bool


@dataclass(frozen=True)
class Table(RecordTable[Column]):
    """A record type's DuckDB table (``RecordTable``), written from Arrow batches."""

    @classmethod
    def column(cls, name: str, base: Any, nullable: bool) -> Column:
        if base is str:
            return Column(name, "VARCHAR", pa.string(), False, nullable)
        if base is int:
            return Column(name, "BIGINT", pa.int64(), False, nullable)
        if base is float:
            return Column(name, "DOUBLE", pa.float64(), False, nullable)
        return Column(name, "JSON", pa.string(), True, nullable)

    def dedupe(self, rows: list[Any]) -> list[Any]:
        unique: dict[tuple[Any, ...], Any] = {}
        for row in rows:
            k = tuple(getattr(row, name) for name in self.key)
            if self.keep_first:
                unique.setdefault(k, row)
            else:
                unique[k] = row
        return list(unique.values())

    def to_arrow(self, rows: list[Any]) -> pa.Table:
        # a column at a time through C (attrgetter, the encoder); Arrow takes the encoded JSON as
        # bytes (it checks they are UTF-8) without a str made of each
        arrays = []
        for c in self.columns:
            values: list[Any] = list(map(attrgetter(c.name), rows))
            if c.json:
                values = [None if v is None else _json_encode(v) for v in values]
            arrays.append(pa.array(values, type=c.arrow))
        return pa.Table.from_arrays(arrays, names=[c.name for c in self.columns])

    def from_tuple(self, values: tuple[Any, ...]) -> Any:
        kwargs = {
            c.name: (_json_decode(v) if c.json and v is not None else v)
            for c, v in zip(self.columns, values, strict=True)
        }
        return self.row_type(**kwargs)


TABLES: dict[type[Any], Table] = {
    TaskRow: Table.of("tasks", TaskRow, ("task_id",)),
    ResultRow: Table.of("results", ResultRow, ("task_id", "attempt"), keep_first=True),
    WorkerRow: Table.of("workers", WorkerRow, ("worker_id",)),
    KeyRow: Table.of("api_keys", KeyRow, ("key_id",)),
    MetaRow: Table.of("meta", MetaRow, ("key",)),
    RunRow: Table.of("runs", RunRow, ("run_id",)),
}


def column_mismatch(con: duckdb.DuckDBPyConnection) -> str | None:
    """What differs between the file's tables and the record types at this schema version (a
    record type changed without a SCHEMA_VERSION bump and a migration), or None."""
    for table in TABLES.values():
        found = [r[0] for r in con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = ? "
                                           "ORDER BY ordinal_position", [table.name]).fetchall()]
        expected = [c.name for c in table.columns]
        if found != expected:
            return (f"table {table.name} has columns {found}, schema version {SCHEMA_VERSION} expects {expected}; "
                    "bump SCHEMA_VERSION and add a migration")
    return None


def get_runs(con: duckdb.DuckDBPyConnection, run_ids: list[str]) -> list[RunRow]:
    table = TABLES[RunRow]
    sql = f"SELECT {table.column_list} FROM runs WHERE run_id IN (SELECT unnest(?::VARCHAR[]))"
    return [table.from_tuple(v) for v in con.execute(sql, [run_ids]).fetchall()]


def query_runs(con: duckdb.DuckDBPyConnection, limit: int, offset: int, submitted_by: str | None) -> list[RunRow]:
    """The first ``offset + limit`` runs in ``Store.query_runs``'s order (the caller cuts the page
    after merging the runs not yet checkpointed)."""
    table = TABLES[RunRow]
    where = "submitted_by = ?" if submitted_by is not None else "TRUE"
    sql = f"SELECT {table.column_list} FROM runs WHERE {where} ORDER BY created_at DESC, run_id DESC LIMIT ?"
    params = [submitted_by, offset + limit] if submitted_by is not None else [offset + limit]
    return [table.from_tuple(v) for v in con.execute(sql, params).fetchall()]


# A TaskChange (``changes``) becomes an UPDATE of its task's row: the changed fields are set, and
# the new history entries (a JSON array, encoded alone) are spliced onto the stored array's text,
# so neither side decodes or re-encodes the history already stored.
#
# DuckDB runs ``UPDATE tasks ... FROM batch WHERE tasks.task_id = batch.task_id`` as a hash join
# over a scan of the whole table (its primary key index serves no join), so a checkpoint's
# updates cost as much as the table is long: 1,250 changes took 7 ms at 50,000 stored tasks, 36 ms
# at 800,000 and 84 ms at 2,000,000. Each UPDATE therefore also names the range of ``seq`` its
# changes' rows have: rows are inserted in about submission order, so DuckDB skips every row group
# whose ``seq`` range (its zone map) lies outside it, and the cost stays that of the rows near
# them (7 ms at 800,000 and at 2,000,000). Changes whose seqs lie far apart (a long task finishing
# among recent ones) get an UPDATE per cluster (``seq_ranges``). A change whose row no range holds
# (one from a journal written before changes carried their seq: -1) leaves the count short, and
# the checkpoint redoes its batch with a single UPDATE over the whole table (``DuckDBStore``).
_CHANGED = ("state", "attempt", "worker_id", "updated_at", "reason", "retries_used", "not_before", "outcome")
_CHANGE_SCHEMA = pa.schema([("task_id", pa.string()), ("state", pa.string()), ("attempt", pa.int64()),
                            ("worker_id", pa.string()), ("updated_at", pa.float64()), ("reason", pa.string()),
                            ("retries_used", pa.int64()), ("not_before", pa.float64()), ("outcome", pa.string()),
                            ("entries", pa.string()), ("seq", pa.int64())])
SEQ_GAP = 1 << 16  # seqs further apart than this go to separate UPDATEs (a row group holds 122,880 rows)


def seq_ranges(seqs: list[int], gap: int = SEQ_GAP) -> list[tuple[int, int]]:
    """Inclusive ``(low, high)`` ranges covering every one of ``seqs``, split where two sorted
    neighbours lie more than ``gap`` apart."""
    out: list[tuple[int, int]] = []
    for s in sorted(set(seqs)):
        if out and s - out[-1][1] <= gap:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def changes_to_arrow(changes: list[TaskChange]) -> pa.Table:
    """The Arrow batch ``update_tasks_sql`` reads (one row per change; one change per task)."""
    # a column at a time through C, the JSON as the encoder's bytes (as ``Table.to_arrow``)
    cols: dict[str, list[Any]] = {name: list(map(attrgetter(name), changes)) for name in ("task_id", *_CHANGED, "seq")}
    cols["outcome"] = [None if v is None else _json_encode(v) for v in cols["outcome"]]
    cols["entries"] = [_json_encode(c.entries) for c in changes]
    return pa.Table.from_pydict(cols, schema=_CHANGE_SCHEMA)


def upsert(con: duckdb.DuckDBPyConnection, table: Table, recs: list[Any], fresh: bool = False) -> int:
    """Insert ``recs`` into ``table`` (one row per key: the first for ``keep_first`` tables, else
    the last, replacing a stored one); return the bytes of the Arrow batch. ``fresh``: the caller
    expects no key to be stored yet, so a plain ``INSERT`` (about half the cost of ``INSERT OR
    REPLACE`` / ``OR IGNORE``, which look every key up first) does; a stored key then raises
    ``duckdb.ConstraintException`` and the caller redoes its transaction without ``fresh``."""
    batch = table.to_arrow(table.dedupe(recs))
    verb = "INSERT" if fresh else "INSERT OR IGNORE" if table.keep_first else "INSERT OR REPLACE"
    view = f"_batch_{table.name}"
    with _registered(con, view, batch):
        con.execute(f"{verb} INTO {table.name} ({table.column_list}) SELECT {table.column_list} FROM {view}")
    return int(batch.nbytes)


@contextlib.contextmanager
def _registered(con: duckdb.DuckDBPyConnection, view: str, batch: pa.Table) -> Iterator[None]:
    """``batch`` as the view ``view`` while the block runs. When the block fails, its transaction
    is aborted and refuses the unregister too (the caller's rollback drops the view): the
    block's own error is what propagates."""
    con.register(view, batch)
    try:
        yield
    except BaseException:
        with contextlib.suppress(duckdb.Error):
            con.unregister(view)
        raise
    con.unregister(view)


def stored_result_keys(con: duckdb.DuckDBPyConnection, rows: list[ResultRow]) -> set[tuple[str, int]]:
    """The keys of ``rows`` that ``results`` already holds."""
    keys = pa.table({"task_id": [r.task_id for r in rows], "attempt": pa.array([r.attempt for r in rows], pa.int64())})
    with _registered(con, "_pending_keys", keys):
        found = con.execute(
            "SELECT r.task_id, r.attempt FROM results r JOIN _pending_keys k USING (task_id, attempt)").fetchall()
    return {(task_id, int(attempt)) for task_id, attempt in found}


def pending_task_ids(con: duckdb.DuckDBPyConnection, task_ids: list[str]) -> contextlib.AbstractContextManager[None]:
    """``_pending_tasks`` (``NOT_PENDING_SQL``) while the block runs: a view of the ids of tasks
    whose newest row is not in DuckDB yet."""
    return _registered(con, "_pending_tasks", pa.table({"task_id": pa.array(task_ids, pa.string())}))


def update_tasks(con: duckdb.DuckDBPyConnection, changes: list[TaskChange], *, ranged: bool = False) -> tuple[int, int]:
    """Apply ``changes`` (one per task) to ``tasks``; return (bytes of the batch, rows updated).
    ``ranged``: one UPDATE per range of the changes' seqs, each looking only at the stored rows
    in its range (see ``_CHANGED``); a change whose seq is unknown or whose row lies elsewhere is
    then not applied, and the caller, seeing fewer rows updated, redoes its transaction without."""
    batch = changes_to_arrow(changes)
    updated = 0
    with _registered(con, "_batch_changes", batch):
        for low, high in seq_ranges([c.seq for c in changes if c.seq >= 0]) if ranged else [(-1, -1)]:
            sql = update_tasks_sql("_batch_changes", ranged=ranged)
            row = con.execute(sql, [low, high, low, high] if ranged else []).fetchall()
            updated += int(row[0][0]) if row else 0
    return int(batch.nbytes), updated


def missing_tasks(con: duckdb.DuckDBPyConnection, task_ids: list[str]) -> list[str]:
    """Those of ``task_ids`` that ``tasks`` does not hold, in order."""
    stored = {tid for (tid,) in con.execute("SELECT task_id FROM tasks WHERE list_contains(?, task_id)",
                                            [task_ids]).fetchall()}
    return [tid for tid in task_ids if tid not in stored]


def update_tasks_sql(view: str, *, ranged: bool = False) -> str:
    """Apply the changes in Arrow view ``view`` to ``tasks``; its row count is the rows updated.
    ``ranged``: only the changes, and only the stored rows, whose seq lies between the parameters'
    first two and last two (the same range twice)."""
    sets = ", ".join(f"{name} = c.{name}" for name in _CHANGED)
    where = " AND c.seq BETWEEN ? AND ? AND tasks.seq BETWEEN ? AND ?" if ranged else ""
    return (f"UPDATE tasks SET {sets}, history = CASE WHEN c.entries = '[]' THEN tasks.history "
            "WHEN tasks.history::VARCHAR = '[]' THEN c.entries::JSON "
            "ELSE (substr(tasks.history::VARCHAR, 1, length(tasks.history::VARCHAR) - 1) || ',' "
            f"|| substr(c.entries, 2))::JSON END FROM {view} c WHERE tasks.task_id = c.task_id{where}")


def where_sql(q: ResultQuery | TaskQuery) -> tuple[str, list[Any]]:
    """SQL ``WHERE`` clause and parameters of ``q``'s filter (``filters``)."""
    p = Params(numbered=False)
    table = TABLES[ResultRow if isinstance(q, ResultQuery) else TaskRow]
    return render(describe(q), DUCKDB, p, [c.name for c in table.columns]), p.values


def task_order(t: TaskRow) -> tuple[float, int, str]:
    return (t.submitted_at, t.seq, t.task_id)


ACTIVE_SQL = "state NOT IN (" + ", ".join(f"'{s}'" for s in sorted(TERMINAL)) + ")"
TERMINAL_SQL = "state IN (" + ", ".join(f"'{s}'" for s in sorted(TERMINAL)) + ")"
FAILED_SQL = "state IN (" + ", ".join(f"'{s}'" for s in sorted(FAILED_STATES)) + ")"
NOT_PENDING_SQL = "task_id NOT IN (SELECT task_id FROM _pending_tasks)"


def load_snapshot(con: duckdb.DuckDBPyConnection) -> Snapshot:
    """The active tasks, the workers, keys and meta, the task counts per state and the largest seq."""

    def rows(row_type: type[Any], order: str) -> list[Any]:
        table = TABLES[row_type]
        fetched = con.execute(f"SELECT {table.column_list} FROM {table.name} ORDER BY {order}").fetchall()
        return [table.from_tuple(values) for values in fetched]

    meta = {m.key: m.value for m in rows(MetaRow, "key")}
    table = TABLES[TaskRow]
    active = con.execute(
        f"SELECT {table.column_list} FROM tasks WHERE {ACTIVE_SQL} ORDER BY seq, submitted_at, task_id").fetchall()
    counts = con.execute("SELECT state, count(*), max(seq) FROM tasks GROUP BY state").fetchall()
    return Snapshot(tasks=[table.from_tuple(values) for values in active], workers=rows(WorkerRow, "worker_id"),
                    keys=rows(KeyRow, "key_id"), meta=meta, task_counts={state: int(n) for state, n, _ in counts},
                    max_seq=max((int(m) for _, _, m in counts), default=0))


# A task's first dispatch (core/runs.py, ``first_dispatch``): its history's second entry, when that
# is the move to ``assigned``.
FIRST_DISPATCH_SQL = ("CASE WHEN json_extract_string(history, '$[1].to') = 'assigned' "
                      "THEN CAST(json_extract_string(history, '$[1].at') AS DOUBLE) END")


def run_stats(con: duckdb.DuckDBPyConnection, run_ids: list[str],
              pending_ids: list[str]) -> list[tuple[str, str, int, float | None, float]]:
    """(run, state, tasks, first dispatch, latest update) of the stored tasks of ``run_ids``
    whose newest row is not pending (``pending_ids``)."""
    with pending_task_ids(con, pending_ids):
        rows = con.execute(
            f"SELECT run_id, state, count(*), min({FIRST_DISPATCH_SQL}), max(updated_at) FROM tasks "
            f"WHERE run_id IN (SELECT unnest(?::VARCHAR[])) AND {NOT_PENDING_SQL} GROUP BY run_id, state",
            [run_ids]).fetchall()
    return [(r, st, int(n), d, u) for r, st, n, d, u in rows]


def rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Roll back the open transaction; one DuckDB already ended (a COMMIT that failed on a full
    disk aborts it) raises nothing here, so the failure that ended it is the one reported."""
    with contextlib.suppress(duckdb.TransactionException):
        con.execute("ROLLBACK")
