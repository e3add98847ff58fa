"""The worker's durable result store (``--db-path`` / DT_DB_PATH).

A result is appended to a journal beside the DuckDB file as it is sent; acknowledgements and
running-task records are journalled too. A background checkpoint (every ``CHECKPOINT_S``) moves
them into the DuckDB table ``worker_results`` in bulk (acknowledged rows get ``acked_at``), so the
file is a queryable history of everything this worker ran.

Journal writes are not fsync'd one by one (``sync=False``): they survive a crash of the worker
process at once, and an OS crash after the next checkpoint. The coordinator is the durable record:
it acknowledges a result only once it is on its own disk, and re-runs the tasks of a worker it
lost, so a record lost in an OS crash costs at most a re-run or a re-send. On start the journal is replayed: results without an ack
are sent again after registration.

The same file holds the benchmark result cache (table ``bench_cache``, see ``bench_cache.py``):
:meth:`DuckDBResultStore.cache_get` / :meth:`DuckDBResultStore.cache_put` run on the result store's one DuckDB
connection and thread, since DuckDB allows a single writing process per file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import pyarrow as pa

from ..durable.duckfile import lock_holder
from ..durable.journal import Journal
from ..errors import ConfigError, StoreError
from ..protocol import messages as m
from ..security import files
from .bench_cache import CacheEntry
from .result_store import RunningRecord

log = logging.getLogger(__name__)
CHECKPOINT_S = 1.0


class OutResult(msgspec.Struct, tag="result", tag_field="rec", frozen=True):
    result: m.TaskResult
    at: float


class OutAck(msgspec.Struct, tag="ack", tag_field="rec", frozen=True):
    task_id: str
    attempt: int
    at: float


class OutStart(msgspec.Struct, tag="start", tag_field="rec", frozen=True):
    """A task still running 25 ms after it began (so a crash can be reported with --recover)."""

    task_id: str
    attempt: int
    at: float


class OutStop(msgspec.Struct, tag="stop", tag_field="rec", frozen=True):
    """A recorded task that ended without a result of ours (handed back, stopped on purpose)."""

    task_id: str
    attempt: int


OutRecord = OutResult | OutAck | OutStart | OutStop
_RUNNING_DDL = ("CREATE TABLE IF NOT EXISTS worker_running (task_id VARCHAR, attempt INTEGER, "
                "started_at DOUBLE, PRIMARY KEY (task_id, attempt))")

_DDL = """
CREATE TABLE IF NOT EXISTS worker_results (
    task_id VARCHAR, attempt INTEGER, status VARCHAR, started_at DOUBLE, finished_at DOUBLE,
    error VARCHAR, output VARCHAR, created_at DOUBLE, acked_at DOUBLE, PRIMARY KEY (task_id, attempt));
CREATE TABLE IF NOT EXISTS bench_cache (
    key VARCHAR PRIMARY KEY, fingerprint_hash VARCHAR NOT NULL, config VARCHAR NOT NULL, result VARCHAR NOT NULL,
    created_at DOUBLE NOT NULL, task_id VARCHAR NOT NULL)
