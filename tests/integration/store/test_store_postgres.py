"""PostgresStore on the real server: schema creation under concurrency and versions, fencing,
key notifications, reconnects after the server ends the store's connections, and failures that
stop the writer. (The Store contract itself is test_store_contract.py, on every backend.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from distributed_testing.coordinator.core.rows import KeyRow, MetaRow, ResultRow, RunRow, TaskRow
from distributed_testing.coordinator.store import postgres
from distributed_testing.coordinator.store.base import SCHEMA_VERSION, ResultQuery
from distributed_testing.coordinator.store.postgres import PostgresStore
from distributed_testing.errors import Fenced, StoreError
from distributed_testing.testing import pg_database, refusing_port, wait_for

pytestmark = pytest.mark.timeout(60)


def task(task_id: str, state: str = "pending", seq: int = 1) -> TaskRow:
    return TaskRow(task_id, "custom", state, 1, 0, 1.0, 1.0, "d", {"type": "custom"}, seq=seq)


def key(key_id: str, revoked_at: float | None = None) -> KeyRow:
    return KeyRow(key_id, "ci", "admin", "h", 1.0, revoked_at=revoked_at)


@pytest_asyncio.fixture
async def store(pg_url: str) -> AsyncIterator[PostgresStore]:
    s = PostgresStore(pg_url)
    await s.open()
    try:
        yield s
    finally:
        await s.close()


@pytest_asyncio.fixture
async def admin(pg_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection of the test's own to the same schema (what another coordinator or an operator
    would do to the database)."""
    con = await asyncpg.connect(pg_url)
    try:
        yield con
    finally:
        await con.close()


async def lock_waiter(con: asyncpg.Connection, other_than: int = 0) -> int:
    """The pid of a backend of this database waiting on a lock (waits for one to appear)."""
    async with asyncio.timeout(10):
        while True:
            pid = await con.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database() "
                "AND pid <> $1", other_than)
            if pid is not None:
                return int(pid)
            await asyncio.sleep(0.02)


async def stored_task_ids(con: asyncpg.Connection) -> list[str]:
    return [r[0] for r in await con.fetch("SELECT task_id FROM tasks ORDER BY task_id")]


# ---------------------------------------------------------------------------- schema


