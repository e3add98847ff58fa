"""The SQL of the PostgreSQL store: table mapping, schema, the one-statement batch write, and the
query filters' dialect. Pure: builds strings and parameter lists, talks to no database.

Column types: ``str`` -> ``text``, ``int`` -> ``bigint``, ``float`` -> ``double precision``,
anything nested -> ``json``. ``json`` rather than ``jsonb`` because it keeps the exact text that was
written: ``jsonb`` turns ``1e16`` into the integer ``10000000000000000`` and ``1e300`` into a
301-digit integer, so a float read back would come out an int (or not decode at all), and it
reorders object keys. The filters compare the raw JSON text of a field (what ``->`` returns on a
``json`` value) with the query value encoded the same way, which is exact and type-strict: ``4``
matches an integer 4, never ``4.0``, ``"4"`` or ``true`` (``memory.result_matches``).

PostgreSQL cannot hold U+0000 in ``text``, nor de-escape a ``\\u0000`` inside ``json`` (every
``->`` on such a value fails). So U+0000 in any stored string becomes U+FFFD (the replacement
character); it is the one way a row read back can differ from the one written, and only for
strings holding NUL, which no field of ours means to.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from ..core.rows import FORGOTTEN, KeyRow, MetaRow, ResultRow, RunRow, TaskRow, WorkerRow
from .base import TERMINAL, RecordTable, ResultQuery, TaskQuery
from .filters import Dialect, Params, describe, render
from .pgblobs import BLOB_REFS_DDL, BLOB_REFS_INDEX, BLOBS_DDL

_json_encode = msgspec.json.Encoder().encode
_json_decode = msgspec.json.Decoder().decode
_NUL_ESCAPE = re.compile(rb"(?<!\\)((?:\\\\)*)\\u0000")

ACTIVE_SQL = "state NOT IN (" + ", ".join(f"'{s}'" for s in sorted(TERMINAL)) + ")"
FAILED_STATES = ("error", "failed", "timed_out")  # TaskStats.recent_failures
FAILED_SQL = "state IN (" + ", ".join(f"'{s}'" for s in FAILED_STATES) + ")"
TERMINAL_SQL = "state IN (" + ", ".join(f"'{s}'" for s in sorted(TERMINAL)) + ")"
KEYS_CHANNEL = "dt_keys"  # NOTIFY channel: payload = comma-separated key ids ("" = reload all)
NOTIFY_MAX_BYTES = 7999  # PostgreSQL's payload limit is 8000 bytes


def clean_text(value: str) -> str:
    return value.replace("\x00", "\ufffd") if "\x00" in value else value


def encode_json(value: Any) -> str:
    data = _json_encode(value)
    if b"\\u0000" in data:
        data = _NUL_ESCAPE.sub(rb"\1\\ufffd", data)
    return data.decode()


# ---------------------------------------------------------------------------- table mapping


@dataclass(frozen=True)
class Column:
    name: str
    sql: str  # the column's type
    array: str  # the parameter array type the batch write sends (json travels as text)
    kind: str  # "text", "int", "float", "json"
    nullable: bool


@dataclass(frozen=True)
class Table(RecordTable[Column]):
    """A record type's PostgreSQL table (``RecordTable``), written as parameter arrays."""

    @classmethod
    def column(cls, name: str, base: Any, nullable: bool) -> Column:
        if base is str:
            return Column(name, "text", "text[]", "text", nullable)
        if base is int:
            return Column(name, "bigint", "bigint[]", "int", nullable)
        if base is float:
            return Column(name, "double precision", "float8[]", "float", nullable)
        return Column(name, "json", "text[]", "json", nullable)

    @property
    def key_index(self) -> tuple[int, ...]:
        names = [c.name for c in self.columns]
        return tuple(names.index(k) for k in self.key)

    def encoder(self) -> Callable[[Any], tuple[Any, ...]]:
        """A function from a record to its row values in column order (JSON encoded, NUL-free)."""
        fields = operator.attrgetter(*(c.name for c in self.columns))
        json_at = [i for i, c in enumerate(self.columns) if c.kind == "json"]
        text_at = [i for i, c in enumerate(self.columns) if c.kind == "text"]

        def encode(rec: Any) -> tuple[Any, ...]:
            values = list(fields(rec))
            for i in json_at:
                if values[i] is not None:
                    values[i] = encode_json(values[i])
            for i in text_at:
                v = values[i]
                if v is not None and "\x00" in v:
                    values[i] = v.replace("\x00", "\ufffd")
            return tuple(values)

        return encode

    def decoder(self) -> Callable[[Sequence[Any]], Any]:
        """A function from a fetched row (columns in order) back to the record."""
        json_at = [i for i, c in enumerate(self.columns) if c.kind == "json"]
        row_type = self.row_type

        def decode(values: Sequence[Any]) -> Any:
            vals = list(values)
            for i in json_at:
                if vals[i] is not None:
                    vals[i] = _json_decode(vals[i])
            return row_type(*vals)

        return decode


