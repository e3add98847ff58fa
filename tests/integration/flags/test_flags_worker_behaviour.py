"""Each documented ``dt-worker`` flag and variable changes what a real worker does.

Workers are built from real command lines (``start_cli_worker``: parser -> config_from_args ->
build_agent) and talk to a real in-process coordinator over loopback sockets; tasks run in real
child processes. Assertions read results and coordinator state, never wall-clock durations.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest
from flags_support import StartWorker, worker_config, workers_by_id

from distributed_testing.protocol import messages as m
from distributed_testing.testing import Cluster, raw_worker, run_cluster, wait_for
from distributed_testing.worker.result_store_duckdb import DuckDBResultStore

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


def sleep_task(seconds: float, *, tags: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "custom", "config": {"name": "sleep", "parameters": {"seconds": seconds}},
            "requirements": {"tags": tags or []}, **extra}


def noop_task(*, tags: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "custom", "config": {"name": "noop"}, "requirements": {"tags": tags or []}, **extra}


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def cli(c: Cluster, *argv: str) -> list[str]:
    """The common part of a worker command line: this coordinator and a fresh worker key."""
    return ["--coordinator", c.base_url, "--api-key", await c.create_key("worker"), *argv]


async def wait_all(c: Cluster, ids: list[str], timeout: float = 30) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(c.wait(i, timeout) for i in ids)))


# ------------------------------------------------------------------------------------ --tags


async def test_tags_send_a_task_that_requires_a_tag_only_to_the_worker_with_it(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        await start_cli_worker(c, await cli(c, "--worker-id", "plain"))
        await start_cli_worker(c, await cli(c, "--worker-id", "tagged", "--tags", " special, gpu2 ,,"))
        listed = await workers_by_id(c)
        assert listed["tagged"]["tags"] == ["gpu2", "special"] and listed["plain"]["tags"] == []

        ids = await c.submit([noop_task(tags=["special"]) for _ in range(4)])
        done = await wait_all(c, ids)
        assert [(t["state"], t["outcome"]["worker_id"]) for t in done] == [("succeeded", "tagged")] * 4

        [nobody] = await c.submit(noop_task(tags=["absent-tag"]))
        status, task = await c.request("GET", f"/api/v1/tasks/{nobody}")
        assert status == 200 and task["state"] == "pending"
        assert "lacks tag absent-tag" in task["pending_reason"]


# ---------------------------------------------------------------------- --max-concurrent-tasks


def overlap(results: list[dict[str, Any]]) -> bool:
    a, b = sorted(results, key=lambda r: r["started_at"])
    return b["started_at"] < a["finished_at"]


async def test_max_concurrent_tasks_two_overlap_and_one_serialises(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        await start_cli_worker(c, await cli(c, "--worker-id", "par", "--tags", "par", "--max-concurrent-tasks", "2"))
        await start_cli_worker(c, await cli(c, "--worker-id", "ser", "--tags", "ser", "--max-concurrent-tasks", "1"))
        listed = await workers_by_id(c)
        assert (listed["par"]["max_concurrent"], listed["ser"]["max_concurrent"]) == (2, 1)

        par = await c.submit([sleep_task(0.5, tags=["par"]) for _ in range(2)])
        ser = await c.submit([sleep_task(0.5, tags=["ser"]) for _ in range(2)])
        par_done, ser_done = await wait_all(c, par), await wait_all(c, ser)
        assert {t["state"] for t in par_done + ser_done} == {"succeeded"}
        assert {t["outcome"]["worker_id"] for t in par_done} == {"par"}
        assert {t["outcome"]["worker_id"] for t in ser_done} == {"ser"}
        assert overlap([t["result"] for t in par_done]), "with 2 slots the two sleeps should run at once"
        assert not overlap([t["result"] for t in ser_done]), "with 1 slot the second sleep must wait"


# ----------------------------------------------------------------------------- --task-timeout


async def test_task_timeout_kills_tasks_that_set_no_timeout_of_their_own(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        await start_cli_worker(c, await cli(c, "--worker-id", "strict", "--tags", "strict", "--task-timeout", "0.5"))
        await start_cli_worker(c, await cli(c, "--worker-id", "lenient", "--tags", "lenient"))
        limited, own_timeout, unlimited = await c.submit([
            sleep_task(2.0, tags=["strict"]),
            sleep_task(1.0, tags=["strict"], timeout_s=30),
            sleep_task(1.0, tags=["lenient"]),
        ])
        t_limited, t_own, t_unlimited = await wait_all(c, [limited, own_timeout, unlimited])
        assert t_limited["state"] == "timed_out", t_limited["outcome"]
        assert "timed out after 0.5 s" in t_limited["outcome"]["error"]
        assert t_own["state"] == "succeeded", "a task's own timeout_s takes precedence over --task-timeout"
        assert t_unlimited["state"] == "succeeded", "without --task-timeout the same sleep runs to the end"


# -------------------------------------------------------------------------------- --test-root


async def test_test_root_resolves_test_file_and_rejects_escaping_paths(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    suite, other, outside = tmp_path / "suite", tmp_path / "other", tmp_path / "outside"
    for d in (suite, other, outside):
        d.mkdir()
    (suite / "test_here.py").write_text("def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    (outside / "test_out.py").write_text("def test_out():\n    pass\n")
    async with run_cluster(tmp_path, workers=0) as c:
        await start_cli_worker(c, await cli(c, "--worker-id", "suite", "--tags", "suite", "--test-root", str(suite)))
        await start_cli_worker(c, await cli(c, "--worker-id", "other", "--tags", "other", "--test-root", str(other)))
        # '..' climbing out is refused at submit already; whether an absolute path lies under the
        # root only the worker knows
        status, body = await c.request("POST", "/api/v1/tasks", json={
            "type": "test", "config": {"test_file": "../outside/test_out.py"}, "requirements": {"tags": ["suite"]}})
        assert status == 400 and body["errors"][0]["field"] == "config.test_file", body
        ids = await c.submit([
            {"type": "test", "config": {"test_file": "test_here.py"}, "requirements": {"tags": ["suite"]}},
            {"type": "test", "config": {"test_file": str(outside / "test_out.py")}, "requirements": {"tags": ["suite"]}},
            {"type": "test", "config": {"test_file": "test_here.py"}, "requirements": {"tags": ["other"]}},
        ])
        here, absolute, elsewhere = await wait_all(c, ids, timeout=60)
        assert here["state"] == "succeeded", here["outcome"]
        assert here["result"]["output"]["passed"] == 2
        assert absolute["state"] == "error", absolute["outcome"]
        assert "outside the test root" in absolute["outcome"]["error"]
        assert elsewhere["state"] == "error"
        assert f"not found under the test root {other.resolve()}" in elsewhere["outcome"]["error"]


# ----------------------------------------------------------------------- --heartbeat-interval


async def test_heartbeat_interval_sets_how_often_the_coordinator_hears_from_the_worker(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        beats: dict[str, list[float]] = {"fast": [], "slow": []}
        real = c.runtime.state.heartbeat

        def counting(worker_id: str, hb: m.Heartbeat, now: float) -> Any:
            beats.setdefault(worker_id, []).append(now)
            return real(worker_id, hb, now)

        c.runtime.state.heartbeat = counting  # type: ignore[method-assign]
        await start_cli_worker(c, await cli(c, "--worker-id", "slow", "--heartbeat-interval", "30"))
        await start_cli_worker(c, await cli(c, "--worker-id", "fast", "--heartbeat-interval", "0.1"))
        seen_before = c.runtime.state.workers["fast"].last_seen
        await wait_for(lambda: len(beats["fast"]) >= 6, timeout=20, what="six heartbeats from the fast worker")
        assert beats["slow"] == [], "a worker with --heartbeat-interval 30 sent a heartbeat within a second"
        assert c.runtime.state.workers["fast"].last_seen > seen_before
        gaps = sorted(b - a for a, b in zip(beats["fast"], beats["fast"][1:], strict=False))
        assert gaps[len(gaps) // 2] >= 0.05, f"heartbeats arrive faster than the interval allows: {gaps}"


# --------------------------------------------------------------------------- --db-path / DT_DB_PATH


def outbox_rows(path: Path) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute("SELECT task_id, attempt, status, acked_at IS NOT NULL FROM worker_results "
                           "ORDER BY task_id").fetchall()
    finally:
        con.close()


async def stop_worker(c: Cluster, worker_id: str) -> None:
    idx = next(i for i, a in enumerate(c.agents) if a.config.worker_id == worker_id)
    c.agents[idx].stop()
    await asyncio.wait_for(c.agent_tasks[idx], 20)


async def test_db_path_and_dt_db_path_keep_results_in_the_workers_duckdb_file(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    flag_db, env_db = tmp_path / "flag" / "w.duckdb", tmp_path / "env" / "w.duckdb"
    async with run_cluster(tmp_path, workers=0) as c:
        await start_cli_worker(c, await cli(c, "--worker-id", "flagdb", "--tags", "flagdb", "--db-path", str(flag_db)))
        await start_cli_worker(c, ["--coordinator", c.base_url, "--worker-id", "envdb", "--tags", "envdb"],
                               env={"DT_API_KEY": await c.create_key("worker"), "DT_DB_PATH": str(env_db)})
        # no-ops: they usually end before their assignment's confirm, and are acknowledged before
        # it (settled, never kept for a re-send), yet are in the file's history all the same
        a, b = await c.submit([noop_task(task_id="on-flag-db", tags=["flagdb"]),
                               noop_task(task_id="on-env-db", tags=["envdb"])])
        assert [t["state"] for t in await wait_all(c, [a, b])] == ["succeeded", "succeeded"]
        await stop_worker(c, "flagdb")
        await stop_worker(c, "envdb")
    assert outbox_rows(flag_db) == [("on-flag-db", 1, "succeeded", True)]
    assert outbox_rows(env_db) == [("on-env-db", 1, "succeeded", True)]


CRASHING_WORKER = """
import asyncio, os, sys
from pathlib import Path
from distributed_testing.protocol import messages as m
from distributed_testing.worker.result_store_duckdb import DuckDBResultStore

