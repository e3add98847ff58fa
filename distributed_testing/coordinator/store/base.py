"""The Store protocol every backend implements, and the queries of its read side.

The coordinator's in-memory state is the authority while it runs; the store makes it survive a
restart. What it persists are the records of ``coordinator/core/rows.py`` (idempotent upserts, or
inserts keyed by (task_id, attempt), so replaying them twice is harmless).

Durability contract: ``append(records)`` returns a future that completes only when every record
is on disk. The coordinator acknowledges a submission or a worker's result only after that.
"""

from __future__ import annotations

import asyncio
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, Self, TypeVar

import msgspec

from ...errors import StoreError
from ...protocol.messages import ResultStatus
from ...tasks.states import TERMINAL as TERMINAL
from ...tasks.states import TaskState
from ..core.rows import Record, ResultRow, RunRow, Snapshot, TaskRow
from ..core.runs import RunStats

SCHEMA_VERSION = 5


class ResultQuery(msgspec.Struct, frozen=True):
    """Results (``GET /api/v1/results``): every given filter must hold (``filters.RESULT_FIELDS``).

    - ``task_id``, ``worker_id``, ``status``, ``task_type``: equal to the result's field.
    - ``since`` <= ``received_at`` < ``until`` (coordinator clock; times are finite floats).
    - ``model`` / ``precision``: ``output["model"]`` / ``output["precision"]`` is that string.
    - ``hardware``: ``output["device"]`` is that string, or ``output["environment"]["device_name"]``
      is (exact match, e.g. ``"cuda"`` or ``"NVIDIA H100 80GB HBM3"``).
    - ``config_hash``: ``output["config_hash"]`` is that string; ``fingerprint``:
      ``output["environment"]["fingerprint_hash"]`` is.
    - ``batch_size``: some object in the list ``output["batch_results"]`` has ``batch_size`` equal
      to that integer (an int, not a bool or float).

    Order and paging: ``memory`` (its docstring)."""

    task_id: str | None = None
    worker_id: str | None = None
    status: ResultStatus | None = None  # a typo is a 400, not an empty answer
    task_type: str | None = None
    since: float | None = None
    until: float | None = None
    # benchmark filters match fields of the result output
    model: str | None = None
    precision: str | None = None
    hardware: str | None = None
    batch_size: int | None = None
    config_hash: str | None = None  # output.config_hash (bench/env.py)
    fingerprint: str | None = None  # output.environment.fingerprint_hash
    limit: int = 100
    offset: int = 0


class TaskQuery(msgspec.Struct, frozen=True):
    """A page of tasks (``GET /api/v1/tasks``): every given filter must hold (``filters.TASK_FIELDS``).

    - ``state``, ``type``, ``worker_id``, ``submitted_by``, ``run_id``: equal to the task's field.
    - ``tag``: a string in the list ``spec["requirements"]["tags"]`` (not a list: no tags).
    - ``since`` <= ``submitted_at`` < ``until``.

    Order: newest first by ``submitted_at``, ties by ``seq`` descending; then ``offset`` and
    ``limit``. ``total`` in the answer counts every match, before offset and limit."""

    state: TaskState | None = None  # a typo is a 400, not an empty page
    type: str | None = None
    worker_id: str | None = None
    tag: str | None = None
    submitted_by: str | None = None
    since: float | None = None
    until: float | None = None
    run_id: str | None = None
    limit: int = 100
    offset: int = 0


class TaskPage(msgspec.Struct):
    tasks: list[TaskRow]
    total: int


class TaskStats(msgspec.Struct):
    """History for the overview, computed by the store over ``[since, since + n * bucket_s)``:
    ``submitted[i]`` counts tasks with ``submitted_at`` in bucket ``i``, ``finished[i]`` tasks
    in a terminal state with ``updated_at`` in bucket ``i``; ``recent_failures`` are the newest
    (by ``updated_at``, at most ``failures`` of them) tasks in state failed, timed_out or error."""

    submitted: list[int]
    finished: list[int]
    recent_failures: list[TaskRow]