@pytest.mark.asyncio
async def test_coordinators_starting_together_on_an_empty_database_create_the_schema_once() -> None:
    async with pg_database() as url:
        stores = [PostgresStore(url) for _ in range(4)]
        snaps = await asyncio.gather(*(s.open() for s in stores))
        try:
            assert all(snap.tasks == [] for snap in snaps)
            await asyncio.gather(*(s.append([task(f"t{i}", seq=i)]) for i, s in enumerate(stores)))
            con = await asyncpg.connect(url)
            assert await con.fetch("SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
            assert await stored_task_ids(con) == ["t0", "t1", "t2", "t3"]
            lease_cols = [r[0] for r in await con.fetch(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'dt_lease' "
                "ORDER BY ordinal_position")]
            assert lease_cols == ["name", "holder", "epoch", "expires_at", "url"]
            await con.close()
        finally:
            for s in stores:
                await s.close()


@pytest.mark.asyncio
async def test_a_newer_schema_is_refused_naming_both_versions(store: PostgresStore, admin: asyncpg.Connection,
                                                              pg_url: str) -> None:
    await admin.execute("UPDATE schema_version SET version = $1", SCHEMA_VERSION + 1)
    with pytest.raises(StoreError) as err:
        await PostgresStore(pg_url).open()
    assert f"schema version {SCHEMA_VERSION + 1}, newer than the version {SCHEMA_VERSION}" in str(err.value)


@pytest.mark.asyncio
async def test_an_older_schema_is_migrated_in_steps_or_refused_without_a_migration(
        store: PostgresStore, admin: asyncpg.Connection, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    await admin.execute("UPDATE schema_version SET version = $1", SCHEMA_VERSION - 1)
    monkeypatch.delitem(postgres.MIGRATIONS, SCHEMA_VERSION - 1)
    with pytest.raises(StoreError, match=f"no migration from schema version {SCHEMA_VERSION - 1}"):
        await PostgresStore(pg_url).open()
    ran: list[int] = []

    async def step(con: asyncpg.Connection) -> None:  # runs inside the schema transaction, under the lock
        ran.append(await con.fetchval("SELECT version FROM schema_version"))

    monkeypatch.setitem(postgres.MIGRATIONS, SCHEMA_VERSION - 1, step)
    again = PostgresStore(pg_url)
    await again.open()
    await again.close()
    assert ran == [SCHEMA_VERSION - 1]
    assert await admin.fetchval("SELECT version FROM schema_version") == SCHEMA_VERSION


@pytest.mark.asyncio
async def test_a_schema_2_database_gets_the_blob_table_and_keys_that_may_not_ship_code(
        store: PostgresStore, admin: asyncpg.Connection, pg_url: str) -> None:
    await store.close()
    await admin.execute("ALTER TABLE api_keys DROP COLUMN allow_code")
    await admin.execute("DROP TABLE dt_blob_refs, dt_blobs")
    await admin.execute("INSERT INTO api_keys VALUES ('k1', 'ci', 'submitter', 'h', 1.0, NULL, NULL)")
    await admin.execute("UPDATE schema_version SET version = 2")
    again = PostgresStore(pg_url)
    snap = await again.open()
    await again.close()
    assert [(k.key_id, k.allow_code) for k in snap.keys] == [("k1", False)]
    assert await admin.fetchval("SELECT to_regclass('dt_blobs') IS NOT NULL")
    assert await admin.fetchval("SELECT to_regclass('dt_blob_refs') IS NOT NULL")  # 3 -> 4: which keys hold which


@pytest.mark.asyncio
async def test_tables_that_differ_from_the_record_types_are_refused(store: PostgresStore, admin: asyncpg.Connection,
                                                                    pg_url: str) -> None:
    await admin.execute("ALTER TABLE tasks DROP COLUMN submitted_by")
    with pytest.raises(StoreError, match="table tasks has columns .*bump SCHEMA_VERSION"):
        await PostgresStore(pg_url).open()


@pytest.mark.asyncio
async def test_an_unreachable_server_is_a_clear_error() -> None:
    url = f"postgresql://postgres@127.0.0.1:{refusing_port()}/nothing"
    with pytest.raises(StoreError, match=f"cannot connect to PostgreSQL at {url}"):
        await PostgresStore(url, connect_timeout_s=2).open()


# ---------------------------------------------------------------------------- values


@pytest.mark.asyncio
async def test_nul_characters_become_replacement_characters_and_json_keeps_its_numbers(
        store: PostgresStore) -> None:
    r = ResultRow("t\x001", 1, "w", "completed", 1.0, 2.0, 3.0,
                  {"log": "a\x00b", "path": "C:\\u0000", "big": 1e16, "huge": 1e300, "n": 4}, error="e\x00")
    await store.append([r])
    (got,) = await store.query_results(ResultQuery())
    assert got.task_id == "t\ufffd1" and got.error == "e\ufffd"
    assert got.output == {"log": "a\ufffdb", "path": "C:\\u0000", "big": 1e16, "huge": 1e300, "n": 4}
    assert [type(got.output[k]) for k in ("big", "huge", "n")] == [float, float, int]


# ---------------------------------------------------------------------------- fencing


async def set_lease(con: asyncpg.Connection, holder: str, epoch: int, ttl_s: float) -> None:
    await con.execute(
        "INSERT INTO dt_lease (name, holder, epoch, expires_at) VALUES ('leader', $1, $2, "
        "clock_timestamp() + make_interval(secs => $3)) ON CONFLICT (name) DO UPDATE SET holder = $1, "
        "epoch = $2, expires_at = EXCLUDED.expires_at", holder, epoch, ttl_s)


@pytest.mark.asyncio
async def test_a_write_under_a_wrong_or_expired_fence_fails_and_commits_nothing(
        store: PostgresStore, admin: asyncpg.Connection) -> None:
    store.set_fence("c1", 1)
    with pytest.raises(Fenced, match="no longer held by 'c1' at epoch 1"):  # no lease row at all
        await store.append([task("t0"), key("k0"), MetaRow("m", "x")])
    await set_lease(admin, "c1", 1, 30)
    await store.append([task("t1", seq=1), key("k1")])  # the holder at its epoch writes
    for holder, epoch, ttl in [("c2", 1, 30), ("c1", 2, 30), ("c1", 1, -1)]:  # someone else, newer epoch, expired
        await set_lease(admin, holder, epoch, ttl)
        with pytest.raises(Fenced):
            await store.append([task("t2", seq=2), key("k2"), MetaRow("jwt", ""), ResultRow(
                "t1", 1, "w", "completed", 1.0, 2.0, 3.0)])
    assert await stored_task_ids(admin) == ["t1"]
    assert await admin.fetch("SELECT key_id FROM api_keys") == [("k1",)]
    assert await admin.fetchval("SELECT count(*) FROM results") == 0
    store.set_fence("c1", 3)
    await set_lease(admin, "c1", 3, 30)
    await store.append([task("t3", seq=3)])  # the writer kept running: a new fence writes again
    store.clear_fence()
    await set_lease(admin, "c9", 9, -1)
    await store.append([task("t4", seq=4)])  # no fence: no lease check
    assert await stored_task_ids(admin) == ["t1", "t3", "t4"]


@pytest.mark.asyncio
async def test_a_takeover_waiting_on_the_lease_row_fences_the_write_in_flight(
        store: PostgresStore, admin: asyncpg.Connection, pg_url: str) -> None:
    """The write locks the lease row FOR SHARE: a takeover in progress (holding the row) makes it
    wait, and once the takeover commits the write finds the new holder and writes nothing."""
    await set_lease(admin, "c1", 1, 30)
    store.set_fence("c1", 1)
    takeover = await asyncpg.connect(pg_url)
    try:
        tx = takeover.transaction()
        await tx.start()
        await takeover.execute("SELECT 1 FROM dt_lease WHERE name = 'leader' FOR UPDATE")
        write = store.append([task("t1")])
        await lock_waiter(admin)
        assert not write.done()
        await takeover.execute("UPDATE dt_lease SET holder = 'c2', epoch = 2 WHERE name = 'leader'")
        await tx.commit()
        with pytest.raises(Fenced):
            await write
    finally:
        await takeover.close()
    assert await stored_task_ids(admin) == []


# ---------------------------------------------------------------------------- keys


@pytest.mark.asyncio
async def test_key_changes_are_notified_to_listeners_and_load_keys_reads_them(store: PostgresStore,
                                                                              pg_url: str) -> None:
    other = PostgresStore(pg_url)  # another coordinator of the group
    await other.open()
    got: list[str] = []
    listener = asyncio.create_task(other.listen(PostgresStore.KEYS_CHANNEL, got.append))
    try:
        await wait_for(lambda: got == [""], what="the listener to start")  # "" on (re)start: reload all
        await store.append([task("t1")])  # no keys: no notification
        await store.append([key("k1"), key("k2"), task("t2", seq=2)])
        await wait_for(lambda: len(got) == 2, what="the notification")
        assert got[1] == "k1,k2"
        await store.append([key("k1", revoked_at=5.0)])
        await wait_for(lambda: len(got) == 3, what="the revocation's notification")
        assert got[2] == "k1"
        assert [(k.key_id, k.revoked_at) for k in await other.load_keys()] == [("k1", 5.0), ("k2", None)]
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
        await other.close()


@pytest.mark.asyncio
async def test_a_listener_whose_connection_is_killed_reconnects_and_asks_for_a_full_reload(
        store: PostgresStore, admin: asyncpg.Connection) -> None:
    got: list[str] = []
    listener = asyncio.create_task(store.listen(PostgresStore.KEYS_CHANNEL, got.append))
    try:
        await wait_for(lambda: got == [""], what="the listener to start")
        killed = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query LIKE 'LISTEN%' "
            "AND datname = current_database()")
        assert killed == 1
        await wait_for(lambda: got == ["", ""], what="the listener to come back")
        await store.append([key("k1")])
        await wait_for(lambda: got == ["", "", "k1"], what="a notification after the reconnect")
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)