TABLES: dict[type[Any], Table] = {
    TaskRow: Table.of("tasks", TaskRow, ("task_id",)),
    ResultRow: Table.of("results", ResultRow, ("task_id", "attempt"), keep_first=True),
    WorkerRow: Table.of("workers", WorkerRow, ("worker_id",)),
    KeyRow: Table.of("api_keys", KeyRow, ("key_id",)),
    MetaRow: Table.of("meta", MetaRow, ("key",)),
    RunRow: Table.of("runs", RunRow, ("run_id",)),
}

# What query_tasks, query_results, task_stats and the snapshot look up.
INDEXES = (
    f"CREATE INDEX tasks_active ON tasks (seq) WHERE {ACTIVE_SQL}",
    "CREATE INDEX tasks_submitted ON tasks (submitted_at, seq)",
    "CREATE INDEX tasks_updated ON tasks (updated_at)",
    f"CREATE INDEX tasks_failed ON tasks (updated_at) WHERE {FAILED_SQL}",
    "CREATE INDEX results_received ON results (received_at, task_id, attempt)",
    *(RUN_INDEXES := ("CREATE INDEX IF NOT EXISTS tasks_run ON tasks (run_id) WHERE run_id IS NOT NULL",
                      "CREATE INDEX IF NOT EXISTS runs_created ON runs (created_at, run_id)")),
)
RUN_ORDER = "created_at DESC, run_id DESC"  # Store.query_runs

LEASE_DDL = (
    "CREATE TABLE dt_lease (name text PRIMARY KEY, holder text NOT NULL, epoch bigint NOT NULL, "
    "expires_at timestamptz NOT NULL, url text NOT NULL DEFAULT '')"
)


def schema_ddl() -> list[str]:
    """Every statement that creates the schema of the current version (without the version row)."""
    return [
        "CREATE TABLE schema_version (version integer NOT NULL)",
        *(t.ddl() for t in TABLES.values()),
        *INDEXES,
        LEASE_DDL,
        BLOBS_DDL,
        BLOB_REFS_DDL,
        BLOB_REFS_INDEX,
    ]


# ---------------------------------------------------------------------------- the batch write

FENCE_CTE = (
    "fence AS (SELECT 1 FROM dt_lease WHERE name = 'leader' AND holder = {h} AND epoch = {e} "
    "AND expires_at > clock_timestamp() FOR SHARE)"
)


@dataclass(frozen=True)
class Shape:
    """Which parts one batch write has; the statement text depends only on this (and is cached
    and prepared once per shape by asyncpg)."""

    tables: tuple[str, ...]  # names of the tables that get rows, in TABLES order
    meta_delete: bool  # meta keys deleted (a MetaRow with an empty value)
    fenced: bool
    notify: bool
    worker_delete: bool = False  # worker rows deleted (a WorkerRow whose state is FORGOTTEN)


