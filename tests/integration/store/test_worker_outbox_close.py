"""The worker's ``--db-path`` outbox on a clean stop: ``close()`` leaves every record in the DuckDB
file, even when it cancels a background checkpoint that had taken the records and was waiting for
the journal's rotation (its fsync, slow on a loaded machine). Before, those records were dropped
from memory with the cancelled checkpoint and reached the table only at the next start's replay:
a stopped worker's file lacked its last results (a flag test failed so under a full suite's load)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import duckdb
import pytest

from distributed_testing.protocol import messages as m
from distributed_testing.worker.result_store_duckdb import DuckDBResultStore

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]


def rows(db: Path) -> list[tuple[str, int, bool]]:
    with duckdb.connect(str(db), read_only=True) as con:
        return [(str(t), int(a), bool(k)) for t, a, k in con.execute(
            "SELECT task_id, attempt, acked_at IS NOT NULL FROM worker_results ORDER BY task_id").fetchall()]


async def test_close_during_a_checkpoints_rotation_keeps_its_records(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "w.duckdb"
    store = DuckDBResultStore(db)
    await store.open()
    await store.add(m.TaskResult("a", 1, "succeeded", 1.0, 2.0))
    await store.settled([m.TaskResult("b", 1, "succeeded", 1.0, 2.0)])
    journal = store._journal
    rotate, entered = journal.rotate, asyncio.Event()

    async def slow_rotate() -> int:  # the first rotation (the background checkpoint's) is slow
        monkeypatch.setattr(journal, "rotate", rotate)
        entered.set()
        await asyncio.sleep(0.5)
        return await rotate()

    monkeypatch.setattr(journal, "rotate", slow_rotate)
    await asyncio.wait_for(entered.wait(), 5)  # the loop's checkpoint has taken the records
    await store.close()
    assert rows(db) == [("a", 1, False), ("b", 1, True)]
