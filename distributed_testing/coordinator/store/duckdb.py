"""``DuckDBStore``: the coordinator's default store, a journal in front of an embedded DuckDB file.

Why the journal: a DuckDB statement costs hundreds of microseconds and a commit on file about a
millisecond and a half, while a group-committed append+fsync costs about 200 µs for a whole batch.
So the durability point is :class:`~distributed_testing.durable.journal.Journal` in ``<path>.journal/``:
``append`` completes once the records are fsync'd there. A background checkpointer (every
``checkpoint_interval_s``, or sooner once ``checkpoint_max_records`` records wait) rotates the
journal, applies the closed segments to DuckDB in one transaction with bulk Arrow inserts
(deduplicated per key first) that also records the last segment applied, commits, and only then
deletes those segments. A crash at any point loses nothing acknowledged: ``open`` applies leftover
segments newer than that mark before loading the snapshot, so a segment is applied exactly once
even if a crash interrupted the deletions (which the filesystem may persist in any order).

Reads force no checkpoint (one costs several fsyncs and a DuckDB commit): results and tasks
appended since the last checkpoint are kept in memory (the first result per key, the last row per
task) and merged with DuckDB's matching rows, filtered in Python by the same filter description DuckDB gets
as SQL (``filters``), and counted like ``MemoryStore`` counts (``stats_of``). The snapshot ``open``
returns holds only the active tasks, with the counts per state and the largest ``seq``.

Everything here is private to the coordinator's user: the directory, when the store creates it, is
0700, and the DuckDB file, its WAL and the journal are 0600 (an existing file left more open is
narrowed, with a warning; ``security.files``). The token-signing secret is not stored here at all.

All DuckDB work runs on one dedicated thread that owns the connection; the event loop never
blocks on it. The table mapping, migrations and SQL are ``duckdbsql``.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import duckdb

from ...durable.duckfile import lock_holder
from ...durable.journal import Journal
from ...errors import StoreError
from ...security import files
from ..core.rows import FORGOTTEN, MetaRow, Record, ResultRow, RunRow, Snapshot, TaskRow, WorkerRow
from ..core.runs import RunStats, add_stats, stats_of_runs
from .base import SCHEMA_VERSION, ResultQuery, TaskPage, TaskQuery, TaskStats, stored_schema_version
from .changes import Changes, JournalRecord, TaskChange, coalesce
from .duckdbsql import (
    FAILED_SQL,
    MIGRATIONS,
    NOT_PENDING_SQL,
    TABLES,
    TERMINAL_SQL,
    column_mismatch,
    create_schema,
    load_snapshot,
    migrate_step,
    missing_tasks,
    pending_task_ids,
    stored_result_keys,
    task_order,
    update_tasks,
    upsert,
    where_sql,
)
from .duckdbsql import get_runs as get_runs_sync
from .duckdbsql import query_runs as query_runs_sync
from .duckdbsql import rollback as _rollback
from .duckdbsql import run_stats as run_stats_sync
from .filters import describe, holds
from .memory import page_of_runs, result_order_key, stats_of, validate_query

log = logging.getLogger(__name__)

T = TypeVar("T")
# The tables a checkpoint first writes with a plain INSERT: a task's whole row is journaled once,
# at its submission (later rows are TaskChanges), and a result once per attempt, so their keys are
# new to DuckDB but after a restart (an active task's first row again), a row that does not extend
# the last one journaled, or a resent result. Those rare batches are redone with INSERT OR
# REPLACE / OR IGNORE (``_apply_sync``), and so is one whose changes' rows were not all where
# their seq said (``duckdbsql.update_tasks``): the second time, changes look in the whole table.
FRESH = (TaskRow, ResultRow)


# A checkpoint starts early once this many records wait: each has fixed costs (fsyncs, a COMMIT),
# and a task whose submission and outcome share a batch is one INSERT, not an INSERT and an UPDATE
# (against 5,000: about -20 % coordinator CPU per task; benchmarks/RESULTS.md, "Third pass").
CHECKPOINT_MAX_RECORDS = 20_000


class _Retry(Exception):
    """The optimistic form of a checkpoint's transaction did not fit its batch; it was rolled back."""