def write_statement(shape: Shape) -> str:
    """One statement that writes a whole batch (run in autocommit: it is its own transaction, one
    round trip). Parameters: for each table in ``shape.tables`` one array per column; then the
    meta keys to delete; then the worker ids to delete; then fence holder and epoch; then the notification payload. It returns one
    row ``(ok)``: false when the fence did not hold, in which case nothing was written."""
    by_name = {t.name: t for t in TABLES.values()}
    n = 0

    def param() -> str:
        nonlocal n
        n += 1
        return f"${n}"

    ctes: list[str] = []
    guard = " WHERE EXISTS (SELECT 1 FROM fence)" if shape.fenced else ""
    for name in shape.tables:
        t = by_name[name]
        arrays = ", ".join(f"{param()}::{c.array}" for c in t.columns)
        cols = ", ".join(f"u.{c.name}::json" if c.kind == "json" else f"u.{c.name}" for c in t.columns)
        if t.keep_first:
            conflict = "DO NOTHING"
        else:
            sets = ", ".join(f"{c.name} = EXCLUDED.{c.name}" for c in t.columns if c.name not in t.key)
            conflict = f"DO UPDATE SET {sets}"
        ctes.append(
            f"w_{name} AS (INSERT INTO {name} ({t.column_list}) SELECT {cols} FROM unnest({arrays}) "
            f"AS u({t.column_list}){guard} ON CONFLICT ({', '.join(t.key)}) {conflict})"
        )
    if shape.meta_delete:
        cond = " AND EXISTS (SELECT 1 FROM fence)" if shape.fenced else ""
        ctes.append(f"d_meta AS (DELETE FROM meta WHERE key = ANY({param()}::text[]){cond})")
    if shape.worker_delete:
        cond = " AND EXISTS (SELECT 1 FROM fence)" if shape.fenced else ""
        ctes.append(f"d_workers AS (DELETE FROM workers WHERE worker_id = ANY({param()}::text[]){cond})")
    if shape.fenced:
        ctes.insert(0, FENCE_CTE.format(h=param(), e=param()))
    ok = "EXISTS (SELECT 1 FROM fence)" if shape.fenced else "true"
    if shape.notify:
        select = f"SELECT ok, CASE WHEN ok THEN pg_notify('{KEYS_CHANNEL}', {param()}) END FROM (SELECT {ok} AS ok) s"
    else:
        select = f"SELECT {ok} AS ok"
    return (f"WITH {', '.join(ctes)} " if ctes else "") + select


def notify_payload(key_ids: Sequence[str]) -> str:
    """The ``dt_keys`` payload: the ids joined by commas, or "" (reload all) when too long."""
    text = ",".join(key_ids)
    return text if len(text.encode()) <= NOTIFY_MAX_BYTES else ""


# ---------------------------------------------------------------------------- query filters

# How the filters (``filters.render``) send values here: text and JSON as this store stores them.
POSTGRES = Dialect("postgres", text=clean_text, json=encode_json)


def where_sql(q: ResultQuery | TaskQuery, p: Params) -> str:
    """``WHERE`` clause of ``q``'s filter (``filters``), its parameters added to ``p``."""
    table = TABLES[ResultRow if isinstance(q, ResultQuery) else TaskRow]
    return render(describe(q), POSTGRES, p, [c.name for c in table.columns])


TASK_ORDER = "submitted_at DESC, seq DESC, task_id DESC"
RESULT_ORDER = "received_at DESC, task_id DESC, attempt DESC"


KEY_AT = {t: table.key_index for t, table in TABLES.items()}
STATE_AT = [c.name for c in TABLES[WorkerRow].columns].index("state")


def batch_statement(rows: list[tuple[type[Any], tuple[Any, ...]]],
                    fence: tuple[str, int] | None) -> tuple[str, list[Any]]:
    """The one statement writing ``rows`` (record type, encoded row), deduplicated per key (last
    wins, first for results), with its arguments; ``fence`` (holder, epoch) makes it write only
    while that lease is held."""
    per_table: dict[type[Any], dict[tuple[Any, ...], tuple[Any, ...]]] = {}
    for row_type, row in rows:
        unique = per_table.setdefault(row_type, {})
        key = tuple(row[i] for i in KEY_AT[row_type])
        if TABLES[row_type].keep_first:
            unique.setdefault(key, row)
        else:
            unique[key] = row
    args: list[Any] = []
    tables: list[str] = []
    deleted: list[str] = []
    key_ids: list[str] = []
    forgotten: list[str] = []
    for row_type, table in TABLES.items():
        values = list(per_table.get(row_type, {}).values())
        if row_type is MetaRow:
            deleted = [v[0] for v in values if v[1] == ""]  # an empty value deletes its key
            values = [v for v in values if v[1] != ""]
        if row_type is KeyRow:
            key_ids = [v[0] for v in values]
        if row_type is WorkerRow:
            forgotten = [v[0] for v in values if v[STATE_AT] == FORGOTTEN]  # deletes its row
            values = [v for v in values if v[STATE_AT] != FORGOTTEN]
        if values:
            tables.append(table.name)
            args.extend(list(col) for col in zip(*values, strict=True))
    if deleted:
        args.append(deleted)
    if forgotten:
        args.append(forgotten)
    if fence is not None:
        args.extend(fence)
    if key_ids:
        args.append(notify_payload(key_ids))
    shape = Shape(tuple(tables), bool(deleted), fence is not None, bool(key_ids), bool(forgotten))
    return write_statement(shape), args