@pytest.mark.asyncio
async def test_snapshot_of_an_open_store_shows_what_another_store_committed(store: PostgresStore,
                                                                            pg_url: str) -> None:
    standby = PostgresStore(pg_url)
    assert (await standby.open()).tasks == []
    try:
        await store.append([task("t1", seq=1), task("t2", "succeeded", seq=2), key("k1"), MetaRow("m", "v")])
        snap = await standby.snapshot()
        assert [t.task_id for t in snap.tasks] == ["t1"] and [k.key_id for k in snap.keys] == ["k1"]
        assert (snap.meta, snap.task_counts, snap.max_seq) == ({"m": "v"}, {"pending": 1, "succeeded": 1}, 2)
    finally:
        await standby.close()


# ---------------------------------------------------------------------------- lost connections


def writer_pid(store: PostgresStore) -> int:
    assert store._conn_id is not None
    return store._conn_id[0]


@pytest.mark.asyncio
async def test_a_terminated_connection_is_replaced_and_nothing_acknowledged_is_lost(
        store: PostgresStore, admin: asyncpg.Connection, pg_url: str) -> None:
    await store.append([task("t0")])
    # between batches
    assert await admin.fetchval("SELECT pg_terminate_backend($1)", writer_pid(store))
    await store.append([task("t1", seq=1)])
    # in the middle of one: the batch waits on a row lock, its backend is terminated, then the lock goes
    locker = await asyncpg.connect(pg_url)
    tx = locker.transaction()
    await tx.start()
    await locker.execute("SELECT 1 FROM tasks WHERE task_id = 't0' FOR UPDATE")
    pid = writer_pid(store)
    write = asyncio.gather(*(store.append([task("t0", "running"), task(f"t{i}", seq=i)]) for i in range(2, 6)))
    assert await lock_waiter(admin) == pid
    assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
    assert await lock_waiter(admin, other_than=pid) != pid  # the retry, on a new connection, waits too
    await tx.rollback()
    await locker.close()
    await write
    assert writer_pid(store) != pid
    assert await stored_task_ids(admin) == ["t0", "t1", "t2", "t3", "t4", "t5"]
    assert await admin.fetchval("SELECT state FROM tasks WHERE task_id = 't0'") == "running"


