"""``dt-worker --recover --reset-state`` (the worker guide's manual recovery): report first, reset
after. A real worker process reports what ``--recover`` reports (an unacknowledged result, and a
task a crash interrupted as a retryable error), waits for the coordinator's acknowledgements,
deletes its local state and serves from a fresh one; with nobody to report to it deletes nothing.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from flags_support import ROOT, Procs, refusing_port, worker_config

from distributed_testing.protocol import messages as m
from distributed_testing.testing import hidden_accelerators, raw_worker, run_cluster, wait_for
from distributed_testing.worker.result_store_duckdb import DuckDBResultStore

pytestmark = [pytest.mark.timeout(90)]
DROP = ["DT_API_KEY", "DT_API_KEY_FILE", "DT_COORDINATOR_URL", "DT_DB_PATH"]


async def crashed_outbox(db: Path) -> None:
    """An outbox as a worker leaves it when it dies while task ``ghost`` runs and before the
    result of task ``done`` was acknowledged; plus a cache file."""
    db.parent.mkdir(parents=True, exist_ok=True)
    outbox = DuckDBResultStore(db)
    await outbox.open()
    outbox.running_started([m.TaskRef("ghost", 1)])
    outbox.add(m.TaskResult("done", 1, "succeeded", 1.0, 2.0))
    await outbox.close()
    (db.parent / f"{db.stem}-cache").mkdir()
    (db.parent / f"{db.stem}-cache" / "model.bin").write_bytes(b"x")


def outbox_rows(db: Path) -> list[tuple[str, int, str]]:
    with duckdb.connect(str(db), read_only=True) as con:
        return [(str(t), int(a), str(s)) for t, a, s in
                con.execute("SELECT task_id, attempt, status FROM worker_results ORDER BY task_id, attempt").fetchall()]




def test_recover_and_reset_state_together_are_accepted(tmp_path: Path) -> None:
    config = worker_config(["--db-path", str(tmp_path / "w.duckdb"), "--recover", "--reset-state"])
    assert config.recover and config.reset_state


@pytest.mark.asyncio
async def test_recover_with_reset_state_reports_then_resets_then_serves(tmp_path: Path, procs: Procs) -> None:
    db = tmp_path / "state" / "w.duckdb"
    await crashed_outbox(db)
    # the raw worker's close disconnects rw at once; its restarted process must register within
    # the grace, or the coordinator loses rw and gives ``done`` to it again as attempt 2: the
    # default 10 s was too short for a worker's start under a full parallel run's load
    async with run_cluster(tmp_path, workers=0, worker_grace_s=120.0) as c:
        key = await c.create_key("worker")
        await c.submit([{"task_id": t, "type": "custom", "config": {"name": "noop"}, "max_retries": 1,
                         "requirements": {"tags": ["rw"]}} for t in ("ghost", "done")])
        async with raw_worker(c.base_url, key, "rw", tags=["rw"], max_concurrent=2):  # the run that crashed
            await wait_for(lambda: all(t.state == "assigned" for t in c.runtime.state.tasks.values()),
                           what="both attempts given to rw before its crash")
        log = tmp_path / "worker.log"
        p = procs.start([str(ROOT / "run_worker_example.py"), "--coordinator", c.base_url, "--worker-id", "rw",
                         "--tags", "rw", "--db-path", str(db), "--recover", "--reset-state", "--heartbeat-interval",
                         "0.5", "--api-key", key], log, env=hidden_accelerators(tmp_path), drop_env=DROP)
        done, ghost = await c.wait("done", 60), await c.wait("ghost", 60)
        assert (done["state"], done["attempt"]) == ("succeeded", 1), done  # its result came from the old outbox
        assert (ghost["state"], ghost["attempt"], ghost["outcome"]["worker_id"]) == ("succeeded", 2, "rw"), ghost
        status, body = await c.request("GET", "/api/v1/results", params={"task_id": "ghost"})
        assert status == 200
        first = next(r for r in body["results"] if r["attempt"] == 1)
        assert (first["status"], first["error"]) == ("error", "interrupted by a worker crash")
        assert Procs.stop(p) == 0, log.read_text()
    text = log.read_text()
    steps = ["recovery: 1 unacknowledged result(s) to re-send; 1 task(s) interrupted by a worker crash",
             "--recover --reset-state: every recovered result is acknowledged by the coordinator; resetting",
             f"--reset-state: deleted {db}"]
    at = [text.find(s) for s in steps]
    assert all(i >= 0 for i in at) and at == sorted(at), text
    assert text.count("registered with coordinator as rw") == 2  # the reporting session, then the fresh one
    assert outbox_rows(db) == [("ghost", 2, "succeeded")], text  # a fresh outbox: the old rows are gone
    assert not (db.parent / "w-cache" / "model.bin").exists()


def test_recover_with_reset_state_deletes_nothing_it_could_not_report(tmp_path: Path, procs: Procs) -> None:
    import asyncio

    db = tmp_path / "state" / "w.duckdb"
    asyncio.run(crashed_outbox(db))
    log = tmp_path / "worker.log"
    p = procs.start([str(ROOT / "run_worker_example.py"), "--coordinator", f"http://127.0.0.1:{refusing_port()}",
                     "--reconnect-attempts", "1", "--db-path", str(db), "--recover", "--reset-state", "--api-key", "dtk_x_y"],
                    log, env=hidden_accelerators(tmp_path), drop_env=DROP)
    assert p.wait(60) == 1, log.read_text()  # nothing listens: gives up, keeps everything
    assert "--reset-state: deleted" not in log.read_text()
    assert outbox_rows(db) == [("done", 1, "succeeded"), ("ghost", 1, "error")]
    assert (db.parent / "w-cache" / "model.bin").exists()
