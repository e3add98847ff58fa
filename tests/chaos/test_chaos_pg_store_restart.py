"""PostgresStore while its server stops and starts again under load (a private server: a crash,
``pg_ctl stop -m immediate``, and a clean ``-m fast`` stop): appends made meanwhile wait, the store
reconnects by itself, every append is acknowledged, and every acknowledged record is there after.
(The coordinators on top of it are tested in the HA chaos tests.)"""

from __future__ import annotations

import asyncio

import pytest
from pg_private import private_postgres, why_unavailable

from distributed_testing.coordinator.core.rows import TaskRow
from distributed_testing.coordinator.store.base import TaskQuery
from distributed_testing.coordinator.store.postgres import PostgresStore
from distributed_testing.testing import wait_for

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def task(i: int) -> TaskRow:
    return TaskRow(f"t{i:06d}", "custom", "pending", 1, 0, float(i), float(i), "d", {"type": "custom"}, seq=i + 1)


@pytest.mark.parametrize("mode", ["immediate", "fast"])
@pytest.mark.asyncio
async def test_appends_survive_a_server_restart_with_nothing_acknowledged_lost(mode: str) -> None:
    why = why_unavailable()
    if why:
        pytest.skip(why)
    with private_postgres() as server:
        url = await asyncio.to_thread(server.create_database, "dt")
        store = PostgresStore(url, reconnect_s=60.0)
        await store.open()
        watch = asyncio.create_task(store.watch())
        acked: list[int] = []
        stop = asyncio.Event()

        async def appender(first: int) -> None:
            i = first
            while not stop.is_set():
                await store.append([task(i)])
                acked.append(i)
                i += 4

        load = [asyncio.create_task(appender(k)) for k in range(4)]
        try:
            await wait_for(lambda: len(acked) >= 200, timeout=30, what="appends before the restart")
            await asyncio.to_thread(server.stop, mode)
            before = len(acked)
            await asyncio.sleep(0.5)  # appends keep coming while the server is down: they must wait
            assert len(acked) <= before + 4  # at most the ones already being committed at the stop
            await asyncio.to_thread(server.start)
            await wait_for(lambda: len(acked) >= before + 200, timeout=60, what="appends after the restart")
        finally:
            stop.set()
            done = await asyncio.gather(*load, return_exceptions=True)
        assert all(r is None for r in done), done  # no append failed
        assert not watch.done()
        await store.close()
        await asyncio.wait_for(watch, 10)  # returns once closed, raising nothing

        again = PostgresStore(url)
        await again.open()
        try:
            page = await again.query_tasks(TaskQuery(limit=0))
            stored = await again.get_tasks([f"t{i:06d}" for i in acked])
        finally:
            await again.close()
        assert len(stored) == len(acked) == page.total
