"""The leader lease on a real PostgreSQL database: one holder at a time, the crash fast path
(the holder's session ends: taken at once), expiry when the holder keeps its session but stops
renewing (a paused process), and a replaced holder that can no longer renew."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import asyncpg
import pytest

from distributed_testing.coordinator import group as g
from distributed_testing.coordinator.store.postgres import PostgresStore
from distributed_testing.testing import pg_database_sync

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def dsn() -> Iterator[str]:
    with pg_database_sync(prefix="dt_ha_lease") as url:
        yield url


async def _lease(dsn: str, member: str, ttl_s: float = 5.0, margin_s: float = 1.0) -> g.Lease:
    conn = await g.connect(dsn)
    await g.ensure_schema(conn)
    return g.Lease(conn, member, f"http://{member}:1", ttl_s=ttl_s, margin_s=margin_s)


async def _reset(dsn: str) -> None:
    store = PostgresStore(dsn)  # the store's schema holds dt_lease
    await store.open()
    await store.close()
    conn = await g.connect(dsn)
    await g.ensure_schema(conn)
    await conn.execute("UPDATE dt_lease SET holder = '', expires_at = '-infinity' WHERE name = 'leader'")
    await conn.close()


async def test_one_holder_at_a_time_and_the_crash_fast_path(dsn: str) -> None:
    await _reset(dsn)
    a, b = await _lease(dsn, "a"), await _lease(dsn, "b")
    epoch = await a.try_acquire()
    assert epoch is not None and a.holds()
    assert await b.try_acquire() is None  # a's session holds its epoch's lock, and the lease is fresh
    await a.renew()
    assert await b.try_acquire() is None
    a.conn.terminate()  # the process died: PostgreSQL ends its session and frees the lock
    await asyncio.wait_for(a.lost.wait(), 5)  # the connection's end ends the leadership at once
    assert not a.holds()
    taken = None
    for _ in range(100):  # the server notices the closed socket within moments
        if (taken := await b.try_acquire()) is not None:
            break
        await asyncio.sleep(0.02)
    assert taken == epoch + 1
    row = await b.observe()
    assert (row.holder, row.epoch, row.url, row.expired) == ("b", epoch + 1, "http://b:1", False)
    await b.conn.close()


async def test_a_paused_holder_is_replaced_after_expiry_and_cannot_renew(dsn: str) -> None:
    await _reset(dsn)
    a, b = await _lease(dsn, "a", ttl_s=1.0, margin_s=0.3), await _lease(dsn, "b", ttl_s=1.0, margin_s=0.3)
    epoch = await a.try_acquire()
    assert epoch is not None
    # a keeps its connection (and so its advisory lock) but stops renewing, as a SIGSTOPped process
    while (taken := await b.try_acquire()) is None:
        await asyncio.sleep(0.05)
    assert taken == epoch + 1
    assert not a.holds()  # its own deadline passed before the database let b take over
    with pytest.raises(g.LeadershipLost):
        await a.renew()
    conn = await g.connect(dsn)
    assert await conn.fetchval("SELECT holder FROM dt_lease WHERE name = 'leader'") == "b"
    await conn.close()
    await a.conn.close()
    await b.conn.close()


async def test_the_local_deadline_runs_from_when_the_renewal_was_sent(dsn: str) -> None:
    await _reset(dsn)
    now = [1000.0]
    conn = await g.connect(dsn)
    lease = g.Lease(conn, "c", "http://c:1", ttl_s=5.0, margin_s=1.0, clock=lambda: now[0])
    assert await lease.try_acquire() is not None
    assert lease.deadline == 1004.0
    now[0] = 1003.9
    assert lease.holds()
    now[0] = 1004.0
    assert not lease.holds()  # no database round trip decides this: a paused process stops here
    with pytest.raises(g.LeadershipLost, match="deadline passed"):
        await lease.renew()
    await conn.close()


async def test_a_released_lease_is_taken_at_once(dsn: str) -> None:
    await _reset(dsn)
    a, b = await _lease(dsn, "a"), await _lease(dsn, "b")
    epoch = await a.try_acquire()
    assert epoch is not None
    await a.release()
    assert not a.holds()
    assert await b.try_acquire() == epoch + 1
    for lease in (a, b):
        await lease.conn.close()


async def test_schema_setup_is_safe_when_members_start_together(dsn: str) -> None:
    await _reset(dsn)
    conns = [await g.connect(dsn) for _ in range(4)]
    await asyncio.gather(*(g.ensure_schema(c) for c in conns))
    assert await conns[0].fetchval("SELECT count(*) FROM dt_lease") == 1
    secrets = await asyncio.gather(*(g.load_or_create_secret(c, lambda: __import__("os").urandom(32)) for c in conns))
    assert len(set(secrets)) == 1  # the first one written wins for every member
    for c in conns:
        await c.close()
    with pytest.raises(asyncpg.PostgresError):
        bad = await g.connect(dsn)
        try:
            await bad.execute("SELECT no_such_column FROM dt_lease")
        finally:
            await bad.close()