@pytest.mark.asyncio
async def test_a_connection_not_back_in_time_fails_the_batch_and_stops_the_writer(
        pg_url: str, admin: asyncpg.Connection) -> None:
    store = PostgresStore(pg_url, reconnect_s=0.5)
    await store.open()
    watch = asyncio.create_task(store.watch())
    await store.append([task("t0")])
    store.url = f"postgresql://postgres@127.0.0.1:{refusing_port()}/gone"  # where the server "went": nothing listens
    await admin.fetchval("SELECT pg_terminate_backend($1)", writer_pid(store))
    with pytest.raises(StoreError, match="could not write to .* for 0.5 s"):
        await store.append([task("t1", seq=1)])
    with pytest.raises(StoreError, match="the writer stopped"):
        await asyncio.wait_for(watch, 10)
    with pytest.raises(StoreError, match="writer stopped"):
        store.append([task("t2", seq=2)])
    with pytest.raises(StoreError, match="had failed"):
        await store.close()
    assert await stored_task_ids(admin) == ["t0"]


@pytest.mark.asyncio
async def test_a_database_error_fails_the_batch_and_everything_queued_behind_it(
        store: PostgresStore, admin: asyncpg.Connection) -> None:
    watch = asyncio.create_task(store.watch())
    await admin.execute("ALTER TABLE tasks ADD CONSTRAINT no_x CHECK (task_id <> 'x')")
    bad = store.append([task("x")])
    behind = store.append([task("y")])
    for fut in (bad, behind):
        with pytest.raises(StoreError, match="no_x"):
            await fut
    with pytest.raises(StoreError):
        await asyncio.wait_for(watch, 10)
    with pytest.raises(StoreError, match="had failed"):
        await store.close()
    assert await stored_task_ids(admin) == []


# ---------------------------------------------------------------------------- group commit


@pytest.mark.asyncio
async def test_appends_queued_during_a_commit_share_the_next_one(store: PostgresStore) -> None:
    futs = [store.append([task(f"t{i}", seq=i)]) for i in range(200)]
    await asyncio.gather(*futs)
    assert store.record_count == 200 and store.batch_count < 10
    lingering = store.append([task("late")], linger_s=30.0)
    await asyncio.sleep(0.05)
    assert not lingering.done()  # waits for company...
    await store.append([task("soon", seq=999)])  # ...which any other append brings
    assert lingering.done()


@pytest.mark.asyncio
async def test_close_writes_what_was_appended(pg_url: str, admin: asyncpg.Connection) -> None:
    store = PostgresStore(pg_url)
    await store.open()
    futs: list[Any] = [store.append([task(f"t{i}", seq=i)], linger_s=30.0) for i in range(3)]
    await store.close()
    assert all(f.done() and f.exception() is None for f in futs)
    assert await stored_task_ids(admin) == ["t0", "t1", "t2"]


@pytest.mark.asyncio
async def test_a_schema_4_database_gets_runs_and_its_tasks_belong_to_none(
        store: PostgresStore, admin: asyncpg.Connection, pg_url: str) -> None:
    await store.append([task("old", "succeeded")])
    await store.close()
    await admin.execute("ALTER TABLE tasks DROP COLUMN run_id")
    await admin.execute("DROP TABLE runs")
    await admin.execute("UPDATE schema_version SET version = 4")
    again = PostgresStore(pg_url)
    await again.open()
    try:
        assert (await again.get_tasks(["old"]))["old"].run_id is None
        await again.append([RunRow("run-00000000000a", "ci", 1.0, {"b": "main"}, "k1")])
        assert await again.get_runs(["run-00000000000a"]) == {
            "run-00000000000a": RunRow("run-00000000000a", "ci", 1.0, {"b": "main"}, "k1")}
        assert await admin.fetchval("SELECT to_regclass('tasks_run') IS NOT NULL")
    finally:
        await again.close()
