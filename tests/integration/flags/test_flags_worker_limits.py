"""Each resource-limit, profile, drain and local-state flag of ``dt-worker`` changes what a real
worker does: --max-cpu-percent, --max-memory-percent, --max-gpu-percent, --limit-cooldown,
--memory-buffer, --profile, --drain-timeout, --recover, --reset-state.

Workers are built from real command lines (parser -> config_from_args -> build_agent) and talk to a
real in-process coordinator; assertions wait on coordinator state, never on sleeps.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import duckdb
import psutil
import pytest
from flags_support import ROOT, Procs, StartWorker, refusing_port, worker_config, workers_by_id

from distributed_testing.errors import ConfigError
from distributed_testing.protocol import messages as m
from distributed_testing.testing import Cluster, hidden_accelerators, raw_worker, run_cluster, wait_for
from distributed_testing.worker.limits import gpu_unavailable_reason
from distributed_testing.worker.result_store_duckdb import DuckDBResultStore

pytestmark = [pytest.mark.timeout(60)]
NO_GPU = gpu_unavailable_reason()


def noop(*, tags: list[str], **extra: Any) -> dict[str, Any]:
    return {"type": "custom", "config": {"name": "noop"}, "requirements": {"tags": tags}, **extra}


def sleep(seconds: float, *, tags: list[str], **extra: Any) -> dict[str, Any]:
    return {"type": "custom", "config": {"name": "sleep", "parameters": {"seconds": seconds}},
            "requirements": {"tags": tags}, **extra}


async def cli(c: Cluster, *argv: str) -> list[str]:
    return ["--coordinator", c.base_url, "--api-key", await c.create_key("worker"), *argv]


async def worker_state(c: Cluster, worker_id: str) -> tuple[str, str]:
    w = (await workers_by_id(c))[worker_id]
    return w["state"], w["reason"] or ""


async def wait_state(c: Cluster, worker_id: str, state: str, reason: str = "", timeout: float = 20) -> str:
    """Wait until ``worker_id`` is in ``state`` with ``reason`` matching (as the coordinator sees
    it, and as ``GET /api/v1/workers`` - what ``dt workers`` prints - shows it); returns the reason."""
    def now() -> tuple[str, str]:
        w = c.runtime.state.workers[worker_id]
        return w.health, w.health_reason or ""

    try:
        await wait_for(lambda: now()[0] == state and re.search(reason, now()[1]) is not None, timeout=timeout,
                       what=f"{worker_id} to be {state} /{reason}/")
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; last seen {now()}") from None
    listed = await worker_state(c, worker_id)
    assert listed[0] == state and re.search(reason, listed[1]), listed
    return listed[1]


# --------------------------------------------------------------------- --max-memory-percent


@pytest.mark.asyncio
async def test_max_memory_percent_over_the_limit_constrains_the_worker_and_tasks_go_elsewhere(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        await start_cli_worker(c, await cli(c, "--worker-id", "tight", "--tags", "mem", "--max-memory-percent", "0.01"))
        reason = await wait_state(c, "tight", "constrained", r"^memory \d+% > limit 0.01%$")
        [tid] = await c.submit(noop(tags=["mem"]))
        status, task = await c.request("GET", f"/api/v1/tasks/{tid}")
        assert task["state"] == "pending" and "constrained or draining" in task["pending_reason"], (reason, task)

        await start_cli_worker(c, await cli(c, "--worker-id", "roomy", "--tags", "mem", "--max-memory-percent", "100"))
        done = await c.wait(tid)
        assert (done["state"], done["outcome"]["worker_id"]) == ("succeeded", "roomy")
        assert (await worker_state(c, "roomy"))[0] == "ready"


# -------------------------------------------------------------- --max-cpu-percent, --limit-cooldown


def spin(procs: Procs, n: int) -> list[subprocess.Popen[bytes]]:
    return [procs.start(["-c", "while True: pass"], procs.tmp / f"spin{i}.log") for i in range(n)]


@pytest.mark.asyncio
@pytest.mark.serial  # the system-wide CPU must fall back under the limit: no other test beside it
async def test_max_cpu_percent_constrains_under_load_and_the_cooldown_delays_ready(
        tmp_path: Path, start_cli_worker: StartWorker, procs: Procs) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        for wid, cooldown in (("quick", "0"), ("slow", "3600")):
            await start_cli_worker(c, await cli(c, "--worker-id", wid, "--max-cpu-percent", "90",
                                                "--limit-cooldown", cooldown))
        spinners = spin(procs, 2 * (os.cpu_count() or 1))  # every core busy: system-wide CPU near 100 %
        for wid in ("quick", "slow"):
            await wait_state(c, wid, "constrained", r"^cpu \d+% > limit 90%$")
        for p in spinners:
            Procs.stop(p, timeout=5)
        await wait_state(c, "quick", "ready")  # --limit-cooldown 0: ready at the first quiet sample
        reason = await wait_state(c, "slow", "constrained", r"^cooling down for \d+\.\ds more after: cpu \d+% > limit 90%$")
        assert float(reason.split()[3][:-1]) > 3000


# ----------------------------------------------------------------------------- --max-gpu-percent


@pytest.mark.skipif(NO_GPU is None, reason="an NVIDIA GPU is visible here")
def test_max_gpu_percent_without_an_nvidia_gpu_is_refused_at_startup() -> None:
    with pytest.raises(ConfigError, match=r"^--max-gpu-percent: needs an NVIDIA GPU readable through NVML: "):
        worker_config(["--max-gpu-percent", "90"])


@pytest.mark.skipif(NO_GPU is not None, reason=f"no NVIDIA GPU: {NO_GPU}")
@pytest.mark.asyncio
async def test_max_gpu_percent_with_a_gpu_reads_utilisation(tmp_path: Path, start_cli_worker: StartWorker) -> None:
    assert worker_config(["--max-gpu-percent", "90"]).max_gpu_percent == 90
    async with run_cluster(tmp_path, workers=0) as c:
        agent = await start_cli_worker(c, await cli(c, "--worker-id", "g", "--max-gpu-percent", "90"))
        s = await asyncio.to_thread(agent._sampler.sample)
        assert s.gpu_error is None and s.gpu_percent is not None and 0 <= s.gpu_percent <= 100
        assert (await worker_state(c, "g"))[0] == "ready"  # an idle GPU is under 90 %


@pytest.mark.parametrize("flag", ["--max-cpu-percent", "--max-memory-percent", "--max-gpu-percent"])
@pytest.mark.parametrize("value", ["0", "101", "-5"])
def test_percent_limits_reject_values_outside_0_to_100(flag: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"^{flag}: must be a percentage in"):
        worker_config([flag, value])


# ------------------------------------------------------------------------------ --memory-buffer


@pytest.mark.asyncio
async def test_memory_buffer_keeps_tasks_whose_memory_limit_exceeds_the_offer_away(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    vm = psutil.virtual_memory()
    if vm.available / vm.total < 0.4:
        pytest.skip("this machine has less than 40 % memory free")
    total_mb = vm.total / 2**20
    async with run_cluster(tmp_path, workers=0) as c:
        await start_cli_worker(c, await cli(c, "--worker-id", "buffered", "--tags", "mem", "--memory-buffer", "0.25",
                                            "--heartbeat-interval", "0.2"))
        await wait_for(lambda: "available_memory_mb" in c.runtime.state.workers["buffered"].load, what="a memory offer")
        offered = c.runtime.state.workers["buffered"].load["available_memory_mb"]
        assert 0 < offered <= psutil.virtual_memory().available / 2**20 - 0.25 * total_mb + 200  # 200 MB of drift

        [fits, too_big] = await c.submit([noop(tags=["mem"], max_memory_mb=64),
                                          noop(tags=["mem"], max_memory_mb=int(total_mb))])
        assert (await c.wait(fits))["outcome"]["worker_id"] == "buffered"
        status, task = await c.request("GET", f"/api/v1/tasks/{too_big}")
        assert task["state"] == "pending"
        assert re.search(rf"buffered lacks {int(total_mb)} MB memory for the task \(offers \d+ MB", task["pending_reason"])

        await start_cli_worker(c, await cli(c, "--worker-id", "plain", "--tags", "mem"))  # no buffer: no offer
        done = await c.wait(too_big)
        assert (done["state"], done["outcome"]["worker_id"]) == ("succeeded", "plain")


@pytest.mark.asyncio
async def test_task_max_memory_mb_kills_a_task_that_exceeds_it(tmp_path: Path, start_cli_worker: StartWorker) -> None:
    (tmp_path / "test_hog.py").write_text("import time\n\ndef test_hog():\n    held = b'x' * (300 * 2**20)\n"
                                          "    time.sleep(30)\n    assert held\n")
    async with run_cluster(tmp_path, workers=0) as c:
        await start_cli_worker(c, await cli(c, "--worker-id", "w", "--test-root", str(tmp_path)))
        [tid] = await c.submit({"type": "test", "config": {"test_file": "test_hog.py"}, "max_memory_mb": 100,
                                "timeout_s": 40})
        done = await c.wait(tid, timeout=45)
        assert done["state"] == "failed"
        assert done["outcome"]["error"].startswith("memory limit of 100 MB exceeded"), done["outcome"]


@pytest.mark.parametrize("value", ["-0.1", "0.95"])
def test_memory_buffer_must_be_a_fraction_up_to_0_9(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^--memory-buffer: must be a fraction in \[0, 0.9\]"):
        worker_config(["--memory-buffer", value])


# ------------------------------------------------------------------------------------ --profile


def test_profiles_preset_concurrency_timeout_and_limits_and_flags_win() -> None:
    cores = os.cpu_count() or 1
    bench = worker_config(["--profile", "benchmark"])
    assert (bench.max_concurrent_tasks, bench.task_timeout_s, bench.memory_buffer) == (1, 3600, 0.2)
    test = worker_config(["--profile", "test"])
    assert (test.max_concurrent_tasks, test.task_timeout_s, test.max_memory_percent) == (cores, 1800, 90)
    light = worker_config(["--profile", "light"])
    assert (light.max_concurrent_tasks, light.task_timeout_s, light.max_cpu_percent) == (4 * cores, 300, 95)
    mixed = worker_config(["--profile", "light", "--max-concurrent-tasks", "3", "--task-timeout", "5",
                           "--max-cpu-percent", "60"])
    assert (mixed.max_concurrent_tasks, mixed.task_timeout_s, mixed.max_cpu_percent, mixed.max_memory_percent) == (3, 5, 60, 90)
    plain = worker_config([])
    assert (plain.max_concurrent_tasks, plain.task_timeout_s, plain.max_memory_percent) == (1, None, None)


@pytest.mark.asyncio
async def test_profile_light_registers_four_slots_per_core(tmp_path: Path, start_cli_worker: StartWorker) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        await start_cli_worker(c, await cli(c, "--worker-id", "light", "--profile", "light"))
        await start_cli_worker(c, await cli(c, "--worker-id", "bench", "--profile", "benchmark"))
        listed = await workers_by_id(c)
        assert listed["light"]["max_concurrent"] == 4 * (os.cpu_count() or 1)
        assert listed["bench"]["max_concurrent"] == 1


# ------------------------------------------------------------------------------- --drain-timeout


@pytest.mark.asyncio
async def test_drain_finishes_short_tasks_and_hands_back_long_ones_without_a_retry(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        agent = await start_cli_worker(c, await cli(c, "--worker-id", "leaving", "--tags", "d", "--max-concurrent-tasks", "2",
                                                    "--drain-timeout", "1.5"))
        short, long = await c.submit([sleep(0.5, tags=["d"], task_id="short"), sleep(60, tags=["d"], task_id="long")])
        await wait_for(lambda: all(c.runtime.state.tasks[t].state == "running" for t in (short, long)),
                       what="both tasks running")
        drain = asyncio.create_task(agent.drain("test"))
        await wait_for(lambda: c.runtime.state.workers["leaving"].health == "draining", what="draining heartbeat")
        assert (await c.wait(short))["outcome"]["worker_id"] == "leaving"
        handed = await asyncio.wait_for(drain, 20)
        assert handed == [m.TaskRef("long", 1)]
        t = c.runtime.state.tasks["long"]
        assert (t.state, t.retries_used) == ("pending", 0)
        assert "handed back by leaving: drain timeout after 1.5s" in t.history[-1]["cause"]
        await asyncio.wait_for(c.agent_tasks[-1], 10)  # the agent stopped by itself


def test_drain_timeout_is_a_number_of_seconds() -> None:
    assert worker_config([]).drain_timeout_s == 30
    assert worker_config(["--drain-timeout", "0"]).drain_timeout_s == 0
    with pytest.raises(ConfigError, match="^--drain-timeout: must be >= 0"):
        worker_config(["--drain-timeout", "-1"])


# ------------------------------------------------------------------------- --recover, --reset-state


async def crashed_outbox(db: Path, *refs: tuple[str, int]) -> None:
    """An outbox as a worker leaves it when it dies while ``refs`` run and before the result of
    task ``done-<db stem>`` was acknowledged."""
    outbox = DuckDBResultStore(db)
    await outbox.open()
    outbox.running_started([m.TaskRef(t, a) for t, a in refs])
    outbox.add(m.TaskResult(f"done-{db.stem}", 1, "succeeded", 1.0, 2.0))
    await outbox.close()


async def results_for(c: Cluster, task_id: str) -> list[dict[str, Any]]:
    status, body = await c.request("GET", "/api/v1/results", params={"task_id": task_id})
    assert status == 200, body
    return list(body["results"])


@pytest.mark.asyncio
async def test_recover_reports_tasks_a_crash_interrupted_and_without_it_they_are_only_logged(
        tmp_path: Path, start_cli_worker: StartWorker, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="distributed_testing.worker.runs")
    await crashed_outbox(tmp_path / "rec.duckdb", ("ghost", 1))
    await crashed_outbox(tmp_path / "plain.duckdb", ("phantom", 1))
    async with run_cluster(tmp_path, workers=0) as c:
        # before the crash the coordinator gave these attempts to "rec" and "plain" (sessions of the
        # same keys): a result is taken only from the worker that was given its attempt
        keys = {w: await c.create_key("worker") for w in ("rec", "plain")}
        await c.submit([{"task_id": t, "type": "custom", "config": {"name": "noop"}, "requirements": {"tags": [w]}}
                        for t, w in (("ghost", "rec"), ("done-rec", "rec"), ("phantom", "plain"),
                                     ("done-plain", "plain"))])
        async with (raw_worker(c.base_url, keys["rec"], "rec", tags=["rec"], max_concurrent=2),
                    raw_worker(c.base_url, keys["plain"], "plain", tags=["plain"], max_concurrent=2)):
            await wait_for(lambda: all(t.state == "assigned" for t in c.runtime.state.tasks.values()),
                           what="every attempt given before the crash")
        start = ["--coordinator", c.base_url, "--api-key"]
        await start_cli_worker(c, [*start, keys["rec"], "--worker-id", "rec", "--db-path", str(tmp_path / "rec.duckdb"),
                                   "--recover"])
        await wait_for(lambda: "recovery:" in caplog.text, what="the recovery report")
        assert ("recovery: 1 unacknowledged result(s) to re-send; 1 task(s) interrupted by a worker crash "
                "(reported as errors): ghost (attempt 1)") in caplog.text
        await start_cli_worker(c, [*start, keys["plain"], "--worker-id", "plain", "--db-path",
                                   str(tmp_path / "plain.duckdb")])
        assert "1 task(s) were running when this worker last died: phantom (attempt 1); not reported" in caplog.text

        async def reported() -> bool:
            return all([await results_for(c, t) for t in ("ghost", "done-rec", "done-plain")])

        deadline = asyncio.get_running_loop().time() + 20
        while not await reported():
            assert asyncio.get_running_loop().time() < deadline, "results never reached the coordinator"
            await asyncio.sleep(0.05)
        [ghost] = await results_for(c, "ghost")
        assert (ghost["status"], ghost["attempt"], ghost["error"], ghost["output"]) == (
            "error", 1, "interrupted by a worker crash", {"retryable": True})
        assert await results_for(c, "phantom") == []

    for name in ("rec", "plain"):  # the records were consumed: a second start reports nothing
        outbox = DuckDBResultStore(tmp_path / f"{name}.duckdb")
        await outbox.open()
        assert await outbox.take_interrupted() == []
        await outbox.close()


def test_recover_and_reset_state_need_a_db_path(tmp_path: Path) -> None:
    for flag in ("--recover", "--reset-state"):
        with pytest.raises(ConfigError, match=f"^{flag}: needs --db-path"):
            worker_config([flag])
    assert worker_config(["--recover"], {"DT_DB_PATH": str(tmp_path / "w.duckdb")}).recover


def test_reset_state_deletes_the_outbox_journal_and_cache_at_start(tmp_path: Path, procs: Procs) -> None:
    db = tmp_path / "state" / "w.duckdb"
    asyncio.run(crashed_outbox(db, ("ghost", 1)))
    (db.parent / "w.duckdb.journal").mkdir(exist_ok=True)
    cache = db.parent / "w-cache"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / "m.bin").write_bytes(b"x")
    log = tmp_path / "worker.log"
    p = procs.start([str(ROOT / "run_worker_example.py"), "--coordinator", f"http://127.0.0.1:{refusing_port()}",
                     "--api-key", "dtk_x_y", "--reconnect-attempts", "1", "--db-path", str(db), "--reset-state"],
                    log, env=hidden_accelerators(tmp_path), drop_env=["DT_API_KEY", "DT_COORDINATOR_URL", "DT_DB_PATH"])
    assert p.wait(50) == 1, log.read_text()  # nothing listens: gives up after resetting and starting
    text = log.read_text()
    [line] = [ln for ln in text.splitlines() if "--reset-state: deleted" in ln]
    assert all(str(path) in line for path in (db, db.parent / "w.duckdb.journal", cache)), line
    assert not (cache / "models").exists()  # deleted (the confinement makes the directory again, empty, at start)
    with duckdb.connect(str(db), read_only=True) as con:  # a fresh, empty outbox
        assert con.execute("SELECT count(*) FROM worker_results").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM worker_running").fetchone() == (0,)
