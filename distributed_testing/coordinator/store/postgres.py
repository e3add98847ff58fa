"""``PostgresStore``: the store of a coordinator group, on PostgreSQL through asyncpg.

Schema: tables ``tasks``, ``results``, ``workers``, ``api_keys``, ``meta``, ``runs`` mirror the record types
(``pgsql.TABLES``), plus ``schema_version`` and ``dt_lease`` (the HA lease, see below). ``open``
creates or migrates them inside one transaction holding ``pg_advisory_xact_lock(SCHEMA_LOCK)``,
so several coordinators starting at once on an empty database create it exactly once.

Group commit: ``append`` encodes the records at once (so later changes to their dicts do not
matter and a bad record fails there) and queues them; one owned writer task takes everything
queued (up to ``max_batch_records``), keeps the last row per key (the first for results) and
writes it as ONE statement, run in autocommit, so one round trip and one commit per batch: a
data-modifying CTE per table (``INSERT ... SELECT FROM unnest($1::text[], ...) ON CONFLICT``), the
meta deletions, the fence check and the key notification (``pgsql.write_statement``). The futures
complete after that commit. While it runs, new appends queue for the next batch, so throughput
is not capped by commit latency.

Lost connections: a write that fails because the connection broke (the server restarted, the
backend was terminated, the network failed, the statement timed out after ``write_timeout_s``)
is retried on a new connection with backoff (``retry.Backoff``) for up to ``reconnect_s``; only
then do the batch's futures fail with ``StoreError`` and the writer stop (``watch`` raises, the
coordinator exits). Retrying is safe because every write is idempotent (an upsert to the same
values, a result insert that keeps the first row), so a batch whose commit happened but whose
answer was lost is simply applied again. Before the retry, the previous writer backend is
terminated and awaited if it still exists (same pid and start time), so a statement stuck on a
half-dead connection can never commit after a later batch. Any other database error fails the
batch and stops the writer at once: the coordinator's memory already holds what those records
said, so carrying on would let memory and database drift (the same rule as the DuckDB store).

Fencing (for the HA group): while ``set_fence(holder, epoch)`` is in force, each batch first
locks ``dt_lease`` row ``leader`` ``FOR SHARE`` and checks holder, epoch and ``expires_at >
clock_timestamp()``; if that fails the statement writes nothing and the batch fails with
:class:`~distributed_testing.errors.Fenced` (the writer keeps running: the owner decides what to
do next). The share lock is held until the commit, so a takeover's ``UPDATE`` of the lease waits
for it: a write either commits before the lease changes hands or not at all.

Keys: a batch holding ``KeyRow`` records also sends ``NOTIFY dt_keys, '<key_id,...>'`` (empty
payload: reload everything) in the same transaction; ``listen`` delivers such notifications to a
callback, and ``load_keys`` reads the keys again.

Reads use a small pool; a read that meets a broken connection is tried again on another.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import msgspec

from ...errors import Fenced, StoreError
from ...process.aio import wake_within
from ...retry import Backoff, retry_async
from ..core.rows import KeyRow, MetaRow, Record, ResultRow, RunRow, Snapshot, TaskRow, WorkerRow
from ..core.runs import RunStats
from . import postgres_reads as reads
from .base import SCHEMA_VERSION, ResultQuery, TaskPage, TaskQuery, TaskStats, stored_schema_version
from .pgmigrate import MIGRATIONS
from .pgsql import (
    ACTIVE_SQL,
    KEYS_CHANNEL,
    TABLES,
    batch_statement,
    schema_ddl,
)

log = logging.getLogger(__name__)

SCHEMA_LOCK = 0x64745F736368656D  # pg_advisory_xact_lock key of schema creation/migration ("dt_schem")

# Errors after which the connection is no good but the server may be back soon: retried.
RETRYABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,  # class 08 (connection exceptions)
    asyncpg.InterfaceError,  # "connection is closed", the connection was lost mid-query
    # A query on a connection whose idle backend was just terminated: the server's FATAL arrived
    # unasked and left asyncpg's protocol in a state it refuses to leave; nothing was sent.
    asyncpg.InternalClientError,
    asyncpg.exceptions.AdminShutdownError,  # 57P01: pg_terminate_backend, a fast shutdown
    asyncpg.exceptions.CrashShutdownError,  # 57P02
    asyncpg.exceptions.CannotConnectNowError,  # 57P03: the server is starting up
    asyncpg.exceptions.TooManyConnectionsError,  # 53300
    asyncpg.exceptions.ReadOnlySQLTransactionError,  # 25006: connected to a standby after a failover
)
CONNECT_ERRORS: tuple[type[BaseException], ...] = (asyncpg.PostgresError, *RETRYABLE)

_DECODE = {t: table.decoder() for t, table in TABLES.items()}
_ENCODE = {t: table.encoder() for t, table in TABLES.items()}


def redact(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


class _Pending:
    """One ``append`` call waiting for the writer: its encoded rows and its future."""

    __slots__ = ("fut", "rows")

    def __init__(self, rows: list[tuple[type[Any], tuple[Any, ...]]], fut: asyncio.Future[None]) -> None:
        self.rows = rows
        self.fut = fut


def _resolve(fut: asyncio.Future[None], exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)


class PostgresStore:
    """Store on a PostgreSQL database (see the module docstring).

    ``url``: ``postgresql://user[:password]@host[:port]/database[?param=value]``; query
    parameters other than libpq's connection ones become server settings (``?search_path=dt``).
    Beyond the ``Store`` protocol: ``set_fence``/``clear_fence``, ``listen``, ``load_keys``,
    ``connect`` and ``pool`` (for the HA code, which uses the same URL and options).
    """

    KEYS_CHANNEL = KEYS_CHANNEL  # notifications of key changes (``listen``)

    def __init__(self, url: str, *, pool_size: int = 4, reconnect_s: float = 30.0, write_timeout_s: float = 30.0,
                 connect_timeout_s: float = 10.0, max_batch_records: int = 20000) -> None:
        if pool_size < 1 or max_batch_records < 1:
            raise ValueError("pool_size and max_batch_records must be at least 1")
        if min(reconnect_s, write_timeout_s, connect_timeout_s) <= 0:
            raise ValueError("reconnect_s, write_timeout_s and connect_timeout_s must be positive")
        self.url = url
        self.where = redact(url)
        self.pool_size = pool_size
        self.reconnect_s = reconnect_s
        self.write_timeout_s = write_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_batch_records = max_batch_records
        # at most 0.5 s between attempts: a server back from a restart is used soon after
        self.backoff = Backoff(base_s=0.05, factor=2.0, max_s=0.5)
        self._pool: asyncpg.Pool | None = None
        self._conn: asyncpg.Connection | None = None  # the writer's own connection
        self._conn_id: tuple[int, Any] | None = None  # its backend (pid, backend_start)
        self._stale: tuple[int, Any] | None = None  # a lost writer backend that may still run
        self._fence: tuple[str, int] | None = None
        self._queue: list[_Pending] = []
        self._wake = asyncio.Event()
        self._linger: asyncio.TimerHandle | None = None
        self._writer: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        # the last Fenced answer under the current fence: once closing, the batches still queued get
        # the same without a round trip, so a demoted leader's close does not retry them against a
        # database it may no longer reach (up to reconnect_s a batch) before it can rejoin
        self._fenced_out: Fenced | None = None
        self._state = "new"  # new -> open -> closing -> closed
        self.batch_count = 0  # committed batches (one statement each)
        self.record_count = 0  # rows they carried, after deduplication

    # ------------------------------------------------------------------ connections

    @property
    def pool(self) -> asyncpg.Pool:
        """The read pool (open stores only)."""
        if self._pool is None:
            raise StoreError(f"store {self.where} is not open")
        return self._pool

    async def connect(self) -> asyncpg.Connection:
        """A new connection to the store's database with the store's options; the caller closes it."""
        try:
            return await asyncpg.connect(self.url, timeout=self.connect_timeout_s)
        except CONNECT_ERRORS as exc:
            raise StoreError(f"cannot connect to PostgreSQL at {self.where}: {exc}") from exc

    async def _read(self, what: str, fn: Callable[[asyncpg.Connection], Any]) -> Any:
        """Run ``fn`` on a pooled connection; one broken by a server restart is replaced."""
        pool = self.pool

        async def once() -> Any:
            async with pool.acquire() as con:
                return await fn(con)

        try:
            return await retry_async(once, backoff=self.backoff, attempts=3, retry_on=RETRYABLE, what=what)
        except StoreError:
            raise
        except Exception as exc:  # a database error, or the retries ran out (RetriesExhausted)
            raise StoreError(f"{what} on {self.where} failed: {exc}") from exc

    # ------------------------------------------------------------------ open

    async def open(self) -> Snapshot:
        """Connect, create or migrate the schema, load the snapshot, start the writer. Raises
        ``StoreError`` (naming the server, never its password) when any of it fails."""
        if self._state != "new":
            raise StoreError(f"store {self.where} was already opened")
        self._state = "open"
        try:
            con = await self.connect()
            try:
                await self._ensure_schema(con)
                snapshot = await self._load_snapshot(con)
            finally:
                await con.close()
            # min_size 0: connections on demand (a pool keeping a floor logs a traceback for every
            # failed attempt to restore it while the server is down)
            self._pool = await asyncpg.create_pool(self.url, min_size=0, max_size=self.pool_size,
                                                   timeout=self.connect_timeout_s)
        except BaseException as exc:
            await self._release()
            if isinstance(exc, CONNECT_ERRORS):
                raise StoreError(f"opening the store at {self.where} failed: {exc}") from exc
            raise
        self._writer = asyncio.get_running_loop().create_task(self._write_loop(), name=f"pg-writer:{self.where}")
        self._writer.add_done_callback(self._writer_done)
        log.info("opened store %s: %d active tasks, %d workers, %d keys", self.where, len(snapshot.tasks),
                 len(snapshot.workers), len(snapshot.keys))
        return snapshot

    async def _ensure_schema(self, con: asyncpg.Connection) -> None:
        async with con.transaction():
            await con.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK)
            if not await con.fetchval("SELECT to_regclass('schema_version') IS NOT NULL"):
                for ddl in schema_ddl():
                    await con.execute(ddl)
                await con.execute("INSERT INTO schema_version VALUES ($1)", SCHEMA_VERSION)
                log.info("created the schema (version %d) in %s", SCHEMA_VERSION, self.where)
                return
            version = stored_schema_version(await con.fetch("SELECT version FROM schema_version"), self.where)
            while version < SCHEMA_VERSION:
                migrate = MIGRATIONS.get(version)
                if migrate is None:
                    raise StoreError(f"{self.where}: no migration from schema version {version} to {version + 1}")
                await migrate(con)
                version += 1
                await con.execute("UPDATE schema_version SET version = $1", version)
                log.info("migrated %s to schema version %d", self.where, version)
            await self._check_columns(con)

    async def _check_columns(self, con: asyncpg.Connection) -> None:
        """Refuse tables that differ from the record types at the same schema version."""
        for table in TABLES.values():
            found = [r[0] for r in await con.fetch(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
                "AND table_name = $1 ORDER BY ordinal_position", table.name)]
            expected = [c.name for c in table.columns]
            if found != expected:
                raise StoreError(
                    f"{self.where}: table {table.name} has columns {found}, schema version "
                    f"{SCHEMA_VERSION} expects {expected}; bump SCHEMA_VERSION and add a migration")

    async def _load_snapshot(self, con: asyncpg.Connection) -> Snapshot:
        async with con.transaction(isolation="repeatable_read", readonly=True):  # one consistent view

            async def rows(row_type: type[Any], where: str, order: str) -> list[Any]:
                t = TABLES[row_type]
                fetched = await con.fetch(f"SELECT {t.column_list} FROM {t.name} WHERE {where} ORDER BY {order}")
                decode = _DECODE[row_type]
                return [decode(r) for r in fetched]

            tasks = await rows(TaskRow, ACTIVE_SQL, "seq, submitted_at, task_id")
            workers = await rows(WorkerRow, "TRUE", "worker_id")
            keys = await rows(KeyRow, "TRUE", "key_id")
            meta = {m.key: m.value for m in await rows(MetaRow, "TRUE", "key")}
            counts = await con.fetch("SELECT state, count(*), max(seq) FROM tasks GROUP BY state")
        return Snapshot(tasks=tasks, workers=workers, keys=keys, meta=meta,
                        task_counts={r[0]: int(r[1]) for r in counts},
                        max_seq=max((int(r[2]) for r in counts), default=0))

    async def snapshot(self) -> Snapshot:
        """The snapshot as committed now, of an open store: what a group member loads when it
        takes over (the old leader can commit nothing more once the lease changed hands)."""
        snapshot: Snapshot = await self._read("loading the snapshot", self._load_snapshot)
        return snapshot

    # ------------------------------------------------------------------ fencing

    def set_fence(self, holder: str, epoch: int) -> None:
        """From the next batch on, write only while ``dt_lease`` row ``leader`` has this holder and
        epoch and has not expired; otherwise the batch fails with ``Fenced`` and writes nothing."""
        self._fence = (holder, int(epoch))
        self._fenced_out = None

    def clear_fence(self) -> None:
        """Write without a lease check again (a single coordinator)."""
        self._fence = None
        self._fenced_out = None

    @property
    def fence(self) -> tuple[str, int] | None:
        return self._fence

    # ------------------------------------------------------------------ writing

    def append(self, records: list[Record], linger_s: float = 0.0) -> asyncio.Future[None]:
        """Queue ``records``; the future completes once the batch holding them is committed. With
        ``linger_s`` > 0 the batch may wait that long for more records (any other append, or
        ``close``, starts it sooner). Raises ``StoreError`` for an unknown or unencodable record
        and when the store is not open or its writer stopped."""
        if self._state != "open":
            raise StoreError(f"store {self.where} is not open")
        if self._failure is not None or (self._writer is not None and self._writer.done()):
            raise StoreError(f"store {self.where}: the writer stopped ({self._failure}); see the log")
        rows: list[tuple[type[Any], tuple[Any, ...]]] = []
        for rec in records:
            encode = _ENCODE.get(type(rec))
            if encode is None:
                raise StoreError(f"unknown store record {type(rec).__name__}")
            try:
                rows.append((type(rec), encode(rec)))
            except (TypeError, ValueError, OverflowError, AttributeError, msgspec.MsgspecError) as exc:
                raise StoreError(f"invalid store record {type(rec).__name__}: {exc}") from exc
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(rows, fut))
        self._linger = wake_within(self._wake, self._linger, linger_s)
        return fut

    def _take(self) -> list[_Pending]:
        """Whole appends, in order, up to ``max_batch_records`` rows (at least one append)."""
        n = taken = 0
        for p in self._queue:
            if taken and n + len(p.rows) > self.max_batch_records:
                break
            n += len(p.rows)
            taken += 1
        batch, self._queue = self._queue[:taken], self._queue[taken:]
        return batch

    async def _write_loop(self) -> None:
        """Owned background task: one batch at a time, in append order (see the module doc);
        after ``close`` it writes what is queued, then ends."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._linger is not None:
                self._linger.cancel()
                self._linger = None
            while self._queue:  # appends made while a batch commits go in the next one
                await self._write_batch(self._take())
            if self._state != "open":
                return

    async def _write_batch(self, batch: list[_Pending]) -> None:
        try:
            if self._fenced_out is not None and self._state != "open":
                raise self._fenced_out
            await self._write([row for p in batch for row in p.rows])
        except Fenced as exc:
            self._fenced_out = exc
            for p in batch:
                _resolve(p.fut, exc)
            return
        except BaseException as exc:
            err = exc if isinstance(exc, StoreError) else StoreError(f"writing to {self.where} failed: {exc!r}")
            if err is not exc:
                err.__cause__ = exc
            self._failure = err
            for p in batch + self._queue:
                _resolve(p.fut, err)
            self._queue = []
            raise
        for p in batch:
            _resolve(p.fut, None)

    def _writer_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("the writer of %s stopped: %s; appends are refused", self.where, task.exception())

    async def _write(self, rows: list[tuple[type[Any], tuple[Any, ...]]]) -> None:
        sql, args = batch_statement(rows, self._fence)

        last: list[BaseException] = []

        async def attempt() -> Any:
            try:
                con = await self._writer_connection()
                return await con.fetchval(sql, *args, timeout=self.write_timeout_s)
            except RETRYABLE as exc:
                last[:] = [exc]
                self._drop_writer_connection()
                raise

        try:
            async with asyncio.timeout(self.reconnect_s):
                ok = await retry_async(attempt, backoff=self.backoff, attempts=None, retry_on=RETRYABLE,
                                       what=f"writing {len(rows)} records to {self.where}")
        except TimeoutError as exc:
            self._drop_writer_connection()
            cause = last[0] if last else exc
            raise StoreError(f"could not write to {self.where} for {self.reconnect_s:g} s "
                             f"(connection lost, not back in time): {cause!r}") from cause
        except asyncpg.PostgresError as exc:
            raise StoreError(f"writing {len(rows)} records to {self.where} failed: {exc}") from exc
        if not ok:
            holder, epoch = self._fence or ("?", 0)
            raise Fenced(f"{self.where}: the lease is no longer held by {holder!r} at epoch {epoch}; "
                         f"{len(rows)} records were not written")
        self.batch_count += 1
        self.record_count += len(rows)

    async def _writer_connection(self) -> asyncpg.Connection:
        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        con = await asyncpg.connect(self.url, timeout=self.connect_timeout_s)
        try:
            if self._stale is not None:
                await self._end_stale(con, *self._stale)
                self._stale = None
            row = await con.fetchrow(
                "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()")
        except BaseException:
            con.terminate()
            raise
        self._conn = con
        self._conn_id = (int(row[0]), row[1]) if row else None
        return con

    async def _end_stale(self, con: asyncpg.Connection, pid: int, started: Any) -> None:
        """Terminate the lost writer backend if it still runs, and wait until it is gone: a
        statement it still holds must not commit after the batches that follow."""
        find = "SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2"
        if await con.fetchval(find, pid, started):
            log.warning("terminating the previous writer backend %d of %s", pid, self.where)
            await con.fetchval("SELECT pg_terminate_backend($1)", pid)
            while await con.fetchval(find, pid, started):
                await asyncio.sleep(0.02)

    def _drop_writer_connection(self) -> None:
        con, self._conn = self._conn, None
        if self._conn_id is not None:
            self._stale = self._conn_id
            self._conn_id = None
        if con is not None:
            con.terminate()

    async def watch(self) -> None:
        """Raise ``StoreError`` once the writer stops while the store is open (a failed write,
        or a connection not back within ``reconnect_s``); return once the store is closed."""
        if self._writer is None:
            raise StoreError(f"store {self.where} is not open")
        await asyncio.wait([self._writer])
        if self._failure is not None:
            raise StoreError(f"store {self.where}: the writer stopped: {self._failure}") from self._failure
        if self._state == "open":
            raise StoreError(f"store {self.where}: the writer stopped")

    # ------------------------------------------------------------------ keys

    async def load_keys(self) -> list[KeyRow]:
        """Every stored API key, by key id (what a notification on ``dt_keys`` asks to reload)."""
        t = TABLES[KeyRow]

        async def fetch(con: asyncpg.Connection) -> list[KeyRow]:
            return [_DECODE[KeyRow](r) for r in await con.fetch(f"SELECT {t.column_list} FROM api_keys ORDER BY key_id")]

        keys: list[KeyRow] = await self._read("loading keys", fetch)
        return keys

    async def listen(self, channel: str, callback: Callable[[str], None], *, check_s: float = 5.0) -> None:
        """Call ``callback(payload)`` for every notification on ``channel`` until cancelled.

        A dedicated connection LISTENs; whenever it (re)starts listening, ``callback("")`` is
        called once, since notifications sent while it was not listening are lost ("" means
        "reload everything"). A broken connection is noticed at once (or within ``check_s``, by a
        ``SELECT 1``) and replaced; ``StoreError`` once it cannot be for ``reconnect_s``.
        ``channel`` is the store's ``dt_keys`` for key changes."""
        if not channel.isidentifier():
            raise StoreError(f"invalid channel name {channel!r}")

        def deliver(_con: Any, _pid: int, _channel: str, payload: str) -> None:
            callback(payload)

        while True:
            con = await self._listen_connection(channel, deliver)
            lost = asyncio.Event()
            con.add_termination_listener(lambda _c, ev=lost: ev.set())
            try:
                callback("")
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(check_s):
                            await lost.wait()
                    if not lost.is_set():
                        await con.fetchval("SELECT 1", timeout=check_s)
            except RETRYABLE as exc:
                log.warning("listening on %s at %s: connection lost (%s); reconnecting", channel, self.where, exc)
            finally:
                con.terminate()

    async def _listen_connection(self, channel: str, deliver: Callable[..., None]) -> asyncpg.Connection:
        async def connect() -> asyncpg.Connection:
            con = await asyncpg.connect(self.url, timeout=self.connect_timeout_s)
            try:
                await con.add_listener(channel, deliver)
            except BaseException:
                con.terminate()
                raise
            return con

        try:
            async with asyncio.timeout(self.reconnect_s):
                con: asyncpg.Connection = await retry_async(
                    connect, backoff=self.backoff, attempts=None, retry_on=RETRYABLE,
                    what=f"listening on {channel} at {self.where}")
                return con
        except TimeoutError as exc:
            raise StoreError(f"cannot listen on {channel} at {self.where}: no connection for "
                             f"{self.reconnect_s:g} s") from exc
        except asyncpg.PostgresError as exc:
            raise StoreError(f"cannot listen on {channel} at {self.where}: {exc}") from exc

    # ------------------------------------------------------------------ reading

    async def query_results(self, query: ResultQuery) -> list[ResultRow]:
        """Results matching every filter of ``query`` (``filters``), newest first."""
        return await reads.query_results(self._read, query)

    async def get_tasks(self, task_ids: Sequence[str]) -> dict[str, TaskRow]:
        if not task_ids:
            self.pool  # noqa: B018  (raises when not open, like every read)
            return {}
        return await reads.get_tasks(self._read, task_ids)

    async def query_tasks(self, query: TaskQuery) -> TaskPage:
        return await reads.query_tasks(self._read, query)

    async def task_stats(self, since: float, bucket_s: float, buckets: int, failures: int) -> TaskStats:
        return await reads.task_stats(self._read, since, bucket_s, buckets, failures)

    async def get_runs(self, run_ids: Sequence[str]) -> dict[str, RunRow]:
        return await reads.get_runs(self._read, run_ids)

    async def run_stats(self, run_ids: Sequence[str]) -> dict[str, RunStats]:
        return await reads.run_stats(self._read, run_ids)

    async def query_runs(self, limit: int, offset: int = 0, submitted_by: str | None = None) -> list[RunRow]:
        return await reads.query_runs(self._read, limit, offset, submitted_by)

    # ------------------------------------------------------------------ closing

    async def close(self) -> None:
        """Write everything appended so far, stop the writer, close the connections. Idempotent.
        Raises ``StoreError`` if the writer had failed (those records were not written)."""
        if self._state in ("new", "closed"):
            self._state = "closed"
            return
        if self._state == "closing":
            return
        self._state = "closing"
        self._wake.set()
        try:
            if self._writer is not None:
                await asyncio.wait([self._writer])
        finally:
            await self._release()
        if self._failure is not None:
            raise StoreError(f"store {self.where}: the writer had failed: {self._failure}") from self._failure

    async def _release(self) -> None:
        self._state = "closed"
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        con, self._conn = self._conn, None
        if con is not None:
            try:
                async with asyncio.timeout(5):
                    await con.close()
            except RETRYABLE:  # a lost connection has nothing left to close cleanly
                con.terminate()
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                async with asyncio.timeout(5):
                    await pool.close()
            except RETRYABLE:
                pool.terminate()

