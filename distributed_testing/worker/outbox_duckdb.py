"""The worker's durable outbox (``--db-path`` / DT_DB_PATH).

A result is appended to a journal beside the DuckDB file (fsync'd, group-committed) before it is
sent. Acknowledgements are journalled too. A background checkpoint moves both into the DuckDB
table ``worker_results`` in bulk (acknowledged rows get ``acked_at``), so the file is a queryable
history of everything this worker ran. On start the journal is replayed: results without an ack
are sent again after registration.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import pyarrow as pa

from ..journal import Journal
from ..protocol import messages as m

log = logging.getLogger(__name__)
CHECKPOINT_S = 1.0


class OutResult(msgspec.Struct, tag="result", tag_field="rec", frozen=True):
    result: m.TaskResult
    at: float


class OutAck(msgspec.Struct, tag="ack", tag_field="rec", frozen=True):
    task_id: str
    attempt: int
    at: float


OutRecord = OutResult | OutAck

_DDL = """
CREATE TABLE IF NOT EXISTS worker_results (
    task_id VARCHAR, attempt INTEGER, status VARCHAR, started_at DOUBLE, finished_at DOUBLE,
    error VARCHAR, output VARCHAR, created_at DOUBLE, acked_at DOUBLE, PRIMARY KEY (task_id, attempt))
"""


class DuckDBOutbox:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._journal: Journal[OutRecord] = Journal(path.parent / f"{path.name}.journal", OutRecord, name="outbox")
        self._pending: dict[tuple[str, int], m.TaskResult] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox-duckdb")
        self._con: duckdb.DuckDBPyConnection | None = None
        self._checkpointer: asyncio.Task[None] | None = None
        self._unapplied: list[OutRecord] = []  # journalled since the last checkpoint's rotation

    async def _db(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
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
        con = duckdb.connect(str(self.path), config={"threads": 1})  # bulk inserts gain nothing from more
        con.execute(_DDL)
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
        fut = self._journal.append([rec])
        self._unapplied.append(rec)
        self._pending[(result.task_id, result.attempt)] = result
        return fut

    def ack(self, refs: list[m.TaskRef]) -> None:
        now = time.time()
        acks = [OutAck(r.task_id, r.attempt, now) for r in refs if self._pending.pop((r.task_id, r.attempt), None)]
        if acks:
            self._journal.append(list(acks)).add_done_callback(_log_failure)
            self._unapplied.extend(acks)

    async def unacked(self) -> list[m.TaskResult]:
        return list(self._pending.values())

    async def checkpoint(self) -> None:
        """Move everything journalled so far into DuckDB in one transaction, then drop those
        segments. On failure the segments stay and are replayed at the next start."""
        records, self._unapplied = self._unapplied, []
        upto = await self._journal.rotate()
        if records:
            await self._db(self._apply, records)
        await asyncio.to_thread(self._journal.drop_segments, upto)

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(CHECKPOINT_S)
            try:
                await self.checkpoint()
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
        con.execute("BEGIN")
        try:
            con.register("new_rows", new)
            con.register("ack_rows", ack_tbl)
            con.execute("INSERT OR IGNORE INTO worker_results SELECT * FROM new_rows")
            con.execute("UPDATE worker_results SET acked_at = a.at FROM ack_rows a "
                        "WHERE worker_results.task_id = a.task_id AND worker_results.attempt = a.attempt "
                        "AND worker_results.acked_at IS NULL")
            con.execute("COMMIT")
        except duckdb.Error:
            con.execute("ROLLBACK")
            raise
        finally:
            con.unregister("new_rows")
            con.unregister("ack_rows")

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


def _log_failure(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.error("journalling an acknowledgement failed: %s", fut.exception())