def stored_schema_version(rows: Sequence[Sequence[Any]], where: object) -> int:
    """The version in a store's ``schema_version`` table (its rows), refusing a table that does
    not hold exactly one and a version newer than this code's ``SCHEMA_VERSION``."""
    if len(rows) != 1:
        raise StoreError(f"{where}: schema_version must hold one row, found {len(rows)}")
    version = int(rows[0][0])
    if version > SCHEMA_VERSION:
        raise StoreError(f"{where} has schema version {version}, newer than the version {SCHEMA_VERSION} "
                         "this coordinator understands; upgrade distributed_testing to open it")
    return version


class SqlColumn(Protocol):
    """What ``RecordTable`` needs of a backend's column: its name, SQL type and nullability."""

    @property
    def name(self) -> str: ...
    @property
    def sql(self) -> str: ...
    @property
    def nullable(self) -> bool: ...


C = TypeVar("C", bound=SqlColumn)


@dataclass(frozen=True)
class RecordTable(Generic[C]):
    """How one record type maps to one SQL table: columns follow the Struct's fields, in order.
    A backend subclasses it with its ``column`` (field name, base type, nullable -> its column)
    and what its reads and writes need."""

    name: str
    row_type: type[Any]
    key: tuple[str, ...]
    keep_first: bool  # results: a resend must not replace the first row received
    columns: tuple[C, ...]

    @classmethod
    def column(cls, name: str, base: Any, nullable: bool) -> C:
        raise NotImplementedError

    @classmethod
    def of(cls, name: str, row_type: type[Any], key: tuple[str, ...], keep_first: bool = False) -> Self:
        cols = []
        for f in msgspec.structs.fields(row_type):
            args = typing.get_args(f.type)
            nullable = typing.get_origin(f.type) in (typing.Union, types.UnionType) and type(None) in args
            base = next(a for a in args if a is not type(None)) if nullable else f.type
            cols.append(cls.column(f.name, base, nullable))
        return cls(name, row_type, key, keep_first, tuple(cols))

    @property
    def column_list(self) -> str:
        return ", ".join(c.name for c in self.columns)

    def ddl(self) -> str:
        cols = [f"{c.name} {c.sql}{'' if c.nullable else ' NOT NULL'}" for c in self.columns]
        return f"CREATE TABLE {self.name} ({', '.join(cols)}, PRIMARY KEY ({', '.join(self.key)}))"


class Store(Protocol):
    async def open(self) -> Snapshot:
        """Open (creating and migrating the schema when needed) and load the snapshot."""

    def append(self, records: list[Record], linger_s: float = 0.0) -> asyncio.Future[None]:
        """Queue records for durable write; the future completes once they are on disk. The
        store takes the records as they are: the caller must not change them, nor the dicts and
        lists they hold, afterwards (the core makes a new row per change)."""

    async def query_results(self, query: ResultQuery) -> list[ResultRow]:
        """Results matching every given filter, newest first. Sees every completed append."""

    async def get_tasks(self, task_ids: Sequence[str]) -> dict[str, TaskRow]:
        """The stored rows of these tasks (ids not stored are absent). Sees every completed append."""

    async def query_tasks(self, query: TaskQuery) -> TaskPage:
        """One page of tasks matching ``query`` (see ``TaskQuery``). Sees every completed append."""

    async def task_stats(self, since: float, bucket_s: float, buckets: int, failures: int) -> TaskStats:
        """Per-bucket submitted/finished counts and the latest failures (see ``TaskStats``)."""

    async def run_stats(self, run_ids: Sequence[str]) -> dict[str, RunStats]:
        """Per run of ``run_ids`` (each present; empty without tasks): its tasks' counts by state,
        first dispatch and latest update (``core/runs.py``, ``RunStats``), computed by the store
        without reading the tasks out. Sees every completed append."""

    async def get_runs(self, run_ids: Sequence[str]) -> dict[str, RunRow]:
        """The stored runs of these ids (ids not stored are absent). Sees every completed append."""

    async def query_runs(self, limit: int, offset: int = 0, submitted_by: str | None = None) -> list[RunRow]:
        """Runs (of ``submitted_by`` when given), newest first by ``created_at``, ties by ``run_id``
        descending; then ``offset`` and ``limit``. Sees every completed append."""

    async def watch(self) -> None:
        """Run while the store is open; raise ``StoreError`` if its background work (a writer, a
        checkpointer) stops while open, after which it can write nothing more. Return once closed.
        The coordinator runs this supervised: its failure stops the process."""

    async def close(self) -> None:
        """Flush what was appended and release files. Idempotent."""