async def main():
    outbox = DuckDBResultStore(Path(sys.argv[1]))
    await outbox.open()
    await outbox.add(m.TaskResult(task_id=sys.argv[2], attempt=1, status="succeeded", started_at=1.0,
                                  finished_at=2.0, output={"note": "kept"}))
    os._exit(0)  # dies before any acknowledgement (and before a checkpoint)

asyncio.run(main())
"""


async def resent_results(c: Cluster, task_id: str) -> list[Any]:
    """Wait until the coordinator holds a result for ``task_id`` (sent by a worker's outbox)."""
    rows: list[Any] = []

    async def poll() -> None:
        nonlocal rows
        while True:
            status, body = await c.request("GET", "/api/v1/results", params={"task_id": task_id})
            assert status == 200, body
            if body["results"]:
                rows = list(body["results"])
                return
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), 15)
    return rows


async def test_db_path_results_of_a_crashed_run_are_resent_after_restart(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    db = tmp_path / "w.duckdb"
    crashed = await asyncio.create_subprocess_exec(sys.executable, "-c", CRASHING_WORKER, str(db), "from-crashed-run")
    assert await asyncio.wait_for(crashed.wait(), 60) == 0
    async with run_cluster(tmp_path, workers=0) as c:
        # before the crash the coordinator had given attempt 1 to "durable" (a session of the same key):
        # a result is taken only from the worker that was given its attempt
        key = await c.create_key("worker")
        await c.submit(noop_task(task_id="from-crashed-run", tags=["durable"]))
        async with raw_worker(c.base_url, key, "durable", tags=["durable"]):
            await wait_for(lambda: c.runtime.state.tasks["from-crashed-run"].worker_id == "durable",
                           what="attempt 1 given to durable")
        await start_cli_worker(c, ["--coordinator", c.base_url, "--api-key", key, "--worker-id", "durable",
                                   "--db-path", str(db)])
        rows = await resent_results(c, "from-crashed-run")
        assert [(r["worker_id"], r["status"], r["output"]) for r in rows] == [("durable", "succeeded", {"note": "kept"})]
        await stop_worker(c, "durable")
    assert outbox_rows(db) == [("from-crashed-run", 1, "succeeded", True)]


async def test_db_path_unacked_results_survive_a_clean_stop(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    outbox = DuckDBResultStore(db)  # e.g. a worker stopped while the coordinator was unreachable
    await outbox.open()
    await outbox.add(m.TaskResult(task_id="from-last-run", attempt=1, status="succeeded", started_at=1.0,
                                  finished_at=2.0, output={"note": "kept"}, worker_id="durable"))
    await outbox.close()
    assert outbox_rows(db) == [("from-last-run", 1, "succeeded", False)]  # on disk, not acknowledged
    reopened = DuckDBResultStore(db)
    await reopened.open()
    try:
        assert [r.task_id for r in await reopened.unacked()] == ["from-last-run"]
    finally:
        await reopened.close()


# ------------------------------------------------------- --name / DT_WORKER_NAME / --worker-id


async def test_name_and_worker_id_are_what_the_coordinator_lists(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        await start_cli_worker(c, await cli(c, "--worker-id", "by-flag", "--name", "flag-name"),
                               env={"DT_WORKER_NAME": "ignored-env-name"})
        await start_cli_worker(c, await cli(c, "--worker-id", "by-env"), env={"DT_WORKER_NAME": "env-name"})
        anon = await start_cli_worker(c, await cli(c))
        listed = await workers_by_id(c)
        assert listed["by-flag"]["name"] == "flag-name"
        assert listed["by-env"]["name"] == "env-name"
        assert listed[anon.config.worker_id]["name"] == socket.gethostname()
        assert anon.config.worker_id.startswith("worker-") and set(listed) == {"by-flag", "by-env", anon.config.worker_id}


async def test_worker_id_lets_a_restarted_worker_have_its_tasks_reconciled(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        argv = await cli(c, "--worker-id", "stable")
        await start_cli_worker(c, argv)
        [tid] = await c.submit(sleep_task(30))
        await wait_for(lambda: c.runtime.state.tasks[tid].state == "running", timeout=20, what="the task to run")
        await stop_worker(c, "stable")
        await wait_for(lambda: not c.runtime.state.workers["stable"].connected, timeout=10, what="the disconnect")
        assert c.runtime.state.tasks[tid].state == "running"  # still inside the (default 10 s) grace
        await start_cli_worker(c, argv)  # same --worker-id: the coordinator knows it forgot the task
        task = await c.wait(tid, timeout=10)
        assert task["state"] == "error"
        assert task["outcome"]["error"] == "worker restarted without this task"


# ------------------------------------------------------- DT_COORDINATOR_URL / DT_API_KEY, precedence


async def test_coordinator_url_and_api_key_variables_connect_a_worker(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        await start_cli_worker(c, ["--worker-id", "from-env"],
                               env={"DT_COORDINATOR_URL": c.base_url, "DT_API_KEY": await c.create_key("worker")})
        assert c.runtime.sessions["from-env"].key_id  # authenticated with the variable's key


async def test_flags_win_over_coordinator_url_and_api_key_variables(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        key = await c.create_key("worker")
        await start_cli_worker(c, ["--worker-id", "flags", "--coordinator", c.base_url, "--api-key", key],
                               env={"DT_COORDINATOR_URL": closed_port_url(), "DT_API_KEY": "dtk_bogus_key"})
        assert c.runtime.sessions["flags"].key_id == key.split("_")[1]


# ------------------------------------------------------------------------------ --token / --token-file


async def issue(c: Cluster, key: str) -> dict[str, Any]:
    status, body = await c.request("POST", "/api/v1/auth/token", key=key)
    assert status == 200, body
    return dict(body)


@pytest.mark.timeout(45)
async def test_token_worker_renews_and_outlives_its_first_token(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    async with run_cluster(tmp_path, workers=0, token_ttl_s=3) as c:
        first = await issue(c, await c.create_key("worker"))
        await start_cli_worker(c, ["--coordinator", c.base_url, "--token", first["token"], "--worker-id", "jwt"])
        session = c.runtime.sessions["jwt"]
        assert session.token_exp == first["expires_at"]  # authenticated with the JWT, not a key
        await wait_for(lambda: (session.token_exp or 0) > first["expires_at"], timeout=20,
                       what="the worker to renew its token over the live session")
        await wait_for(lambda: c.runtime.clock() > first["expires_at"] + 1, timeout=20,
                       what="the first token to be well past its expiry")
        assert c.runtime.sessions.get("jwt") is session, "the session was dropped when the first token expired"
        [tid] = await c.submit(noop_task())
        task = await c.wait(tid, timeout=20)
        assert (task["state"], task["outcome"]["worker_id"]) == ("succeeded", "jwt")


async def test_token_file_is_read_at_start_and_again_at_each_reconnect(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    token_file = tmp_path / "worker.jwt"
    async with run_cluster(tmp_path, workers=0) as c:
        first = await issue(c, await c.create_key("worker"))
        token_file.write_text(first["token"] + "\n")
        await start_cli_worker(c, ["--coordinator", c.base_url, "--token-file", str(token_file),
                                   "--worker-id", "filed", "--reconnect-interval", "0.05"],
                               env={"DT_API_KEY": c.admin_key})  # an explicit token file beats the variable
        s1 = c.runtime.sessions["filed"]
        assert (s1.key_id, s1.token_exp) == (first["key_id"], first["expires_at"])

        second = await issue(c, await c.create_key("worker"))
        token_file.write_text(second["token"])  # rotated by an external tool, to another key
        s1.close("test: force a reconnect")
        # the id "filed" is bound to the first key until an admin releases it (the worker retries meanwhile)
        await wait_for(lambda: not c.runtime.state.workers["filed"].connected, what="the disconnect")
        status, body = await c.request("POST", "/api/v1/workers/filed/release")
        assert status == 200, body
        await wait_for(lambda: c.runtime.sessions.get("filed") not in (None, s1), timeout=20,
                       what="the worker to reconnect")
        assert c.runtime.sessions["filed"].key_id == second["key_id"]


# ---------------------------------------------------------------------------- --reconnect-interval


async def test_reconnect_interval_is_the_first_backoff_delay_and_doubles(
        fast_hardware: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from distributed_testing.retry import RetriesExhausted, retry_async
    from distributed_testing.worker import agent as agent_mod
    from distributed_testing.worker.factory import build_agent

    slept: list[float] = []
    attempts = 0

    async def fake_sleep(d: float) -> None:
        slept.append(d)
        await asyncio.sleep(0)

    async def recording_retry(op: Any, **kw: Any) -> Any:
        async def counted() -> Any:
            nonlocal attempts
            attempts += 1
            return await op()
        return await retry_async(counted, **{**kw, "sleep": fake_sleep})

    monkeypatch.setattr(agent_mod, "retry_async", recording_retry)
    for interval in (0.05, 2.5):
        slept.clear()
        attempts = 0
        config = worker_config(["--coordinator", closed_port_url(), "--api-key", "dtk_x_y",
                                "--reconnect-attempts", "4", "--reconnect-interval", str(interval)])
        agent = await build_agent(config)
        with pytest.raises(RetriesExhausted):
            await asyncio.wait_for(agent.run(), 30)
        assert attempts == 4
        assert len(slept) == 3
        for n, d in enumerate(slept):  # base * 2**n, +-20 % jitter
            assert interval * 2 ** n * 0.8 <= d <= interval * 2 ** n * 1.2, (interval, slept)
