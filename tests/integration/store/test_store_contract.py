"""The Store contract (``store/base.py``), the same tests on every backend: memory, DuckDB (on a
file, checkpoints only when a test settles it, so the merge of pending rows with DuckDB's is what
answers) and PostgreSQL (the real server, a fresh schema per test).

``Backend.reopen()`` gives a new store object on the same storage (memory: the same object, whose
state survives close/open); ``Backend.settle()`` moves what was appended into the backend's
durable tables (a DuckDB checkpoint; nothing to do elsewhere), so a test can leave part of its
data on each side of that line.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from distributed_testing.coordinator.core.rows import (
    FORGOTTEN,
    KeyRow,
    MetaRow,
    ResultRow,
    RunRow,
    Snapshot,
    TaskRow,
    WorkerRow,
)
from distributed_testing.coordinator.core.runs import RunStats, stats_of_runs
from distributed_testing.coordinator.store.base import ResultQuery, Store, TaskQuery
from distributed_testing.coordinator.store.duckdb import DuckDBStore
from distributed_testing.coordinator.store.memory import MemoryStore, filter_tasks, stats_of
from distributed_testing.coordinator.store.postgres import PostgresStore
from distributed_testing.errors import StoreError, ValidationError

pytestmark = pytest.mark.timeout(60)

BACKENDS = ["memory", "duckdb", "postgresql"]


@dataclass
class Backend:
    name: str
    make: Callable[[], Store]
    store: Store = field(init=False)

    def __post_init__(self) -> None:
        self.store = self.make()

    async def reopen(self) -> Snapshot:
        await self.store.close()
        self.store = self.make()
        return await self.store.open()

    async def settle(self) -> None:
        if isinstance(self.store, DuckDBStore):
            await self.store.checkpoint()


@pytest_asyncio.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "memory":
        mem = MemoryStore()
        b = Backend("memory", lambda: mem)
    elif request.param == "duckdb":
        b = Backend("duckdb", lambda: DuckDBStore(tmp_path / "s.duckdb", checkpoint_interval_s=60.0))
    else:
        url = request.getfixturevalue("pg_url")
        b = Backend("postgresql", lambda: PostgresStore(url))
    await b.store.open()
    try:
        yield b
    finally:
        await b.store.close()


def task(task_id: str, state: str = "pending", at: float = 1.0, seq: int = 1, **kw: Any) -> TaskRow:
    spec = kw.pop("spec", {"type": "custom", "config": {"name": "noop"}, "requirements": {"tags": ["gpu"]}})
    return TaskRow(task_id, kw.pop("type", "custom"), state, kw.pop("attempt", 1), 0, at, kw.pop("updated_at", at),
                   "sha256:x", spec, seq=seq, **kw)


def result(task_id: str, attempt: int = 1, received_at: float = 10.0, status: str = "completed",
           **output: Any) -> ResultRow:
    return ResultRow(task_id, attempt, "w1", status, 1.0, 2.0, received_at, output, task_type="custom")


WORKER = WorkerRow("w1", "box", {"memory_gb": 8.0, "cuda": {"devices": [{"name": "H100"}]}}, ["custom"], ["gpu"],
                   1.0, 2.0, "ready", key_id="k1")
KEY = KeyRow("k1", "ci", "admin", "argon2:abc", 1.0, expires_at=5.0, revoked_at=None)


# ---------------------------------------------------------------------------- writes


@pytest.mark.asyncio
async def test_upserts_keep_the_last_row_results_the_first_and_empty_meta_deletes(backend: Backend) -> None:
    s = backend.store
    # within one append
    await s.append([task("t1"), result("t1", received_at=10.0), task("t1", "running", seq=1),
                    MetaRow("a", "1"), MetaRow("a", "2"), MetaRow("b", "x"), MetaRow("b", "")])
    await backend.settle()
    # across appends, and across the settled line
    await s.append([result("t1", received_at=11.0, status="failed", model="other"), task("t1", "succeeded"),
                    WORKER, KEY, MetaRow("c", "3")])
    await s.append([KeyRow("k1", "ci", "admin", "argon2:abc", 1.0, expires_at=5.0, revoked_at=9.0),
                    WorkerRow("w1", "box", {}, [], [], 1.0, 3.0, "disconnected"), MetaRow("c", "")])
    assert (await s.get_tasks(["t1"]))["t1"].state == "succeeded"
    (r,) = await s.query_results(ResultQuery(task_id="t1"))
    assert (r.received_at, r.status, r.output) == (10.0, "completed", {})
    snap = await backend.reopen()
    assert snap.meta == {"a": "2"}
    assert snap.keys == [KeyRow("k1", "ci", "admin", "argon2:abc", 1.0, expires_at=5.0, revoked_at=9.0)]
    assert snap.workers == [WorkerRow("w1", "box", {}, [], [], 1.0, 3.0, "disconnected")]
    assert snap.tasks == [] and snap.task_counts == {"succeeded": 1}


@pytest.mark.asyncio
async def test_a_forgotten_worker_record_deletes_its_row(backend: Backend) -> None:
    """--worker-retention: the FORGOTTEN record deletes the row, before or after the row settled,
    within one append, and a worker that registers the id again afterwards is kept."""
    s = backend.store
    other = WorkerRow("w2", "box2", {}, [], [], 1.0, 2.0, "ready")
    await s.append([WORKER, other, WorkerRow("w3", "box3", {}, [], [], 1.0, 2.0, "disconnected")])
    await backend.settle()
    await s.append([WorkerRow("w1", "box", {}, [], [], 1.0, 3.0, FORGOTTEN),
                    WorkerRow("w3", "box3", {}, [], [], 1.0, 2.0, FORGOTTEN),
                    WorkerRow("w3", "box3", {}, [], [], 1.0, 9.0, "ready")])  # back in the same batch: kept
    await s.append([WorkerRow("w4", "box4", {}, [], [], 1.0, 2.0, "ready")])
    await s.append([WorkerRow("w4", "box4", {}, [], [], 1.0, 2.0, FORGOTTEN)])  # before it settled
    await backend.settle()
    snap = await backend.reopen()
    assert [(w.worker_id, w.last_seen) for w in snap.workers] == [("w2", 2.0), ("w3", 9.0)]


@pytest.mark.asyncio
async def test_everything_survives_close_and_reopen(backend: Backend) -> None:
    done = task("t1", "succeeded", seq=1, worker_id="w1", history=[{"at": 1.0, "to": "pending", "cause": "submitted"}],
                outcome={"status": "completed", "attempt": 1}, submitted_by="k1")
    running = task("t2", "running", at=2.0, seq=2, worker_id="w1", retries_used=1, not_before=3.5, reason="retry")
    bench = result("t1", model="bert", batch_results=[{"batch_size": 4, "latency_ms": 1e16}], unicode="ünï ✓")
    await asyncio.gather(backend.store.append([done, running, WORKER]),
                         backend.store.append([KEY, MetaRow("jwt_secret", "ab")]),
                         backend.store.append([bench]))
    await backend.store.close()
    await backend.store.close()  # idempotent
    with pytest.raises(StoreError, match="not open"):
        backend.store.append([task("t3")])
    backend.store = backend.make()
    snap = await backend.store.open()
    assert snap.tasks == [running] and snap.workers == [WORKER] and snap.keys == [KEY]
    assert snap.meta == {"jwt_secret": "ab"}
    assert snap.task_counts == {"succeeded": 1, "running": 1} and snap.max_seq == 2
    assert await backend.store.get_tasks(["t1", "t2"]) == {"t1": done, "t2": running}
    (got,) = await backend.store.query_results(ResultQuery())
    assert got == bench and isinstance(got.output["batch_results"][0]["latency_ms"], float)


@pytest.mark.asyncio
async def test_records_are_taken_at_append_and_checked(backend: Backend) -> None:
    out = {"model": "a"}
    fut = backend.store.append([result("t1", **out)])
    out["model"] = "b"
    await fut
    assert len(await backend.store.query_results(ResultQuery(model="a"))) == 1
    with pytest.raises(StoreError):
        backend.store.append([object()])  # type: ignore[list-item]


# ---------------------------------------------------------------------------- the snapshot


@pytest.mark.asyncio
async def test_snapshot_holds_active_tasks_in_seq_order_with_counts_and_max_seq(backend: Backend) -> None:
    states = ["pending", "succeeded", "assigned", "failed", "running", "timed_out", "error", "cancelled", "pending"]
    rows = [task(f"t{i}", s, at=float(10 - i), seq=20 - i) for i, s in enumerate(states)]
    await backend.store.append(rows[:4])
    await backend.settle()
    await backend.store.append(rows[4:])
    await backend.store.append([task("t0", "succeeded", at=10.0, seq=20)])  # finishes after the settle
    snap = await backend.reopen()
    assert [t.task_id for t in snap.tasks] == ["t8", "t4", "t2"]
    assert snap.task_counts == {"pending": 1, "succeeded": 2, "assigned": 1, "failed": 1, "running": 1,
                                "timed_out": 1, "error": 1, "cancelled": 1}
    assert snap.max_seq == 20


@pytest.mark.asyncio
async def test_an_empty_store_has_an_empty_snapshot(backend: Backend) -> None:
    snap = await backend.reopen()
    assert (snap.tasks, snap.workers, snap.keys, snap.meta, snap.task_counts, snap.max_seq) == ([], [], [], {}, {}, 0)


# ---------------------------------------------------------------------------- reading tasks


@pytest.mark.asyncio
async def test_get_tasks_returns_the_latest_rows_of_stored_ids(backend: Backend) -> None:
    await backend.store.append([task("a"), task("b", seq=2)])
    await backend.settle()
    await backend.store.append([task("b", "running", seq=2), task("c", seq=3)])
    got = await backend.store.get_tasks(["a", "b", "c", "nope", "a"])
    assert {k: v.state for k, v in got.items()} == {"a": "pending", "b": "running", "c": "pending"}
    assert await backend.store.get_tasks([]) == {}


def _tasks() -> list[TaskRow]:
    """Twelve tasks with every filterable field varied; submitted_at ties broken by seq."""
    out = []
    for i in range(12):
        tags: Any = [["gpu", "a100"], ["cpu"], [], "gpu", ["x", 1]][i % 5]
        spec = {"type": "custom", "config": {}, "requirements": {"tags": tags}} if i % 6 else {"type": "custom"}
        out.append(task(f"t{i:02d}", ["pending", "running", "succeeded", "failed"][i % 4], at=float(i // 2),
                        seq=i + 1, type=["custom", "benchmark", "test"][i % 3], worker_id=[None, "w1", "w2"][i % 3],
                        submitted_by=["k1", "k2", None][i % 3], spec=spec, updated_at=float(i) + 0.5))
    return out


TASK_QUERIES = [
    TaskQuery(),
    TaskQuery(state="pending"), TaskQuery(state="succeeded"), TaskQuery(state="nope"),
    TaskQuery(type="benchmark"), TaskQuery(worker_id="w2"), TaskQuery(submitted_by="k1"),
    TaskQuery(tag="gpu"), TaskQuery(tag="cpu"), TaskQuery(tag="1"), TaskQuery(tag="x"),
    TaskQuery(since=2.0), TaskQuery(until=2.0), TaskQuery(since=1.0, until=4.0),
    TaskQuery(state="running", type="benchmark"), TaskQuery(tag="gpu", worker_id="w1"),
    TaskQuery(limit=3), TaskQuery(limit=3, offset=3), TaskQuery(limit=5, offset=10), TaskQuery(limit=0),
    TaskQuery(offset=50), TaskQuery(type="custom", limit=2, offset=1),
]


@pytest.mark.asyncio
async def test_query_tasks_filters_orders_pages_and_counts(backend: Backend) -> None:
    rows = _tasks()
    await backend.store.append(rows[:7])
    await backend.settle()
    await backend.store.append(rows[7:])
    # a task that moves after the settle is counted once, in its new state
    moved = task("t00", "succeeded", at=0.0, seq=1, spec=rows[0].spec, worker_id="w2", submitted_by="k1",
                 updated_at=20.0)
    await backend.store.append([moved])
    rows[0] = moved
    for q in TASK_QUERIES:
        assert await backend.store.query_tasks(q) == filter_tasks(rows, q), q
    page = await backend.store.query_tasks(TaskQuery(limit=4))
    assert [t.task_id for t in page.tasks] == ["t11", "t10", "t09", "t08"] and page.total == 12
    # t05 and t10: t00 has no requirements, a string "gpu" (t03, t08) is not a list of tags
    assert [t.task_id for t in (await backend.store.query_tasks(TaskQuery(tag="gpu"))).tasks] == ["t10", "t05"]
    with pytest.raises(ValidationError):
        await backend.store.query_tasks(TaskQuery(limit=-1))


@pytest.mark.asyncio
async def test_task_stats_counts_buckets_and_lists_the_latest_failures(backend: Backend) -> None:
    rows = _tasks()
    await backend.store.append(rows[:5])
    await backend.settle()
    await backend.store.append(rows[5:] + [task("t12", "error", at=100.0, seq=13, updated_at=100.0)])
    rows.append(task("t12", "error", at=100.0, seq=13, updated_at=100.0))
    for args in [(0.0, 1.0, 6, 3), (1.0, 2.0, 3, 10), (-10.0, 5.0, 30, 0), (0.0, 0.1, 12, 2), (50.0, 1.0, 0, 1)]:
        assert await backend.store.task_stats(*args) == stats_of(rows, *args), args
    stats = await backend.store.task_stats(0.0, 1.0, 6, 2)
    assert stats.submitted == [2, 2, 2, 2, 2, 2]
    assert stats.finished == [0, 0, 1, 1, 0, 0]  # t02 (succeeded, 2.5), t03 (failed, 3.5)
    assert [t.task_id for t in stats.recent_failures] == ["t12", "t11"]
    with pytest.raises(ValidationError):
        await backend.store.task_stats(0.0, 0.0, 3, 1)


# ---------------------------------------------------------------------------- reading results


@pytest.mark.asyncio
async def test_query_results_filters_and_pages_newest_first(backend: Backend) -> None:
    bench = {"model": "bert-base", "precision": "fp16", "device": "cuda", "config_hash": "c1",
             "environment": {"device_name": "NVIDIA H100", "fingerprint_hash": "f1"},
             "batch_results": [{"batch_size": 1}, {"batch_size": 8}]}
    await backend.store.append([result("a", received_at=1.0, **bench)])
    await backend.settle()
    await backend.store.append([
        result("b", received_at=2.0, model="bert-base", device="cpu",
               batch_results=[{"batch_size": "8"}, {"batch_size": 8.0}, {"batch_size": True}]),
        result("c", received_at=3.0, status="failed"),
        result("c", attempt=2, received_at=3.0),
    ])

    async def ids(**filters: Any) -> list[tuple[str, int]]:
        return [(r.task_id, r.attempt) for r in await backend.store.query_results(ResultQuery(**filters))]

    assert await ids() == [("c", 2), ("c", 1), ("b", 1), ("a", 1)]
    assert await ids(model="bert-base") == [("b", 1), ("a", 1)]
    assert await ids(precision="fp16", batch_size=8) == [("a", 1)]
    assert await ids(batch_size=1) == [("a", 1)]
    assert await ids(hardware="NVIDIA H100") == [("a", 1)] and await ids(hardware="cpu") == [("b", 1)]
    assert await ids(config_hash="c1") == await ids(fingerprint="f1") == [("a", 1)]
    assert await ids(status="failed") == [("c", 1)] and await ids(task_id="c", limit=1) == [("c", 2)]
    assert await ids(worker_id="w1", task_type="custom", since=2.0, until=3.0) == [("b", 1)]
    assert await ids(limit=2, offset=1) == [("c", 1), ("b", 1)]
    with pytest.raises(ValidationError):
        await backend.store.query_results(ResultQuery(offset=-1))


# ---------------------------------------------------------------------------- runs


@pytest.mark.asyncio
async def test_runs_and_their_tasks_read_back_before_and_after_a_reopen(backend: Backend) -> None:
    """A run's record and its tasks' ``run_id`` (schema 5): looked up by id, listed newest first
    (ties by run id, descending), by key and in pages, and its tasks found by ``TaskQuery.run_id``;
    the same before a checkpoint, after one and after a reopen."""
    runs = [RunRow("run-000000000001", "ci #1", 1.0, {"commit": "abc"}, "k1"),
            RunRow("run-000000000002", "ci #2", 2.0, {}, "k2"), RunRow("run-000000000003", "nightly", 2.0)]
    dispatched = [{"at": 1.0, "to": "pending"}, {"at": 2.5, "to": "assigned"}, {"at": 4.0, "to": "succeeded"}]
    tasks = [task("a", seq=1, run_id="run-000000000001"),
             task("b", "succeeded", seq=2, run_id="run-000000000001", history=dispatched, updated_at=4.0),
             task("c", "cancelled", seq=3, run_id="run-000000000002", updated_at=3.0,
                  history=[{"at": 1.0, "to": "pending"}, {"at": 3.0, "to": "cancelled"}]),
             task("d", seq=4)]

    async def check() -> None:
        s = backend.store
        assert await s.get_runs(["run-000000000001", "run-000000000003", "nope"]) == {
            "run-000000000001": runs[0], "run-000000000003": runs[2]}
        listed = [r.run_id for r in await s.query_runs(10)]
        assert listed == ["run-000000000003", "run-000000000002", "run-000000000001"]
        assert [r.run_id for r in await s.query_runs(1, 1)] == ["run-000000000002"]
        assert [r.run_id for r in await s.query_runs(10, 0, "k1")] == ["run-000000000001"]
        page = await s.query_tasks(TaskQuery(run_id="run-000000000001"))
        assert sorted(t.task_id for t in page.tasks) == ["a", "b"] and page.total == 2
        assert {t.run_id for t in page.tasks} == {"run-000000000001"}
        assert (await s.get_tasks(["d"]))["d"].run_id is None
        stats = await s.run_stats(["run-000000000001", "run-000000000002", "run-000000000003"])
        assert stats == {"run-000000000001": RunStats({"pending": 1, "succeeded": 1}, 2.5, 4.0),
                         "run-000000000002": RunStats({"cancelled": 1}, None, 3.0),
                         "run-000000000003": RunStats({}, None, None)}
        assert stats == stats_of_runs(tasks, stats)  # as core/runs.py says it in Python

    await backend.store.append([*runs, *tasks])
    await check()
    await backend.settle()
    await check()
    await backend.reopen()
    await check()
    with pytest.raises(ValidationError):
        await backend.store.query_runs(-1)
