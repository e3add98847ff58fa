"""MemoryStore semantics, the ResultQuery predicate, and open_store's URL handling."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from distributed_testing.coordinator.core.rows import KeyRow, MetaRow, ResultRow, TaskRow, WorkerRow
from distributed_testing.coordinator.store import MemoryStore, open_store
from distributed_testing.coordinator.store.base import ResultQuery, TaskQuery
from distributed_testing.coordinator.store.memory import filter_results, filter_tasks, result_matches, stats_of
from distributed_testing.errors import StoreError, ValidationError

pytestmark = pytest.mark.timeout(10)


def task(task_id: str, state: str = "queued", at: float = 1.0) -> TaskRow:
    return TaskRow(task_id, "benchmark", state, 1, 0, at, at, "digest", {"config": {"model": "bert"}})


def result(task_id: str, attempt: int = 1, received_at: float = 10.0, **output: Any) -> ResultRow:
    return ResultRow(task_id, attempt, "w1", "completed", 1.0, 2.0, received_at, output, task_type="benchmark")


BENCH = {
    "model": "bert-base",
    "precision": "fp16",
    "device": "cuda",
    "environment": {"device_name": "NVIDIA H100"},
    "batch_results": [{"batch_size": 1}, {"batch_size": 8}],
}


@pytest.mark.asyncio
async def test_append_completes_on_next_iteration_and_state_survives_reopen() -> None:
    store = MemoryStore()
    assert (await store.open()).tasks == []
    fut = store.append(
        [
            task("t1"),
            task("t1", "running"),
            result("t1"),
            result("t1", received_at=99.0),
            WorkerRow("w1", "box", {"cpu": {}}, ["benchmark"], [], 1.0, 2.0, "idle"),
            KeyRow("k1", "ci", "admin", "h", 1.0),
            MetaRow("jwt", "s"),
        ]
    )
    assert not fut.done()
    await fut
    await store.close()
    snap = await store.open()
    assert [t.state for t in snap.tasks] == ["running"]  # the last upsert wins
    assert [w.worker_id for w in snap.workers] == ["w1"] and [k.key_id for k in snap.keys] == ["k1"]
    assert snap.meta == {"jwt": "s"}
    (row,) = await store.query_results(ResultQuery(task_id="t1"))
    assert row.received_at == 10.0  # a resent result keeps the first one received


@pytest.mark.asyncio
async def test_records_are_copied_and_checked() -> None:
    store = MemoryStore()
    await store.open()
    out = {"model": "a"}
    await store.append([result("t1", **out)])
    out["model"] = "b"
    assert len(await store.query_results(ResultQuery(model="a"))) == 1
    with pytest.raises(StoreError):
        store.append([object()])  # type: ignore[list-item]
    await store.close()
    with pytest.raises(StoreError, match="not open"):
        store.append([task("t2")])


def test_benchmark_filters() -> None:
    r = result("t1", **BENCH)
    assert result_matches(r, ResultQuery(model="bert-base", precision="fp16", batch_size=8))
    assert result_matches(r, ResultQuery(hardware="cuda"))
    assert result_matches(r, ResultQuery(hardware="NVIDIA H100"))
    assert not result_matches(r, ResultQuery(hardware="cpu"))
    assert not result_matches(r, ResultQuery(batch_size=4))
    assert not result_matches(r, ResultQuery(model="bert"))
    odd = result("t2", model=1, batch_results=[{"batch_size": True}, {"batch_size": 4.0}, {"batch_size": "2"}, 3])
    assert not result_matches(odd, ResultQuery(model="1"))
    for n in (1, 2, 3, 4):
        assert not result_matches(odd, ResultQuery(batch_size=n))
    assert not result_matches(result("t3", batch_results={"batch_size": 1}), ResultQuery(batch_size=1))
    assert not result_matches(result("t4", environment=["NVIDIA H100"]), ResultQuery(hardware="NVIDIA H100"))


def test_plain_filters_order_and_paging() -> None:
    rows = [
        result("a", received_at=1.0),
        result("b", received_at=2.0),
        result("c", received_at=2.0),
        result("c", attempt=2, received_at=3.0),
    ]
    assert [(r.task_id, r.attempt) for r in filter_results(rows, ResultQuery())] == [
        ("c", 2),
        ("c", 1),
        ("b", 1),
        ("a", 1),
    ]
    assert [r.task_id for r in filter_results(rows, ResultQuery(since=2.0, until=3.0))] == ["c", "b"]
    assert [r.task_id for r in filter_results(rows, ResultQuery(limit=2, offset=1))] == ["c", "b"]
    assert filter_results(rows, ResultQuery(status="failed")) == []
    assert len(filter_results(rows, ResultQuery(worker_id="w1", task_type="benchmark"))) == 4
    with pytest.raises(ValidationError):
        filter_results(rows, ResultQuery(limit=-1))


def test_open_store_urls(tmp_path: Path) -> None:
    assert isinstance(open_store("memory://"), MemoryStore)
    from distributed_testing.coordinator.store.duckdb import DuckDBStore

    for spec in (tmp_path / "a.duckdb", str(tmp_path / "a.duckdb"), f"duckdb://{tmp_path / 'a.duckdb'}"):
        store = open_store(spec)
        assert isinstance(store, DuckDBStore) and store.path == tmp_path / "a.duckdb"
    assert open_store("duckdb://rel/x.duckdb").path == Path("rel/x.duckdb")  # type: ignore[attr-defined]
    from distributed_testing.coordinator.store.postgres import PostgresStore

    for url in ("postgresql://u@h/db", "postgres://u:secret@h:5433/db?search_path=dt", "postgresql:///db"):
        pg = open_store(url)
        assert isinstance(pg, PostgresStore) and pg.url == url and "secret" not in pg.where
    with pytest.raises(StoreError, match="names no database") as err:
        open_store("postgresql://u:secret@h:5432")
    assert "secret" not in str(err.value)
    with pytest.raises(StoreError, match="unknown store URL scheme .*postgresql://"):
        open_store("mysql://h/db")
    with pytest.raises(StoreError):
        open_store("")


def test_memory_append_outside_loop_needs_a_loop() -> None:
    async def run() -> None:
        store = MemoryStore()
        await store.open()
        await asyncio.gather(*(store.append([task(f"t{i}")]) for i in range(10)))
        await store.close()
        assert len((await store.open()).tasks) == 10

    asyncio.run(run())


def row(task_id: str, state: str, submitted: float, updated: float, seq: int, **kw: Any) -> TaskRow:
    spec = {"requirements": {"tags": kw.pop("tags")}} if "tags" in kw else {}
    return TaskRow(task_id, kw.pop("type", "custom"), state, 1, 0, submitted, updated, "d", spec, seq=seq, **kw)


@pytest.mark.asyncio
async def test_snapshot_holds_active_tasks_only_with_counts_and_max_seq() -> None:
    store = MemoryStore()
    await store.open()
    await store.append(
        [row("a", "succeeded", 1, 2, 1), row("b", "pending", 2, 2, 2), row("c", "failed", 3, 4, 7), row("d", "running", 4, 5, 3)]
    )
    await store.close()
    snap = await store.open()
    assert [t.task_id for t in snap.tasks] == ["b", "d"]  # seq order, terminal ones left in the store
    assert snap.task_counts == {"succeeded": 1, "pending": 1, "failed": 1, "running": 1}
    assert snap.max_seq == 7
    got = await store.get_tasks(["a", "c", "nope"])
    assert sorted(got) == ["a", "c"] and got["a"].state == "succeeded"
    await store.close()
    with pytest.raises(StoreError, match="not open"):
        await store.get_tasks(["a"])
    empty = await MemoryStore().open()
    assert empty.task_counts == {} and empty.max_seq == 0


def test_task_query_filters_order_total_and_paging() -> None:
    rows = [
        row("a", "succeeded", 1.0, 2.0, 1, worker_id="w1", tags=["gpu", "x"]),
        row("b", "failed", 2.0, 3.0, 2, type="test", submitted_by="ci", tags="gpu"),  # not a list: no tags
        row("c", "pending", 2.0, 2.0, 3, submitted_by="ci"),
        row("d", "succeeded", 3.0, 4.0, 4, worker_id="w2", tags=["gpu"]),
    ]
    assert [t.task_id for t in filter_tasks(rows, TaskQuery()).tasks] == ["d", "c", "b", "a"]  # ties by seq
    page = filter_tasks(rows, TaskQuery(limit=2, offset=1))
    assert [t.task_id for t in page.tasks] == ["c", "b"] and page.total == 4
    assert [t.task_id for t in filter_tasks(rows, TaskQuery(tag="gpu")).tasks] == ["d", "a"]
    assert [t.task_id for t in filter_tasks(rows, TaskQuery(state="succeeded", worker_id="w1")).tasks] == ["a"]
    assert [t.task_id for t in filter_tasks(rows, TaskQuery(submitted_by="ci", type="test")).tasks] == ["b"]
    assert [t.task_id for t in filter_tasks(rows, TaskQuery(since=2.0, until=3.0)).tasks] == ["c", "b"]
    assert filter_tasks(rows, TaskQuery(state="running")).total == 0
    with pytest.raises(ValidationError):
        filter_tasks(rows, TaskQuery(offset=-1))


def test_task_stats_buckets_and_failures() -> None:
    rows = [
        row("a", "succeeded", 100.0, 130.0, 1),
        row("b", "failed", 110.0, 170.0, 2),
        row("c", "pending", 165.0, 165.0, 3),
        row("d", "timed_out", 50.0, 179.9, 4),  # submitted before the window
        row("e", "error", 170.0, 180.0, 5),  # finished just past its end
        row("f", "cancelled", 120.0, 125.0, 6),
    ]
    stats = stats_of(rows, since=100.0, bucket_s=40.0, buckets=2, failures=2)
    assert stats.submitted == [3, 2]  # a b f | c e (d before since)
    assert stats.finished == [2, 2]  # a f | b d (e is at the window's end, excluded)
    assert [t.task_id for t in stats.recent_failures] == ["e", "d"]
    with pytest.raises(ValidationError):
        stats_of(rows, since=0.0, bucket_s=0.0, buckets=1, failures=1)
