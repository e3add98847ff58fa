"""A write the store could not make stops the coordinator (``coordinator/supervisor.py``), and so
does a background task that dies: in-process, over real sockets, with a store whose writes fail
on demand (``FailingStore``, a test double of this file). ``tests/e2e/test_fail_hard_process.py``
does the same to a real process on a really full disk.

Before the supervisor, each of these left a running coordinator whose memory was ahead of its
disk: the failed write was one log line, a worker's result was answered ``rejected`` after the
state machine had already taken it, and a dead ticker or checkpointer vanished.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from distributed_testing.coordinator.core.rows import Record
from distributed_testing.coordinator.store.memory import MemoryStore
from distributed_testing.errors import StoreError
from distributed_testing.protocol import messages as m
from distributed_testing.testing import next_message, raw_worker, run_cluster, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
NOOP = {"type": "custom", "config": {"name": "noop"}}


class FailingStore(MemoryStore):
    """A MemoryStore whose appends fail, once ``failing`` is set, the way a journal's do when a
    write or fsync fails: the first append's future fails (nothing of it is kept), and every later
    append raises at once (the journal is failed)."""

    failing = False
    broken = False

    def append(self, records: list[Record], linger_s: float = 0.0) -> asyncio.Future[None]:
        if self.broken:
            raise StoreError("journal failed: [Errno 28] No space left on device")
        if not self.failing:
            return super().append(records, linger_s)
        self.broken = True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fut.set_exception(StoreError("journal write failed: [Errno 28] No space left on device"))
        return fut


async def test_a_submission_whose_write_fails_gets_503_and_stops_the_coordinator(tmp_path: Path) -> None:
    store = FailingStore()
    async with run_cluster(tmp_path, workers=1, store=store) as c:
        done = await c.wait((await c.submit({**NOOP, "task_id": "before"}))[0])
        assert done["state"] == "succeeded"
        store.failing = True
        status, body = await c.request("POST", "/api/v1/tasks", json={**NOOP, "task_id": "lost"})
        assert status == 503, body  # never a success for what is not on disk
        assert body["error"] == "StoreError" and "No space left" in body["message"]
        failure = await asyncio.wait_for(c.runtime.supervisor.failed, 5)
        assert "persisting" in failure.what and "No space left" in str(failure.error)


async def test_a_result_whose_write_fails_is_neither_acked_nor_rejected(tmp_path: Path) -> None:
    store = FailingStore()
    async with run_cluster(tmp_path, workers=0, store=store) as c:
        key = await c.create_key("worker")
        async with raw_worker(c.base_url, key, "hand", autoping=False) as (ws, _):
            await c.submit({**NOOP, "task_id": "t"})
            assign = await next_message(ws, m.AssignTasks)
            ref = assign.tasks[0]
            store.failing = True
            status, _ = await c.request("POST", "/api/v1/tasks", json={**NOOP, "task_id": "lost"})
            assert status == 503
            now = time.time()
            result = m.TaskResult(ref.task_id, ref.attempt, "succeeded", now, now, worker_id="hand")
            await ws.send_bytes(ws._dt_channel.seal(m.Results([result]), now))  # type: ignore[attr-defined]
            replies = []
            while (frame := await ws.receive(timeout=10)).type == aiohttp.WSMsgType.BINARY:
                replies.append(ws._dt_channel.open(frame.data, time.time()))  # type: ignore[attr-defined]
            # The session is closed without an answer the worker would act on: it keeps the result
            # in its outbox and sends it again to the restarted coordinator.
            assert not [r for r in replies if isinstance(r, (m.ResultAck, m.ErrorMsg))], replies
        assert c.runtime.supervisor.failed.done()


async def test_a_background_task_that_dies_stops_the_coordinator(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        def broken_tick() -> None:
            raise RuntimeError("a bug in the ticker")

        monkeypatch.setattr(c.runtime, "tick", broken_tick)
        failure = await asyncio.wait_for(c.runtime.supervisor.failed, 5)
        assert failure.what == "background task coordinator-ticker stopped"
        assert isinstance(failure.error, RuntimeError)


async def test_a_failed_checkpoint_stops_the_coordinator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from distributed_testing.coordinator.store import duckdb as duckdb_store

    def full_disk(self: duckdb_store.DuckDBStore, upto: int, records: object = None) -> None:
        raise StoreError("DuckDB transaction failed: IO Error: No space left on device")

    async with run_cluster(tmp_path, workers=0, db_path=str(tmp_path / "c.duckdb")) as c:
        monkeypatch.setattr(duckdb_store.DuckDBStore, "_apply_sync", full_disk)
        await c.submit({**NOOP, "task_id": "t"})  # gives the checkpointer something to apply
        failure = await asyncio.wait_for(c.runtime.supervisor.failed, 10)
        assert failure.what == "background task store-watch stopped"
        assert "checkpointer stopped" in str(failure.error)
        monkeypatch.undo()  # the final checkpoint at shutdown works again


async def test_ticker_and_store_watch_are_cancelled_quietly_at_shutdown(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=0, db_path=str(tmp_path / "c.duckdb")) as c:
        # the ticker, the store watch and the bundle sweep
        await wait_for(lambda: len(c.runtime.supervisor._tasks) == 3, what="the supervised tasks")
        sup = c.runtime.supervisor
    assert sup.failure is None and not sup._tasks
