"""PostgreSQL itself restarts under load (issue 18): a server of the test's own (``pg_private``:
``initdb`` + ``pg_ctl`` on a private port and data directory, never the shared server), two
coordinators on it, two workers with ``--high-availability``, tasks submitted without pause; the
server is stopped as a crash would (``pg_ctl -m immediate``) in the middle and started again.

The coordinators reconnect on their own, and nothing accepted is lost: every task whose
submission was answered 2xx ends ``succeeded`` exactly once with its result kept. A submission
made while the database is down may be refused (503) and retried by the client; that is not an
acceptance.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from chaos_group import HaCluster
from chaos_support import Tally, record_task
from pg_private import private_postgres, why_unavailable

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(why_unavailable() is not None, reason=why_unavailable() or "")]


def test_coordinators_survive_a_postgres_restart_under_load_and_lose_nothing_accepted(tmp_path: Path) -> None:
    with private_postgres() as server:
        cluster = HaCluster(tmp_path, server.create_database("dt_restart"), members=2)
        try:
            cluster.start_group()
            workers = ["pg-w0", "pg-w1"]
            for wid in workers:
                cluster.add_ha_worker(wid, slots=2)
            cluster.wait_registered(workers)
            accepted: list[str] = []
            refused: list[int] = []
            stop = threading.Event()

            def submit() -> None:
                n = 0
                while not stop.is_set() and n < 600:
                    docs = [record_task(f"pg-{n + i:04d}", cluster.exec_log, 0.01, max_retries=3) for i in range(20)]
                    status, body = cluster.api.request("POST", "/api/v1/tasks", json=docs)
                    if status in (200, 201):
                        accepted.extend(t["task_id"] for t in body["tasks"])
                        n += 20
                    else:
                        refused.append(status)
                        time.sleep(0.2)

            t = threading.Thread(target=submit, daemon=True)
            t.start()
            while len(accepted) < 200:
                time.sleep(0.05)
            server.stop("immediate")
            time.sleep(2.0)
            server.start()
            t.join(240)
            stop.set()
            assert len(accepted) == 600, f"accepted {len(accepted)} of 600; refusals {refused[:10]}"
            first = cluster.wait_terminal(accepted, timeout=240)
            tally = Tally("pg-restart").check(cluster, accepted, first)
            tally.assert_clean()
        finally:
            cluster.close()
