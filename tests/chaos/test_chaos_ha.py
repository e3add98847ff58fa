"""Chaos over a coordinator group (issue 18): three coordinators on one PostgreSQL database, four
workers with ``--high-availability``, 2,000 tasks submitted through every member; the dispatching
coordinator is SIGKILLed five times during the run and restarted each time.

Every accepted task must end ``succeeded`` exactly once with its result kept (``Tally``); the
time from each kill to the next assignment anywhere in the group is printed (p50 and max: the
goal is 3 s; reported, not asserted, as timing belongs in benchmarks).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest
from chaos_group import GroupRest, HaCluster
from chaos_support import Tally, record_task

from distributed_testing.testing import pg_database_sync, wait_until

TASKS = 2000
KILLS = 5
WORKERS = 4

pytestmark = pytest.mark.timeout(600)


def test_group_loses_nothing_and_records_nothing_twice_across_five_leader_kills(tmp_path: Path) -> None:
    with pg_database_sync(prefix="dt_chaos_ha") as db_url:
        cluster = HaCluster(tmp_path, db_url, members=3)
        try:
            cluster.start_group()
            workers = [f"ha-w{i}" for i in range(WORKERS)]
            for wid in workers:
                cluster.add_ha_worker(wid, slots=2)
            cluster.wait_registered(workers)
            # no-op and short sleeps, in lists of 100, each list through the next member in turn
            docs = [record_task(f"ha-{i:04d}", cluster.exec_log, 0.0 if i % 2 else 0.02 * (i % 5), max_retries=3)
                    for i in range(TASKS)]
            chunks = [docs[i:i + 100] for i in range(0, TASKS, 100)]
            ids: list[str] = []

            def submit(n: int) -> None:
                member = cluster.urls[n % len(cluster.urls)]
                status, body = GroupRest([member, *[u for u in cluster.urls if u != member]], cluster.api.key) \
                    .request("POST", "/api/v1/tasks", json=chunks[n])
                assert status in (200, 201), (status, body)
                ids.extend(t["task_id"] for t in body["tasks"])

            for n in range(len(chunks) // 2):
                submit(n)
            for k in range(KILLS):  # each kill once the group has made progress since the last one
                done_before = _finished(cluster)
                wait_until(lambda before=done_before: _finished(cluster) >= before + 20, 120,  # type: ignore[misc]
                           "progress before the next kill")
                _kill_leader(cluster)
                for n in range(len(chunks) // 2 + 2 * k, min(len(chunks), len(chunks) // 2 + 2 * k + 2)):
                    submit(n)
            for n in range(len(chunks) // 2 + 2 * KILLS, len(chunks)):
                submit(n)
            first = cluster.wait_terminal(ids, timeout=300)
            tally = Tally("ha-group").check(cluster, ids, first)
            times = cluster.failover_times({t: cluster.api.ok("GET", f"/api/v1/tasks/{t}", params={"result": "0"})
                                            for t in ids})
            tally.extra.update(kills=len(cluster.kills), failover_p50_s=round(statistics.median(times), 3) if times else None,
                               failover_max_s=round(max(times), 3) if times else None,
                               failover_s=[round(t, 3) for t in times])
            print("\n" + tally.summary(), flush=True)
            tally.assert_clean()
            assert len(cluster.kills) == KILLS
        finally:
            cluster.close()


def _finished(cluster: HaCluster) -> int:
    """Tasks that reached an outcome so far, in the whole group (asked of whichever member leads)."""
    counts = cluster.api.ok("GET", "/healthz")["tasks_by_state"]
    return sum(counts.get(state, 0) for state in ("succeeded", "failed", "error", "timed_out", "cancelled"))


def _kill_leader(cluster: HaCluster) -> int:
    """SIGKILL the member that is dispatching, then start it again (it rejoins as a standby)."""
    wait_until(lambda: cluster.leader() is not None, 60, "a leader")
    i = cluster.leader()
    assert i is not None
    cluster.kill_member(i)
    time.sleep(0.5)
    cluster.start_member(i)
    return 1
