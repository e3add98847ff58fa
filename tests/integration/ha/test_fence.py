"""The database fence, proven on a group of real processes: a leader whose write was on its way
to PostgreSQL when it froze must not have that write land after another member took over.

The runtime's own check (``Lease.holds`` before every write) cannot stop such a write: it was
decided and sent while the lease was held. Only the store's fence can (``PostgresStore.set_fence``:
the batch statement checks the lease row when it runs). To hold the write between "sent" and "run"
the test takes ``LOCK TABLE tasks IN SHARE MODE``: that blocks every write to ``tasks`` before its
statement reads anything (table locks are taken before execution), while reads, and so the new
leader's snapshot, go on. The old leader is paused, a standby takes over, the lock is released and
the old leader's statement runs: with the fence it writes nothing; with ``set_fence`` a no-op this
test fails, because the submission lands in the database behind the new leader's back (a task it
never loaded, so never runs)."""

from __future__ import annotations

import asyncio
import json
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from ha_support import HaGroup, Member, db_tasks

from distributed_testing.testing import pg_database_sync, run_sync

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

BLOCKED = ("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'WITH%INSERT INTO tasks%'"
           " AND pid <> pg_backend_pid()")


@pytest.fixture
def group(tmp_path: Path) -> Iterator[HaGroup]:
    with pg_database_sync(prefix="dt_ha_fence") as dsn:
        g = HaGroup(tmp_path, dsn)
        try:
            yield g
        finally:
            g.close()


def _submit(member: Member, key: str, task_id: str) -> int | str:
    """POST one task; the HTTP status, or the transport error's text."""
    body = json.dumps({"task_id": task_id, "type": "custom", "config": {"name": "noop"}}).encode()
    req = urllib.request.Request(member.url + "/api/v1/tasks", data=body, method="POST",
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=90) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError as exc:
        return repr(exc)


async def _blocked_writer(conn: asyncpg.Connection, timeout: float) -> int:
    async with asyncio.timeout(timeout):
        while (pid := await conn.fetchval(BLOCKED)) is None:
            await asyncio.sleep(0.05)
    return int(pid)


async def _finished(conn: asyncpg.Connection, pid: int, timeout: float) -> None:
    """Until backend ``pid`` no longer runs a statement (its client may be paused: PostgreSQL runs
    the statement anyway and leaves the answer in the socket)."""
    async with asyncio.timeout(timeout):
        while await conn.fetchval("SELECT state = 'active' FROM pg_stat_activity WHERE pid = $1", pid):
            await asyncio.sleep(0.05)


def test_a_write_sent_before_a_pause_does_not_land_after_the_takeover(group: HaGroup) -> None:
    a = group.start_member("a")
    group.wait_role(a, "leader")
    b = group.start_member("b")
    group.wait_role(b, "standby")
    admin = group.admin(a)
    admin.submit({"task_id": "before", "type": "custom", "config": {"name": "noop"}})

    async def scenario() -> tuple[int | str, dict[str, Any]]:
        lock = await asyncpg.connect(group.dsn)
        watch = await asyncpg.connect(group.dsn)
        try:
            tx = lock.transaction()
            await tx.start()
            await lock.execute("LOCK TABLE tasks IN SHARE MODE")
            answer = asyncio.create_task(asyncio.to_thread(_submit, a, admin.key, "late"))
            pid = await _blocked_writer(watch, 30)  # the leader sent the write, holding the lease
            a.proc.send_signal(signal.SIGSTOP)
            await asyncio.to_thread(group.wait_role, b, "leader", 10)  # the lease TTL (5 s) and slack
            await tx.commit()  # the old leader's statement runs now, after the lease changed hands
            await _finished(watch, pid, 30)
            in_db = db_tasks(group.dsn)  # before the old leader resumes: what its write did alone
            a.proc.send_signal(signal.SIGCONT)
            return await answer, in_db
        finally:
            a.proc.send_signal(signal.SIGCONT)
            await lock.close()
            await watch.close()

    status, in_db = run_sync(scenario())
    assert "late" not in in_db, f"the replaced leader's write landed after the takeover: {in_db['late']}"
    assert "before" in in_db
    assert not (isinstance(status, int) and 200 <= status < 300), f"the refused submission was acknowledged: {status}"
    group.wait_role(a, "standby", timeout=30)
    assert "the store refused a write after the lease ran out" in a.log_text()
