"""DuckDBStore on real files: persistence, upserts, result resends, checkpoints, schema versions."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import pytest

from distributed_testing.coordinator.core.rows import KeyRow, MetaRow, ResultRow, RunRow, TaskRow, WorkerRow
from distributed_testing.coordinator.store.base import SCHEMA_VERSION, ResultQuery
from distributed_testing.coordinator.store.duckdb import DuckDBStore
from distributed_testing.errors import StoreError

pytestmark = pytest.mark.timeout(20)

SLOW = {"checkpoint_interval_s": 60.0}  # checkpoints only when a test asks for one


def task(task_id: str, state: str = "queued", at: float = 1.0, **kw: Any) -> TaskRow:
    spec = {"type": "benchmark", "config": {"model": "bert", "batch_sizes": [1, 4]}}
    return TaskRow(task_id, "benchmark", state, 1, 5, at, at, "sha256:x", spec, **kw)


def result(
    task_id: str, attempt: int = 1, received_at: float = 10.0, status: str = "completed", **output: Any
) -> ResultRow:
    return ResultRow(task_id, attempt, "w1", status, 1.0, 2.0, received_at, output, task_type="benchmark")


WORKER = WorkerRow("w1", "box", {"cuda": {"devices": [{"name": "H100"}]}}, ["benchmark"], ["gpu"], 1.0, 2.0, "idle")
KEY = KeyRow("k1", "ci", "admin", "argon2:abc", 1.0, expires_at=None, revoked_at=3.0)


async def _wait_for(cond: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.01)


def _segments(store: DuckDBStore) -> list[str]:
    return sorted(p.name for p in store.journal_dir.glob("*.log"))


@pytest.mark.asyncio
async def test_everything_survives_close_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "db" / "coord.duckdb"
    store = DuckDBStore(path)
    snap = await store.open()
    assert snap.tasks == [] and snap.meta == {}
    t = task(
        "t1",
        "completed",
        worker_id="w1",
        history=[{"state": "queued", "at": 1.0}],
        outcome={"status": "completed", "attempt": 1},
    )
    await asyncio.gather(
        store.append([t, WORKER]),
        store.append([KEY, MetaRow("jwt_secret", "ab")]),
        store.append([result("t1", model="bert")]),
    )
    await store.close()
    await store.close()
    with pytest.raises(StoreError, match="not open"):
        store.append([task("t2")])

    again = DuckDBStore(path)
    snap = await again.open()
    try:
        assert snap.tasks == [t] and snap.workers == [WORKER] and snap.keys == [KEY]
        assert snap.meta == {"jwt_secret": "ab"}
        assert await again.query_results(ResultQuery()) == [result("t1", model="bert")]
    finally:
        await again.close()
    assert _segments(again) == []


@pytest.mark.asyncio
async def test_upserts_keep_the_last_state_and_results_the_first(tmp_path: Path) -> None:
    store = DuckDBStore(tmp_path / "c.duckdb", **SLOW)
    await store.open()
    # within one checkpoint batch
    await store.append([task("t1", "queued"), result("t1", received_at=10.0), task("t1", "running")])
    await store.append([result("t1", received_at=11.0, status="failed"), task("t1", "completed")])
    await store.checkpoint()
    # across checkpoints
    await store.append([task("t2", "queued")])
    await store.append([result("t2", received_at=20.0)])
    await store.checkpoint()
    await store.append([task("t2", "failed"), result("t2", received_at=21.0, status="failed")])
    rows = await store.query_results(ResultQuery())
    await store.close()
    assert [(r.task_id, r.received_at, r.status) for r in rows] == [
        ("t2", 20.0, "completed"),
        ("t1", 10.0, "completed"),
    ]
    again = DuckDBStore(tmp_path / "c.duckdb", **SLOW)
    snap = await again.open()
    stored = await again.get_tasks(["t1", "t2"])
    await again.close()
    assert [(t.task_id, t.state) for t in snap.tasks] == [("t1", "completed")]  # t2 failed: not active
    assert {i: t.state for i, t in stored.items()} == {"t1": "completed", "t2": "failed"}


@pytest.mark.asyncio
async def test_query_sees_every_completed_append_without_waiting(tmp_path: Path) -> None:
    store = DuckDBStore(tmp_path / "c.duckdb", **SLOW)
    await store.open()
    try:
        for i in range(5):
            await store.append([result(f"t{i}", received_at=float(i), model="m" if i % 2 else "n")])
            assert len(await store.query_results(ResultQuery())) == i + 1
        got = await store.query_results(ResultQuery(model="m"))
        assert [r.task_id for r in got] == ["t3", "t1"]
        # queries force no checkpoint: pending results are merged with DuckDB's rows
        await store.append([result("x", received_at=100.0)])
        before = store.journal.active_segment
        results = await asyncio.gather(*(store.query_results(ResultQuery(limit=1)) for _ in range(20)))
        assert all(r[0].task_id == "x" for r in results)
        assert store.journal.active_segment == before
        # concurrent checkpoints are shared
        store.append([result("y", received_at=101.0)])
        await asyncio.gather(*(store.checkpoint() for _ in range(20)))
        assert store.journal.active_segment - before <= 2
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_benchmark_filters_in_sql(tmp_path: Path) -> None:
    store = DuckDBStore(tmp_path / "c.duckdb", **SLOW)
    await store.open()
    bench = {
        "model": "bert-base",
        "precision": "fp16",
        "device": "cuda",
        "environment": {"device_name": "NVIDIA H100"},
        "batch_results": [{"batch_size": 1}, {"batch_size": 8}],
    }
    await store.append(
        [
            result("a", received_at=1.0, **bench),
            result(
                "b",
                received_at=2.0,
                model="bert-base",
                device="cpu",
                batch_results=[{"batch_size": "8"}, {"batch_size": 8.0}, {"batch_size": True}],
            ),
            result("c", received_at=3.0, status="failed"),
        ]
    )
    try:

        async def ids(**filters: Any) -> list[str]:
            return [r.task_id for r in await store.query_results(ResultQuery(**filters))]

        assert await ids() == ["c", "b", "a"]
        assert await ids(model="bert-base") == ["b", "a"]
        assert await ids(precision="fp16", batch_size=8) == ["a"]
        assert await ids(batch_size=1) == ["a"]
        assert await ids(hardware="NVIDIA H100") == ["a"]
        assert await ids(hardware="cpu") == ["b"]
        assert await ids(status="failed") == ["c"]
        assert await ids(since=2.0) == ["c", "b"] and await ids(until=2.0) == ["a"]
        assert await ids(limit=1, offset=1) == ["b"]
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_checkpoint_triggers_on_record_count_and_drops_segments(tmp_path: Path) -> None:
    store = DuckDBStore(tmp_path / "c.duckdb", checkpoint_interval_s=60.0, checkpoint_max_records=10)
    await store.open()
    try:
        await asyncio.gather(*(store.append([task(f"t{i}")]) for i in range(25)))
        await _wait_for(lambda: store._applied >= 25)
        assert _segments(store) == [f"store-{store.journal.active_segment:08d}.log"]
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_a_record_appended_while_a_checkpoint_rotates_survives_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "db" / "c.duckdb"
    store = DuckDBStore(path, **SLOW)
    await store.open()
    try:
        await store.append([task("t0")])
        await store.checkpoint()  # from now on a checkpoint applies its records from memory
        await store.append([task("t1")])
        checkpoint = asyncio.ensure_future(store.checkpoint())
        await asyncio.sleep(0)  # the checkpoint took its records and asked the journal to rotate
        await store.append([task("t2")])
        await checkpoint
        crashed = tmp_path / "crashed"
        shutil.copytree(path.parent, crashed)  # the files as a crash right now would leave them
    finally:
        await store.close()
    again = DuckDBStore(crashed / path.name, **SLOW)
    snap = await again.open()
    await again.close()
    assert sorted(t.task_id for t in snap.tasks) == ["t0", "t1", "t2"]


@pytest.mark.asyncio
async def test_interval_checkpoint_runs_by_itself(tmp_path: Path) -> None:
    store = DuckDBStore(tmp_path / "c.duckdb", checkpoint_interval_s=0.02)
    await store.open()
    try:
        await store.append([task("t1")])
        await _wait_for(lambda: store._applied >= 1)
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_failed_checkpoint_keeps_the_journal_and_retries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = DuckDBStore(tmp_path / "c.duckdb", **SLOW)
    await store.open()
    await store.append([result("t1")])
    real = DuckDBStore._bulk_insert

    def broken(*args: Any) -> None:
        raise duckdb.IOException("disk on fire")

    monkeypatch.setattr(DuckDBStore, "_bulk_insert", staticmethod(broken))
    with pytest.raises(StoreError, match="disk on fire"):
        await store.checkpoint()
    assert len(_segments(store)) == 2  # the closed segment was kept
    assert [r.task_id for r in await store.query_results(ResultQuery())] == ["t1"]  # still pending
    monkeypatch.setattr(DuckDBStore, "_bulk_insert", staticmethod(real))
    await store.append([result("t2")])
    await store.checkpoint()
    assert store._pending_results == {}
    assert {r.task_id for r in await store.query_results(ResultQuery())} == {"t1", "t2"}
    await store.close()


@pytest.mark.asyncio
async def test_pending_resend_of_a_stored_result_is_hidden(tmp_path: Path) -> None:
    store = DuckDBStore(tmp_path / "c.duckdb", **SLOW)
    await store.open()
    try:
        await store.append([result("t1", received_at=10.0, model="a")])
        await store.checkpoint()
        out = {"model": "a"}
        await store.append([result("t1", received_at=50.0, model="b"), result("t2", received_at=20.0, **out)])
        out["model"] = "changed after append"
        assert [(r.task_id, r.received_at) for r in await store.query_results(ResultQuery())] == [
            ("t2", 20.0),
            ("t1", 10.0),
        ]
        assert await store.query_results(ResultQuery(model="b")) == []
        assert [r.task_id for r in await store.query_results(ResultQuery(model="a", limit=1, offset=1))] == ["t1"]
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_segments_already_applied_are_not_applied_again(tmp_path: Path) -> None:
    """A crash between DuckDB's commit and the deletion of the segments leaves applied segments
    behind (possibly only some of them: unlinks reach the disk in any order). Re-applying an old
    segment would roll keys back, so the store skips segments up to its applied mark."""
    path = tmp_path / "c.duckdb"
    store = DuckDBStore(path, **SLOW)
    await store.open()
    await store.append([task("t1", "queued"), result("t1", received_at=1.0)])
    await store.append([task("t1", "completed")])
    saved = tmp_path / "saved"
    shutil.copytree(store.journal_dir, saved)
    await store.append([task("t1", "archived")])
    await store.close()
    for seg in saved.iterdir():
        shutil.copy(seg, store.journal_dir / seg.name)
    again = DuckDBStore(path, **SLOW)
    snap = await again.open()
    rows = await again.query_results(ResultQuery())
    await again.close()
    assert [t.state for t in snap.tasks] == ["archived"]
    assert [r.received_at for r in rows] == [1.0]


@pytest.mark.asyncio
async def test_newer_schema_is_refused_naming_both_versions(tmp_path: Path) -> None:
    path = tmp_path / "c.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    con.execute("INSERT INTO schema_version VALUES (?)", [SCHEMA_VERSION + 1])
    con.close()
    store = DuckDBStore(path)
    with pytest.raises(StoreError) as err:
        await store.open()
    assert str(SCHEMA_VERSION + 1) in str(err.value) and str(SCHEMA_VERSION) in str(err.value)
    await store.close()
    duckdb.connect(str(path)).close()  # the file lock was released


@pytest.mark.asyncio
async def test_older_schema_without_a_migration_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    con.execute("INSERT INTO schema_version VALUES (0)")
    con.close()
    with pytest.raises(StoreError, match="no migration from schema version 0"):
        await DuckDBStore(path).open()


@pytest.mark.asyncio
async def test_tables_that_differ_from_the_record_types_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.duckdb"
    store = DuckDBStore(path)
    await store.open()
    await store.close()
    con = duckdb.connect(str(path))
    con.execute("ALTER TABLE tasks DROP COLUMN submitted_by")
    con.close()
    with pytest.raises(StoreError, match="table tasks has columns .*bump SCHEMA_VERSION"):
        await DuckDBStore(path).open()


@pytest.mark.asyncio
async def test_a_crashed_checkpointer_stops_appends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.duckdb"
    store = DuckDBStore(path, checkpoint_interval_s=0.01)
    await store.open()
    real = DuckDBStore._apply_sync

    def bug(self: DuckDBStore, upto: int) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(DuckDBStore, "_apply_sync", bug)
    await store.append([task("t1")])
    assert store._checkpointer is not None
    await asyncio.wait_for(asyncio.wait([store._checkpointer]), 5)
    with pytest.raises(StoreError, match="checkpointer stopped"):
        store.append([task("t2")])
    monkeypatch.setattr(DuckDBStore, "_apply_sync", real)
    await store.close()
    again = DuckDBStore(path)
    assert [t.task_id for t in (await again.open()).tasks] == ["t1"]
    await again.close()


@pytest.mark.asyncio
async def test_a_schema_1_file_is_migrated_and_its_workers_stay_unbound(tmp_path: Path) -> None:
    """Schema 2 added ``workers.key_id`` (the key a worker id is bound to): a file written by
    schema 1 is upgraded in place, its worker rows unbound, and new rows keep their binding."""
    path = tmp_path / "c.duckdb"
    store = DuckDBStore(path)
    await store.open()
    await store.close()
    con = duckdb.connect(str(path))
    con.execute("ALTER TABLE workers DROP COLUMN key_id")
    con.execute("ALTER TABLE api_keys DROP COLUMN allow_code")  # schema 3's
    con.execute("INSERT INTO workers VALUES ('old', 'box', '{}', '[]', '[]', 1.0, 2.0, 'disconnected')")
    con.execute("UPDATE schema_version SET version = 1")
    con.close()
    store = DuckDBStore(path, **SLOW)
    snap = await store.open()
    assert [(w.worker_id, w.key_id) for w in snap.workers] == [("old", None)]
    await store.append([WorkerRow("new", "box", {}, [], [], 1.0, 2.0, "ready", key_id="k1")])
    await store.close()
    con = duckdb.connect(str(path))
    assert con.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    con.close()
    again = DuckDBStore(path, **SLOW)
    snap = await again.open()
    await again.close()
    assert [(w.worker_id, w.key_id) for w in snap.workers] == [("new", "k1"), ("old", None)]


@pytest.mark.asyncio
async def test_a_schema_2_file_gets_keys_that_may_not_ship_code(tmp_path: Path) -> None:
    """Schema 3 added ``api_keys.allow_code``: keys of a schema-2 file are kept and may not
    upload bundles until an admin makes a key that may."""
    path = tmp_path / "c.duckdb"
    store = DuckDBStore(path)
    await store.open()
    await store.close()
    con = duckdb.connect(str(path))
    con.execute("ALTER TABLE api_keys DROP COLUMN allow_code")
    con.execute("INSERT INTO api_keys VALUES ('k1', 'ci', 'submitter', 'h', 1.0, NULL, NULL)")
    con.execute("UPDATE schema_version SET version = 2")
    con.close()
    store = DuckDBStore(path, **SLOW)
    snap = await store.open()
    await store.close()
    assert [(k.key_id, k.allow_code) for k in snap.keys] == [("k1", False)]


def _lifecycle(n: int) -> list[TaskRow]:
    """The rows the core saves for one task moved ``n`` times, each extending the last."""
    history: list[dict[str, Any]] = [{"at": 0.0, "to": "pending", "cause": "submitted"}]
    rows = [task("d1", "pending", history=list(history))]
    for i in range(n):
        state = ("assigned", "running", "pending")[i % 3]
        history.append({"at": float(i + 1), "from": rows[-1].state, "to": state, "cause": f"step {i}"})
        rows.append(msgspec.structs.replace(
            task("d1", state, worker_id=None if state == "pending" else "w1", retries_used=i // 3,
                 history=list(history)), updated_at=float(i + 1)))
    return rows


@pytest.mark.asyncio
async def test_changes_replayed_over_a_checkpoint_boundary_rebuild_the_row(tmp_path: Path) -> None:
    """A task's later rows are journaled as changes; whether a checkpoint applied them (as an
    UPDATE of the stored row) or a reopen after a crash replays them from the journal, the row
    read back is the last one appended."""
    path = tmp_path / "db" / "c.duckdb"
    rows = _lifecycle(7)
    store = DuckDBStore(path, **SLOW)
    await store.open()
    try:
        await store.append(rows[:2])  # a whole row, then a change folded into it by the checkpoint
        await store.checkpoint()
        await store.append(rows[2:4])  # changes applied as an UPDATE of the stored row
        await store.checkpoint()
        for r in rows[4:]:  # changes left in the journal
            await store.append([r])
        assert (await store.get_tasks(["d1"]))["d1"] == rows[-1]  # read before any checkpoint
        crashed = tmp_path / "crashed"
        shutil.copytree(path.parent, crashed)  # the files as a crash right now would leave them
    finally:
        await store.close()
    for where in (path, crashed / path.name):  # closed cleanly (checkpointed), and after the crash
        again = DuckDBStore(where, **SLOW)
        snap = await again.open()
        try:
            assert snap.tasks == [rows[-1]]
            await again.append([msgspec.structs.replace(rows[-1], state="succeeded",
                                                        history=[*rows[-1].history, {"to": "succeeded"}])])
            await again.checkpoint()  # after a reopen the first row is whole again: nothing to splice onto
            assert (await again.get_tasks(["d1"]))["d1"].history[-1] == {"to": "succeeded"}
        finally:
            await again.close()


@pytest.mark.asyncio
async def test_checkpoint_work_per_change_is_flat_in_the_history(tmp_path: Path) -> None:
    """Bytes a checkpoint hands DuckDB, and journal bytes, for one more transition of a task whose
    row is already stored: the same with 3 history entries as with 300."""
    store = DuckDBStore(tmp_path / "c.duckdb", **SLOW)
    await store.open()
    cost = []
    try:
        for n in (3, 300):
            rows = [msgspec.structs.replace(r, task_id=f"h{n}") for r in _lifecycle(n + 1)]
            await store.append(rows[:-1])
            await store.checkpoint()
            ckpt, journal = store.checkpoint_bytes, store.journal.byte_count
            await store.append(rows[-1:])
            await store.checkpoint()
            cost.append((store.checkpoint_bytes - ckpt, store.journal.byte_count - journal))
            assert (await store.get_tasks([f"h{n}"]))[f"h{n}"] == rows[-1]
        await store.close()
        again = DuckDBStore(tmp_path / "c.duckdb", **SLOW)
        await again.open()
        assert [len(t.history) for t in sorted((await again.get_tasks(["h3", "h300"])).values(),
                                               key=lambda t: len(t.history))] == [5, 302]
        await again.close()
    finally:
        await store.close()
    (small_ckpt, small_journal), (big_ckpt, big_journal) = cost
    assert abs(big_ckpt - small_ckpt) <= 8 and abs(big_journal - small_journal) <= 8


@pytest.mark.asyncio
async def test_a_stored_key_in_a_checkpoint_redoes_it_as_upserts(tmp_path: Path) -> None:
    """A checkpoint writes task and result rows with a plain INSERT; a key DuckDB already holds (an
    active task's first row after a restart, a resent result) makes it redo the batch with INSERT
    OR REPLACE / OR IGNORE: the stored task takes the new row, the first result stays, and the
    new rows of the same batch land too."""
    path = tmp_path / "c.duckdb"
    store = DuckDBStore(path, **SLOW)
    await store.open()
    await store.append([task("t1", "queued"), result("t1", received_at=10.0)])
    await store.close()
    again = DuckDBStore(path, **SLOW)
    await again.open()
    try:
        await again.append([task("t1", "running"), task("t2", "queued"), result("t2", received_at=12.0),
                            result("t1", received_at=11.0, status="failed")])
        await again.checkpoint()
        assert again._pending_tasks == {} and again._pending_results == {}  # what follows reads DuckDB
        assert {i: t.state for i, t in (await again.get_tasks(["t1", "t2"])).items()} == {"t1": "running",
                                                                                           "t2": "queued"}
        rows = await again.query_results(ResultQuery())
        assert [(r.task_id, r.received_at, r.status) for r in rows] == [("t2", 12.0, "completed"),
                                                                         ("t1", 10.0, "completed")]
    finally:
        await again.close()
    assert _segments(again) == []


@pytest.mark.asyncio
async def test_changes_find_their_rows_by_seq_and_without_it(tmp_path: Path) -> None:
    """A checkpoint looks for each change's stored row only among the rows near its seq (one
    UPDATE per cluster of seqs, so its cost does not grow with the table). A change journaled
    before changes carried their seq (-1) makes it redo the batch over the whole table; a change
    whose task has no stored row still fails the checkpoint as a broken journal."""
    from distributed_testing.coordinator.store.changes import JournalRecord, TaskChange
    from distributed_testing.durable.journal import Journal

    path = tmp_path / "c.duckdb"
    rows = [task(f"s{i}", "pending", seq=seq, history=[{"to": "pending"}]) for i, seq in enumerate((1, 2, 500_000))]
    store = DuckDBStore(path, **SLOW)
    await store.open()
    try:
        await store.append(rows)
        await store.checkpoint()
        await store.append([msgspec.structs.replace(r, state="running", history=[*r.history, {"to": "running"}])
                            for r in rows])
        await store.checkpoint()  # two seq ranges: {1, 2} and {500000}
        got = await store.get_tasks([r.task_id for r in rows])
        assert {i: (t.state, len(t.history)) for i, t in got.items()} == {r.task_id: ("running", 2) for r in rows}
    finally:
        await store.close()

    async def journal_then_open(change: TaskChange) -> DuckDBStore:
        """``change`` in a journal segment the store has not applied, as a crash leaves one."""
        old = Journal[JournalRecord](store.journal_dir, JournalRecord, name="store")
        await old.start(min_seq=store.journal.active_segment + 1)
        await old.append([change])
        await old.close()
        again = DuckDBStore(path, **SLOW)
        await again.open()  # replays the segment into DuckDB
        return again

    unknown = TaskChange("s2", "succeeded", 1, 9.0, 2, [{"to": "succeeded"}], outcome={"status": "succeeded"})
    assert unknown.seq == -1
    again = await journal_then_open(unknown)
    store = again
    try:
        t = (await again.get_tasks(["s2"]))["s2"]
        assert (t.state, t.history, t.outcome) == ("succeeded", [{"to": "pending"}, {"to": "running"},
                                                                {"to": "succeeded"}], {"status": "succeeded"})
    finally:
        await again.close()
    with pytest.raises(StoreError, match="1 task changes matched 0 stored tasks") as refused:
        await journal_then_open(TaskChange("ghost", "running", 1, 9.0, 1, [{"to": "running"}], seq=3))
    # what an operator needs: which tasks, and the two ways out
    assert "changes 1 task(s) this DuckDB file does not hold (ghost)" in str(refused.value)
    assert "Restore both from the same backup, or move the journal directory aside" in str(refused.value)


@pytest.mark.asyncio
async def test_a_schema_4_file_gets_runs_and_its_tasks_belong_to_none(tmp_path: Path) -> None:
    """Schema 5 added ``tasks.run_id`` and the ``runs`` table: a schema-4 file's tasks are kept,
    in no run, and runs are written from then on."""
    path = tmp_path / "c.duckdb"
    store = DuckDBStore(path, **SLOW)
    await store.open()
    await store.append([task("old", "succeeded", seq=1)])
    await store.close()
    con = duckdb.connect(str(path))
    con.execute("ALTER TABLE tasks DROP COLUMN run_id")
    con.execute("DROP TABLE runs")
    con.execute("UPDATE schema_version SET version = 4")
    con.close()
    store = DuckDBStore(path, **SLOW)
    await store.open()
    assert (await store.get_tasks(["old"]))["old"].run_id is None
    await store.append([RunRow("run-00000000000a", "ci", 1.0), task("new", seq=2, run_id="run-00000000000a")])
    await store.close()
    again = DuckDBStore(path, **SLOW)
    await again.open()
    try:
        assert [r.run_id for r in await again.query_runs(5)] == ["run-00000000000a"]
        assert (await again.get_tasks(["new"]))["new"].run_id == "run-00000000000a"
    finally:
        await again.close()