# ---------------------------------------------------------------------------- the store


class DuckDBStore:
    """Store on a DuckDB file, with a group-commit journal as the durability point.

    Beyond the ``Store`` protocol: ``checkpoint()`` applies everything appended so far to DuckDB
    now; ``journal`` exposes the journal (its ``flush_count`` counts fsyncs, ``byte_count`` the
    bytes written); ``checkpoint_bytes`` counts the bytes of the batches checkpoints handed DuckDB.

    A task's first row is journaled whole; its later rows as :class:`~.changes.TaskChange` (what
    the transition changed and the history entries it added), which the checkpoint folds into a
    row of the same batch or applies as an UPDATE that splices the new entries onto the stored
    history. A record's cost in the journal and at the checkpoint is thus flat in the length of
    its task's history. ``append`` takes ownership of the records: the caller must not change
    them (nor the dicts they hold) afterwards; the store keeps them, uncopied, for reads until
    they are checkpointed.
    """

    def __init__(self, path: Path, *, checkpoint_interval_s: float = 1.0,
                 checkpoint_max_records: int = CHECKPOINT_MAX_RECORDS) -> None:
        if checkpoint_interval_s <= 0 or checkpoint_max_records <= 0:
            raise ValueError("checkpoint_interval_s and checkpoint_max_records must be positive")
        self.path = Path(path)
        self.journal_dir = self.path.with_name(self.path.name + ".journal")
        self.checkpoint_interval_s = checkpoint_interval_s
        self.checkpoint_max_records = checkpoint_max_records
        self._journal: Journal[JournalRecord] = Journal(self.journal_dir, JournalRecord, name="store")
        self._changes = Changes()  # a task already journaled gets a TaskChange, not its whole row
        self._executor: ThreadPoolExecutor | None = None
        self._con: duckdb.DuckDBPyConnection | None = None
        self._checkpointer: asyncio.Task[None] | None = None
        self._ckpt_lock = asyncio.Lock()
        self._ckpt_wake = asyncio.Event()
        self._appended = 0  # records appended since open
        self._applied = 0  # of those, how many are known to be in DuckDB
        # Results not yet known to be in DuckDB, first per key, with the _appended count that
        # covers them; query_results merges them with DuckDB's rows instead of checkpointing.
        self._pending_results: dict[tuple[str, int], tuple[int, ResultRow]] = {}
        # Likewise the last row appended per task (the record itself: it is what the checkpoint
        # writes to DuckDB, so the merge shows exactly what DuckDB will hold).
        self._pending_tasks: dict[str, tuple[int, TaskRow]] = {}
        self._pending_runs: dict[str, tuple[int, RunRow]] = {}  # likewise runs
        self._applied_segment = 0  # last journal segment in DuckDB (DB thread only)
        self._unapplied: list[JournalRecord] = []  # appended since the last checkpoint's rotation
        self._memory_in_sync = False  # _unapplied is exactly the unapplied segments' content
        self._state = "new"  # new -> open -> closed
        self.checkpoint_bytes = 0  # bytes of the Arrow batches checkpoints handed DuckDB (its work, measured)

    @property
    def _wal(self) -> Path:
        return self.path.with_name(self.path.name + ".wal")

    @property
    def journal(self) -> Journal[JournalRecord]:
        return self._journal

    # ------------------------------------------------------------------ thread plumbing

    async def _db(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            raise StoreError(f"store {self.path} is not open")
        return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args))

    def _conn(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            raise StoreError(f"store {self.path} has no connection")
        return self._con

    # ------------------------------------------------------------------ open

    async def open(self) -> Snapshot:
        """Create or migrate the schema, apply leftover journal segments, load the snapshot."""
        if self._state != "new":
            raise StoreError(f"store {self.path} was already opened")
        self._state = "open"
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="duckdb-store")
        try:
            await self._db(self._connect_sync)
            await self._journal.start(min_seq=self._applied_segment + 1)
            await self._db(self._apply_sync, self._journal.active_segment - 1)
            snapshot = await self._db(self._load_snapshot_sync)
        except BaseException:
            await self._release()
            raise
        # Every older segment was applied and dropped above: the active one, empty, holds exactly
        # what will be appended from now on, so the first checkpoint needs no read back either.
        self._memory_in_sync = True
        self._checkpointer = asyncio.get_running_loop().create_task(
            self._checkpoint_loop(), name=f"store-checkpointer:{self.path.name}"
        )
        self._checkpointer.add_done_callback(self._checkpointer_done)
        log.info(
            "opened store %s: %d tasks, %d workers, %d keys",
            self.path,
            len(snapshot.tasks),
            len(snapshot.workers),
            len(snapshot.keys),
        )
        return snapshot

    def _connect_sync(self) -> None:
        try:
            files.make_private_dir(self.path.parent)
            for existing in (self.path, self._wal):
                files.tighten(existing)
            files.tighten_tree(self.journal_dir)
            self._con = duckdb.connect(str(self.path), config={"threads": 1})  # bulk upserts: more threads only contend
            files.tighten(self.path, quiet=True)  # just created with the umask's mode
        except (OSError, duckdb.Error) as exc:
            raise StoreError(f"cannot open DuckDB file {self.path}: {lock_holder(exc) or exc}") from exc
        self._ensure_schema_sync(self._con)
        try:
            row = self._con.execute("SELECT applied_segment FROM checkpoint_state").fetchone()
        except duckdb.Error as exc:
            raise StoreError(f"cannot read the checkpoint state of {self.path}: {exc}") from exc
        if row is None:
            raise StoreError(f"{self.path}: checkpoint_state is empty")
        self._applied_segment = int(row[0])

    def _ensure_schema_sync(self, con: duckdb.DuckDBPyConnection) -> None:
        try:
            exists = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'schema_version'").fetchone()
            if not exists or exists[0] == 0:
                self._in_transaction(con, create_schema)
                return
            rows = con.execute("SELECT version FROM schema_version").fetchall()
        except duckdb.Error as exc:
            raise StoreError(f"cannot read the schema of {self.path}: {exc}") from exc
        version = stored_schema_version(rows, self.path)
        while version < SCHEMA_VERSION:
            migrate = MIGRATIONS.get(version)
            if migrate is None:
                raise StoreError(f"{self.path}: no migration from schema version {version} to {version + 1}")
            self._in_transaction(con, functools.partial(migrate_step, migrate, version + 1))
            log.info("migrated %s to schema version %d", self.path, version + 1)
            version += 1
        self._check_columns_sync(con)

    def _check_columns_sync(self, con: duckdb.DuckDBPyConnection) -> None:
        if (mismatch := column_mismatch(con)) is not None:
            raise StoreError(f"{self.path}: {mismatch}")

    def _in_transaction(
        self, con: duckdb.DuckDBPyConnection, work: Callable[[duckdb.DuckDBPyConnection], None],
        retry: bool = False,
    ) -> None:
        """Run ``work`` in one transaction; any failure rolls it back and raises ``StoreError``.
        With ``retry``, a ``duckdb.ConstraintException`` (a key already stored) or ``_Retry`` from
        ``work`` rolls it back and raises ``_Retry`` (the caller redoes it another way)."""
        con.execute("BEGIN TRANSACTION")
        try:
            work(con)
            con.execute("COMMIT")
        except _Retry:
            _rollback(con)
            raise
        except duckdb.Error as exc:
            _rollback(con)
            if retry and isinstance(exc, duckdb.ConstraintException):
                raise _Retry(str(exc)) from exc
            raise StoreError(f"DuckDB transaction on {self.path} failed: {exc}") from exc
        except BaseException:
            _rollback(con)
            raise

    def _load_snapshot_sync(self) -> Snapshot:
        return self._read_sync("loading the snapshot", load_snapshot)

    # ------------------------------------------------------------------ writing

    def append(self, records: list[Record], linger_s: float = 0.0) -> asyncio.Future[None]:
        """Journal ``records``; the future completes once they are fsync'd (see the module doc),
        within ``linger_s`` of now unless other records come sooner (``Journal.append``)."""
        if self._state != "open":
            raise StoreError(f"store {self.path} is not open")
        if self._checkpointer is not None and self._checkpointer.done():
            raise StoreError(f"store {self.path}: the checkpointer stopped; see the log")
        journaled = self._changes.plan(records)
        fut = self._journal.append(journaled, linger_s=linger_s)
        self._changes.commit(records)
        self._unapplied.extend(journaled)
        self._appended += len(records)
        for rec in records:  # the caller's own rows: it hands them over (``append``'s contract)
            if isinstance(rec, TaskRow):
                self._pending_tasks[rec.task_id] = (self._appended, rec)
            elif isinstance(rec, ResultRow) and (rec.task_id, rec.attempt) not in self._pending_results:
                self._pending_results[(rec.task_id, rec.attempt)] = (self._appended, rec)
            elif isinstance(rec, RunRow):
                self._pending_runs[rec.run_id] = (self._appended, rec)
        if self._appended - self._applied >= self.checkpoint_max_records:
            self._ckpt_wake.set()
        return fut

    async def checkpoint(self) -> None:
        """Apply every record appended before this call to DuckDB (one transaction), then drop
        the journal segments that held them. Concurrent callers share one checkpoint."""
        target = self._appended
        async with self._ckpt_lock:
            if self._applied >= target:
                return
            covered = self._appended
            # The records appended so far are exactly those the rotation closes; after a failed
            # checkpoint they are re-read from disk instead, where they are still complete.
            taken, self._unapplied = self._unapplied, []
            in_memory, self._memory_in_sync = self._memory_in_sync, False
            closed = await self._journal.rotate()
            await self._db(self._apply_sync, closed, taken if in_memory else None)
            self._memory_in_sync = True
            self._applied = max(self._applied, covered)
            self._pending_results = {k: v for k, v in self._pending_results.items() if v[0] > covered}
            self._pending_tasks = {k: v for k, v in self._pending_tasks.items() if v[0] > covered}
            self._pending_runs = {k: v for k, v in self._pending_runs.items() if v[0] > covered}

    def _apply_sync(self, upto: int, records: list[JournalRecord] | None = None) -> None:
        """Apply the closed segments not yet applied, up to ``upto``, in one transaction; then
        delete every closed segment ``<= upto``. ``records``, when given, are those segments'
        records already in memory (saves reading and decoding them again). DB thread."""
        if upto < 1:
            return
        by_type: dict[type[Any], list[Any]] = {t: [] for t in TABLES}
        source = records if records is not None else self._journal.read_segments(upto, after=self._applied_segment)
        by_type[TaskRow], changes, other = coalesce(list(source))
        for rec in other:
            by_type[type(rec)].append(rec)

        written = 0

        def insert_all(optimistic: bool, con: duckdb.DuckDBPyConnection) -> None:
            nonlocal written
            written = 0
            for row_type, recs in by_type.items():
                if recs:
                    written += self._bulk_insert(con, TABLES[row_type], recs, optimistic and row_type in FRESH)
            if changes:
                written += self._bulk_update(con, changes, optimistic)
            if by_type[MetaRow]:
                con.execute("DELETE FROM meta WHERE value = ''")  # an empty value deletes its key
            if by_type[WorkerRow]:
                con.execute("DELETE FROM workers WHERE state = ?", [FORGOTTEN])  # deletes its row
            con.execute("UPDATE checkpoint_state SET applied_segment = ?", [upto])

        if changes or any(by_type.values()):
            try:  # optimistic: new keys for FRESH tables, each change's row where its seq says (see FRESH)
                self._in_transaction(self._conn(), functools.partial(insert_all, True), retry=True)
            except _Retry:  # rolled back: the same batch, each key looked up first, changes in the whole table
                self._in_transaction(self._conn(), functools.partial(insert_all, False))
            self.checkpoint_bytes += written
            self._applied_segment = upto
            files.tighten(self._wal, quiet=True)  # re-created at each write; the umask may have left it open
        self._journal.drop_segments(upto)

    _bulk_insert = staticmethod(upsert)

    def _bulk_update(self, con: duckdb.DuckDBPyConnection, changes: list[TaskChange], ranged: bool) -> int:
        """Apply one change per task to rows DuckDB holds; a missing row is a broken journal
        (every change follows its task's row), unless ``ranged`` looked for it only by its seq
        (``_Retry``: the caller redoes the batch without)."""
        nbytes, updated = update_tasks(con, changes, ranged=ranged)
        if updated != len(changes):
            if ranged:
                raise _Retry(f"{len(changes)} task changes matched {updated} stored tasks by their seq")
            missing = missing_tasks(con, [c.task_id for c in changes])
            raise StoreError(
                f"{self.path}: {len(changes)} task changes matched {updated} stored tasks: the journal "
                f"{self.journal_dir} changes {len(missing)} task(s) this DuckDB file does not hold "
                f"({', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}), so the two are not from one "
                "moment (a file restored from another backup than its journal?). Restore both from the same "
                "backup, or move the journal directory aside to start from the file alone (what the journal "
                "held since the file's last checkpoint is then lost)")
        return nbytes

    async def _checkpoint_loop(self) -> None:
        """Owned background task: checkpoint on the interval or when enough records wait."""
        delay = self.checkpoint_interval_s
        while self._state == "open":
            try:
                async with asyncio.timeout(delay):
                    await self._ckpt_wake.wait()
            except TimeoutError:
                pass
            self._ckpt_wake.clear()
            if self._state != "open" or self._applied >= self._appended:
                continue
            # A failed checkpoint ends the loop: DuckDB may have invalidated the database, and
            # the records are safe in the journal, which the next open applies (see ``watch``).
            await self.checkpoint()

    def _checkpointer_done(self, task: asyncio.Task[None]) -> None:
        # Further appends are refused (above) rather than let the journal grow unapplied; the
        # owner learns of it through watch() (the coordinator stops and logs the traceback).
        if not task.cancelled() and task.exception() is not None:
            log.error("checkpointer of %s stopped: %s; appends are refused", self.path, task.exception())

    async def watch(self) -> None:
        """Raise ``StoreError`` once the journal's writer or the checkpointer stops while the
        store is open (a failed write, fsync or checkpoint); return once the store is closed."""
        if self._checkpointer is None:
            raise StoreError(f"store {self.path} is not open")
        checkpointer = self._checkpointer
        journal = asyncio.get_running_loop().create_task(self._journal.watch(), name=f"journal-watch:{self.path.name}")
        try:
            await asyncio.wait([journal, checkpointer], return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not journal.done():
                journal.cancel()
        if journal.done() and not journal.cancelled():
            journal.result()  # raises the journal's failure, if any
        if checkpointer.done() and self._state == "open":
            exc = None if checkpointer.cancelled() else checkpointer.exception()
            raise StoreError(f"store {self.path}: the checkpointer stopped: {exc!r}") from exc

    # ------------------------------------------------------------------ reading

    async def query_results(self, query: ResultQuery) -> list[ResultRow]:
        """Results matching every filter of ``query`` (semantics: ``filters``),
        newest first. Sees every append completed before the call without forcing a checkpoint:
        DuckDB's matching rows are merged with the matching results still waiting for one."""
        validate_query(query)
        if self._state != "open":
            raise StoreError(f"store {self.path} is not open")
        f = describe(query)
        pending = [row for _, row in self._pending_results.values() if holds(f, row)]
        return await self._db(self._query_sync, query, pending)

    def _query_sync(self, query: ResultQuery, pending: list[ResultRow]) -> list[ResultRow]:
        """DuckDB's top ``offset + limit`` rows merged with ``pending`` rows whose key DuckDB does
        not hold (a key in DuckDB was received first, whatever that row's fields). DB thread."""
        table = TABLES[ResultRow]
        where, params = where_sql(query)
        sql = (
            f"SELECT {table.column_list} FROM results WHERE {where} "
            "ORDER BY received_at DESC, task_id DESC, attempt DESC LIMIT ?"
        )
        con = self._conn()
        try:
            fetched = con.execute(sql, [*params, query.offset + query.limit]).fetchall()
            stored = stored_result_keys(con, pending) if pending else set()
        except duckdb.Error as exc:
            raise StoreError(f"result query on {self.path} failed: {exc}") from exc
        rows = [table.from_tuple(values) for values in fetched]
        fresh = [r for r in pending if (r.task_id, r.attempt) not in stored]
        if fresh:
            rows = sorted(rows + fresh, key=result_order_key, reverse=True)
        return rows[query.offset : query.offset + query.limit]

    # ------------------------------------------------------------------ reading tasks

    def _pending_task_rows(self) -> list[TaskRow]:
        if self._state != "open":
            raise StoreError(f"store {self.path} is not open")
        return [row for _, row in self._pending_tasks.values()]

    async def get_tasks(self, task_ids: Sequence[str]) -> dict[str, TaskRow]:
        """The stored rows of these tasks, the ones appended since the last checkpoint included."""
        if self._state != "open":
            raise StoreError(f"store {self.path} is not open")
        found = {i: self._pending_tasks[i][1] for i in task_ids if i in self._pending_tasks}
        rest = [i for i in dict.fromkeys(task_ids) if i not in found]
        if rest:
            found.update(await self._db(self._get_tasks_sync, rest))
        return found

    def _get_tasks_sync(self, task_ids: list[str]) -> dict[str, TaskRow]:
        table = TABLES[TaskRow]
        sql = f"SELECT {table.column_list} FROM tasks WHERE task_id IN (SELECT unnest(?::VARCHAR[]))"
        try:
            rows = [table.from_tuple(v) for v in self._conn().execute(sql, [task_ids]).fetchall()]
        except duckdb.Error as exc:
            raise StoreError(f"task lookup on {self.path} failed: {exc}") from exc
        return {r.task_id: r for r in rows}

    async def query_tasks(self, query: TaskQuery) -> TaskPage:
        """One page of tasks (``memory.filter_tasks``): DuckDB's rows of tasks with nothing newer
        pending, merged with the pending rows that match."""
        validate_query(query)
        pending = self._pending_task_rows()
        f = describe(query)
        hits = [t for t in pending if holds(f, t)]
        total, stored = await self._db(self._query_tasks_sync, query, [t.task_id for t in pending])
        rows = heapq.nlargest(query.offset + query.limit, stored + hits, key=task_order)
        return TaskPage(tasks=rows[query.offset :], total=total + len(hits))

    def _query_tasks_sync(self, query: TaskQuery, pending_ids: list[str]) -> tuple[int, list[TaskRow]]:
        table = TABLES[TaskRow]
        where, params = where_sql(query)
        con = self._conn()
        try:
            with pending_task_ids(con, pending_ids):
                (total,) = con.execute(f"SELECT count(*) FROM tasks WHERE {where} AND {NOT_PENDING_SQL}",
                                       params).fetchone() or (0,)
                fetched = con.execute(
                    f"SELECT {table.column_list} FROM tasks WHERE {where} AND {NOT_PENDING_SQL} "
                    "ORDER BY submitted_at DESC, seq DESC, task_id DESC LIMIT ?",
                    [*params, query.offset + query.limit],
                ).fetchall()
        except duckdb.Error as exc:
            raise StoreError(f"task query on {self.path} failed: {exc}") from exc
        return int(total), [table.from_tuple(v) for v in fetched]

    async def task_stats(self, since: float, bucket_s: float, buckets: int, failures: int) -> TaskStats:
        """``memory.stats_of`` over every task: DuckDB counts the ones with nothing pending."""
        mine = stats_of(self._pending_task_rows(), since, bucket_s, buckets, failures)  # validates too
        pending_ids = list(self._pending_tasks)
        theirs = await self._db(self._task_stats_sync, since, bucket_s, buckets, failures, pending_ids)
        recent = heapq.nlargest(failures, mine.recent_failures + theirs.recent_failures,
                                key=lambda t: (t.updated_at, t.seq, t.task_id))
        return TaskStats(submitted=[a + b for a, b in zip(mine.submitted, theirs.submitted, strict=True)],
                         finished=[a + b for a, b in zip(mine.finished, theirs.finished, strict=True)],
                         recent_failures=recent)

    def _task_stats_sync(self, since: float, bucket_s: float, buckets: int, failures: int,
                         pending_ids: list[str]) -> TaskStats:
        table = TABLES[TaskRow]
        end = since + bucket_s * (buckets + 1)  # loose: the bucket index decides (memory.bucket_of)

        def spread(col: str, extra: str) -> list[int]:
            out = [0] * buckets
            for b, n in con.execute(
                f"SELECT floor(({col} - ?) / ?)::BIGINT AS b, count(*) FROM tasks "
                f"WHERE {col} >= ? AND {col} < ? AND {extra} AND {NOT_PENDING_SQL} GROUP BY b",
                [since, bucket_s, since, end],
            ).fetchall():
                if 0 <= b < buckets:
                    out[b] += int(n)
            return out

        con = self._conn()
        try:
            with pending_task_ids(con, pending_ids):
                submitted = spread("submitted_at", "TRUE")
                finished = spread("updated_at", TERMINAL_SQL)
                failed = con.execute(
                    f"SELECT {table.column_list} FROM tasks WHERE {FAILED_SQL} AND {NOT_PENDING_SQL} "
                    "ORDER BY updated_at DESC, seq DESC, task_id DESC LIMIT ?", [failures]).fetchall()
        except duckdb.Error as exc:
            raise StoreError(f"task statistics on {self.path} failed: {exc}") from exc
        return TaskStats(submitted=submitted, finished=finished,
                         recent_failures=[table.from_tuple(v) for v in failed])

    async def run_stats(self, run_ids: Sequence[str]) -> dict[str, RunStats]:
        """``Store.run_stats``: DuckDB's for the tasks with nothing pending, with the pending rows'."""
        out = stats_of_runs(self._pending_task_rows(), run_ids)
        stored = await self._db(self._read_sync, "run statistics", run_stats_sync, list(out), list(self._pending_tasks))
        for run_id, state, n, dispatched, updated in stored:
            add_stats(out[run_id], {state: n}, dispatched, updated)
        return out

    async def get_runs(self, run_ids: Sequence[str]) -> dict[str, RunRow]:
        """The stored runs of these ids, the ones appended since the last checkpoint included."""
        found = {i: self._pending_runs[i][1] for i in run_ids if i in self._pending_runs}
        rest = [i for i in dict.fromkeys(run_ids) if i not in found]
        rows = await self._db(self._read_sync, "run lookup", get_runs_sync, rest) if rest else []
        return found | {r.run_id: r for r in rows}

    async def query_runs(self, limit: int, offset: int = 0, submitted_by: str | None = None) -> list[RunRow]:
        """``Store.query_runs``: DuckDB's first runs merged with those not checkpointed yet."""
        page_of_runs([], limit, offset, None)  # the refusal of a negative page, as every store's
        pending = [r for _, r in self._pending_runs.values()]
        stored = await self._db(self._read_sync, "run query", query_runs_sync, limit, offset, submitted_by)
        merged = {r.run_id: r for r in stored} | {r.run_id: r for r in pending}
        return page_of_runs(merged.values(), limit, offset, submitted_by)

    def _read_sync(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(self._conn(), *args)
        except duckdb.Error as exc:
            raise StoreError(f"{what} on {self.path} failed: {exc}") from exc

    # ------------------------------------------------------------------ closing

    async def close(self) -> None:
        """Final checkpoint, then close the journal and the connection. Idempotent.

        If the final checkpoint fails, everything is still released and the error is raised; the
        journal keeps the records and the next ``open`` applies them."""
        if self._state != "open":
            self._state = "closed"
            return
        self._state = "closed"
        self._ckpt_wake.set()
        try:
            if self._checkpointer is not None:
                await asyncio.wait([self._checkpointer])  # a crash was logged by _checkpointer_done
            await self.checkpoint()
        finally:
            await self._release()

    async def _release(self) -> None:
        self._state = "closed"
        try:
            await self._journal.close()
        finally:
            if self._executor is not None:
                try:
                    await self._db(self._close_conn_sync)
                finally:
                    self._executor.shutdown(wait=False)
                    self._executor = None

    def _close_conn_sync(self) -> None:
        con, self._con = self._con, None
        if con is not None:
            con.close()
