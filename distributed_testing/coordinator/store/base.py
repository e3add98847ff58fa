"""What the coordinator persists, and the Store protocol every backend implements.

The coordinator's in-memory state is the authority while it runs; the store makes it survive a
restart. Records are idempotent upserts (tasks, workers, keys, meta) or inserts keyed by
(task_id, attempt) (results), so replaying them twice is harmless.

Durability contract: ``append(records)`` returns a future that completes only when every record
is on disk. The coordinator acknowledges a submission or a worker's result only after that.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import msgspec

SCHEMA_VERSION = 2


class _Rec(msgspec.Struct, frozen=True, tag_field="rec"):
    """Base of journal records; ``rec`` tags the record kind."""


class TaskRow(_Rec, frozen=True, tag="task"):
    task_id: str
    type: str
    state: str
    attempt: int
    priority: int
    submitted_at: float
    updated_at: float
    digest: str
    spec: dict[str, Any]
    worker_id: str | None = None
    reason: str | None = None
    retries_used: int = 0
    not_before: float = 0.0
    history: list[dict[str, Any]] = []
    outcome: dict[str, Any] | None = None
    seq: int = 0
    submitted_by: str | None = None


class ResultRow(_Rec, frozen=True, tag="result"):
    task_id: str
    attempt: int
    worker_id: str
    status: str
    started_at: float
    finished_at: float
    received_at: float
    output: dict[str, Any] = {}
    error: str | None = None
    task_type: str = ""


class WorkerRow(_Rec, frozen=True, tag="worker"):
    worker_id: str
    name: str
    hardware: dict[str, Any]
    capabilities: list[str]
    tags: list[str]
    first_seen: float
    last_seen: float
    state: str
    key_id: str | None = None  # the key this worker id is bound to (None: not bound; schema version 2)


class KeyRow(_Rec, frozen=True, tag="key"):
    key_id: str
    name: str
    role: str
    hash: str
    created_at: float
    expires_at: float | None = None
    revoked_at: float | None = None


class MetaRow(_Rec, frozen=True, tag="meta"):
    """A key/value setting of the store; a row with an empty ``value`` deletes ``key``."""

    key: str
    value: str


Record = TaskRow | ResultRow | WorkerRow | KeyRow | MetaRow


class Snapshot(msgspec.Struct):
    """Everything loaded at start. Results are not loaded; they are queried."""

    tasks: list[TaskRow] = []
    workers: list[WorkerRow] = []
    keys: list[KeyRow] = []
    meta: dict[str, str] = {}


class ResultQuery(msgspec.Struct, frozen=True):
    task_id: str | None = None
    worker_id: str | None = None
    status: str | None = None
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


class Store(Protocol):
    async def open(self) -> Snapshot:
        """Open (creating and migrating the schema when needed) and load the snapshot."""

    def append(self, records: list[Record], linger_s: float = 0.0) -> asyncio.Future[None]:
        """Queue records for durable write; the future completes once they are on disk."""

    async def query_results(self, query: ResultQuery) -> list[ResultRow]:
        """Results matching every given filter, newest first. Sees every completed append."""

    async def watch(self) -> None:
        """Run while the store is open; raise ``StoreError`` if its background work (a writer, a
        checkpointer) stops while open, after which it can write nothing more. Return once closed.
        The coordinator runs this supervised: its failure stops the process."""

    async def close(self) -> None:
        """Flush what was appended and release files. Idempotent."""