"""


class DuckDBResultStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._journal: Journal[OutRecord] = Journal(path.parent / f"{path.name}.journal", OutRecord, name="outbox")
        self._pending: dict[tuple[str, int], m.TaskResult] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox-duckdb")
        self._con: duckdb.DuckDBPyConnection | None = None
        self._checkpointer: asyncio.Task[None] | None = None
        self._unapplied: list[OutRecord] = []  # journalled since the last checkpoint's rotation
        self._recorded: set[tuple[str, int]] = set()  # running tasks journalled with OutStart

    @property
    def _wal(self) -> Path:
        return self.path.with_name(self.path.name + ".wal")

    async def _db(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def open(self) -> None:
        self._con = await self._db(self._connect)
        for r in await self._db(self._load_unacked):
            self._pending[(r.task_id, r.attempt)] = r
        records = await asyncio.to_thread(self._journal.replay)
        acked = {(r.task_id, r.attempt) for r in records if isinstance(r, OutAck)}
        for key in acked:
            self._pending.pop(key, None)
        for r in records:
            if isinstance(r, OutResult) and (r.result.task_id, r.result.attempt) not in acked:
                self._pending[(r.result.task_id, r.result.attempt)] = r.result
        await self._journal.start()
        if records:
            upto = await self._journal.rotate()
            await self._db(self._apply, records)
            await asyncio.to_thread(self._journal.drop_segments, upto)
        if self._pending:
            log.info("outbox %s: %d results from an earlier run await acknowledgement", self.path, len(self._pending))
        self._checkpointer = asyncio.create_task(self._checkpoint_loop(), name="outbox-checkpoint")

    def _connect(self) -> duckdb.DuckDBPyConnection:
        # private to the worker's user: results and task output sit here (security.files)
        files.make_private_dir(self.path.parent)
        found = self.path.exists()  # a file found open is the operator's to hear about; one made now is not
        try:
            con = duckdb.connect(str(self.path), config={"threads": 1})  # bulk inserts gain nothing from more
        except duckdb.IOException as exc:
            locked = lock_holder(exc)
            if locked is None:
                raise StoreError(f"cannot open the worker database {self.path}: {exc}") from exc
            raise ConfigError(f"--db-path {self.path}: {locked}; is another worker using it? Give each worker "
                              "its own --db-path") from exc
        # only once the lock is ours: the files of a worker that holds it are not this process's to change
        # DuckDB creates its file with the umask's mode and refuses a pre-created empty one, so a new
        # database is narrowed to 0600 at once, before anything is written to it, without a warning
        files.tighten(self.path, quiet=not found)
        files.tighten(self._wal, quiet=True)
        files.tighten_tree(self._journal.directory)
        con.execute(_DDL)
        con.execute(_RUNNING_DDL)
        return con

    def _load_unacked(self) -> list[m.TaskResult]:
        """Results checkpointed earlier whose acknowledgement never came (DB thread)."""
        assert self._con is not None
        rows = self._con.execute("SELECT task_id, attempt, status, started_at, finished_at, output, error "
                                 "FROM worker_results WHERE acked_at IS NULL").fetchall()
        return [m.TaskResult(task_id=t, attempt=a, status=s, started_at=st, finished_at=fi,
                             output=json.loads(o or "{}"), error=e) for t, a, s, st, fi, o, e in rows]

    def add(self, result: m.TaskResult) -> asyncio.Future[None]:
        rec = OutResult(result, time.time())
        fut = self._journal.append([rec], sync=False)  # not fsync'd: see the module doc
        self._unapplied.append(rec)
        self._pending[(result.task_id, result.attempt)] = result
        return fut

    def ack(self, refs: list[m.TaskRef]) -> None:
        now = time.time()
        acks = [OutAck(r.task_id, r.attempt, now) for r in refs if self._pending.pop((r.task_id, r.attempt), None)]
        if acks:
            self._journal.append(list(acks), sync=False).add_done_callback(_log_failure)
            self._unapplied.extend(acks)

    def settled(self, results: list[m.TaskResult]) -> asyncio.Future[None]:
        now = time.time()
        recs: list[OutRecord] = [OutResult(r, now) for r in results]
        recs += [OutAck(r.task_id, r.attempt, now) for r in results]
        fut = self._journal.append(recs, sync=False)
        self._unapplied.extend(recs)
        return fut

    async def unacked(self) -> list[m.TaskResult]:
        return list(self._pending.values())

    def unacked_refs(self) -> list[m.TaskRef]:
        return [m.TaskRef(task_id, attempt) for task_id, attempt in self._pending]

    async def checkpoint(self) -> None:
        """Move everything journalled so far into DuckDB in one transaction, then drop those
        segments. On failure the segments stay and are replayed at the next start."""
        records, self._unapplied = self._unapplied, []
        try:
            upto = await self._journal.rotate()
            if records:
                await self._db(self._apply, records)
        except asyncio.CancelledError:
            # ``close`` stopped the loop mid-checkpoint: the records go back ahead of the newer
            # ones, for its final checkpoint (applying them twice changes nothing). A failure
            # leaves them to the journal's replay at the next start, as the docstring says.
            self._unapplied[:0] = records
            raise
        await asyncio.to_thread(self._journal.drop_segments, upto)

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(CHECKPOINT_S)
            try:
                await self.checkpoint()
                files.tighten(self._wal, quiet=True)  # DuckDB re-creates it with the process umask
            except (duckdb.Error, OSError) as exc:
                # the journal segments stay on disk and are applied at the next start
                log.error("outbox checkpoint into %s failed: %s", self.path, exc)

    def _apply(self, records: list[OutRecord]) -> None:
        assert self._con is not None
        results = {(r.result.task_id, r.result.attempt): r for r in records if isinstance(r, OutResult)}
        acks = {(a.task_id, a.attempt): a for a in records if isinstance(a, OutAck)}
        rows = {
            "task_id": [k[0] for k in results], "attempt": [k[1] for k in results],
            "status": [r.result.status for r in results.values()],
            "started_at": [r.result.started_at for r in results.values()],
            "finished_at": [r.result.finished_at for r in results.values()],
            "error": [r.result.error for r in results.values()],
            "output": [json.dumps(r.result.output) for r in results.values()],
            "created_at": [r.at for r in results.values()],
            "acked_at": [acks[k].at if k in acks else None for k in results],
        }
        ack_rows = {"task_id": [k[0] for k in acks], "attempt": [k[1] for k in acks], "at": [a.at for a in acks.values()]}
        new = pa.table(rows, schema=pa.schema([("task_id", pa.string()), ("attempt", pa.int32()), ("status", pa.string()),
                                               ("started_at", pa.float64()), ("finished_at", pa.float64()),
                                               ("error", pa.string()), ("output", pa.string()),
                                               ("created_at", pa.float64()), ("acked_at", pa.float64())]))
        ack_tbl = pa.table(ack_rows, schema=pa.schema([("task_id", pa.string()), ("attempt", pa.int32()), ("at", pa.float64())]))
        con = self._con
        started, ended = _running_changes(records)
        con.execute("BEGIN")
        try:
            con.register("new_rows", new)
            con.register("ack_rows", ack_tbl)
            con.register("started_rows", started)
            con.register("ended_rows", ended)
            con.execute("INSERT OR IGNORE INTO worker_results SELECT * FROM new_rows")
            con.execute("UPDATE worker_results SET acked_at = a.at FROM ack_rows a "
                        "WHERE worker_results.task_id = a.task_id AND worker_results.attempt = a.attempt "
                        "AND worker_results.acked_at IS NULL")
            con.execute("INSERT OR REPLACE INTO worker_running SELECT * FROM started_rows")
            con.execute("DELETE FROM worker_running USING ended_rows e "
                        "WHERE worker_running.task_id = e.task_id AND worker_running.attempt = e.attempt")
            con.execute("COMMIT")
            files.tighten(self._wal, quiet=True)  # re-created at each write with the umask's mode
        except duckdb.Error:
            con.execute("ROLLBACK")
            raise
        finally:
            for view in ("new_rows", "ack_rows", "started_rows", "ended_rows"):
                con.unregister(view)

    async def cache_get(self, keys: Sequence[str]) -> dict[str, CacheEntry]:
        """The ``bench_cache`` entries among ``keys``; StoreError if DuckDB fails."""
        if not keys:
            return {}
        try:
            rows = await self._db(self._cache_select, list(keys))
        except duckdb.Error as exc:
            raise StoreError(f"reading the benchmark cache in {self.path} failed: {exc}") from exc
        return {k: CacheEntry(key=k, fingerprint_hash=fp, config=json.loads(cfg), result=json.loads(res),
                              task_id=tid, created_at=at) for k, fp, cfg, res, at, tid in rows}

    async def cache_put(self, entries: Sequence[CacheEntry]) -> None:
        """Insert or replace ``bench_cache`` entries in one transaction; StoreError if DuckDB fails."""
        rows = [(e.key, e.fingerprint_hash, json.dumps(e.config, sort_keys=True), json.dumps(e.result), e.created_at,
                 e.task_id) for e in entries]
        if not rows:
            return
        try:
            await self._db(self._cache_upsert, rows)
        except duckdb.Error as exc:
            raise StoreError(f"writing the benchmark cache in {self.path} failed: {exc}") from exc

    def _cache_select(self, keys: list[str]) -> list[tuple[Any, ...]]:
        assert self._con is not None
        return self._con.execute("SELECT key, fingerprint_hash, config, result, created_at, task_id FROM bench_cache "
                                 "WHERE list_contains(?, key)", [keys]).fetchall()

    def _cache_upsert(self, rows: list[tuple[Any, ...]]) -> None:
        assert self._con is not None
        con = self._con
        con.execute("BEGIN")
        try:
            con.executemany("INSERT OR REPLACE INTO bench_cache VALUES (?, ?, ?, ?, ?, ?)", rows)
            con.execute("COMMIT")
        except duckdb.Error:
            con.execute("ROLLBACK")
            raise

    async def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checkpointer
            self._checkpointer = None
            await self.checkpoint()
        await self._journal.close()
        if self._con is not None:
            await self._db(self._con.close)
            self._con = None
        self._pool.shutdown(wait=True)

    # ---------------------------------------------------------- running-task records (--recover)
    # Table ``worker_running``: one row per attempt running now. A row still there at the next
    # start means the worker died while that attempt ran. Written on the DB thread in submission
    # order (a start is always recorded before its finish), without blocking the event loop.

    def running_started(self, refs: list[m.TaskRef]) -> None:
        if refs:
            now = time.time()
            recs = [OutStart(r.task_id, r.attempt, now) for r in refs]
            self._recorded.update((r.task_id, r.attempt) for r in refs)
            self._journal.append(list(recs), sync=False).add_done_callback(_log_running_failure)
            self._unapplied.extend(recs)

    def running_finished(self, refs: list[m.TaskRef]) -> None:
        """Tasks that ended without a result of ours. (A result ends its record by itself.)"""
        stops = [OutStop(r.task_id, r.attempt) for r in refs if (r.task_id, r.attempt) in self._recorded]
        if stops:
            self._recorded.difference_update((s.task_id, s.attempt) for s in stops)
            self._journal.append(list(stops), sync=False).add_done_callback(_log_running_failure)
            self._unapplied.extend(stops)

    async def take_interrupted(self) -> list[RunningRecord]:
        return [RunningRecord(*row) for row in await self._db(self._running_take)]

    def _running_take(self) -> list[tuple[str, int, float]]:
        assert self._con is not None
        rows = self._con.execute("SELECT task_id, attempt, started_at FROM worker_running ORDER BY started_at").fetchall()
        self._con.execute("DELETE FROM worker_running")
        return [(str(t), int(a), float(at)) for t, a, at in rows]


def _running_changes(records: list[OutRecord]) -> tuple[pa.Table, pa.Table]:
    """Rows to add to and remove from ``worker_running`` for one checkpoint batch."""
    ended = {(r.task_id, r.attempt) for r in records if isinstance(r, OutStop)}
    ended |= {(r.result.task_id, r.result.attempt) for r in records if isinstance(r, OutResult)}
    starts = [r for r in records if isinstance(r, OutStart) and (r.task_id, r.attempt) not in ended]
    started = pa.table({"task_id": [r.task_id for r in starts], "attempt": [r.attempt for r in starts],
                        "started_at": [r.at for r in starts]},
                       schema=pa.schema([("task_id", pa.string()), ("attempt", pa.int32()), ("started_at", pa.float64())]))
    gone = pa.table({"task_id": [k[0] for k in ended], "attempt": [k[1] for k in ended]},
                    schema=pa.schema([("task_id", pa.string()), ("attempt", pa.int32())]))
    return started, gone


def _log_running_failure(fut: Any) -> None:
    if fut.exception() is not None:
        log.error("recording running tasks in the outbox failed: %s", fut.exception())


def _log_failure(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.error("journalling an acknowledgement failed: %s", fut.exception())


class DuckDBResultCache:
    """Entries in the worker's DuckDB file (table ``bench_cache``), via the open result store."""

    def __init__(self, store: DuckDBResultStore) -> None:
        self.store = store

    async def get(self, keys: Sequence[str]) -> dict[str, CacheEntry]:
        return await self.store.cache_get(keys)

    async def put(self, entries: Sequence[CacheEntry]) -> None:
        await self.store.cache_put(entries)
