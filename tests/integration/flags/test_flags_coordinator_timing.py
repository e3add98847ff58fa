"""``dt-coordinator`` --token-ttl, --heartbeat-interval, --worker-ttl, --max-heartbeat-interval and
--worker-grace change what a real coordinator does. The coordinator runs in-process on port 0 with a config built by the
real parser (``build_parser().parse_args`` -> ``config_from_args``); workers are real agents or
hand-driven sessions that speak the signed protocol."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from flags_support import StartWorker, raw_worker, workers_by_id

from distributed_testing.cli import coordinator as coord_cli
from distributed_testing.config import CoordinatorConfig
from distributed_testing.coordinator.runtime import RUNTIME
from distributed_testing.coordinator.store.memory import MemoryStore
from distributed_testing.errors import ConfigError
from distributed_testing.testing import Cluster, start_coordinator, wait_for
from distributed_testing.worker.session import SessionRejected

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


def coordinator_config(tmp: Path, *flags: str) -> CoordinatorConfig:
    argv = ["--port", "0", "--db-path", "memory://", "--admin-key-file", str(tmp / "admin.key"), *flags]
    return coord_cli.config_from_args(coord_cli.build_parser().parse_args(argv), {})


@contextlib.asynccontextmanager
async def coordinator(tmp: Path, *flags: str) -> AsyncIterator[Cluster]:
    """A coordinator started with ``dt-coordinator FLAGS`` (bound to 127.0.0.1:0, memory store)."""
    config = coordinator_config(tmp, *flags)
    runner, url = await start_coordinator(config, MemoryStore())
    http = aiohttp.ClientSession()
    c = Cluster(url, config.admin_key_path.read_text().strip(), runner.app[RUNTIME], http, tmp=tmp)
    try:
        yield c
    finally:
        for a in c.agents:
            a.stop()
        for t in c.agent_tasks:
            with contextlib.suppress(Exception):
                await t
        await http.close()
        await runner.cleanup()


async def token_lifetime(c: Cluster) -> float:
    before = time.time()
    status, body = await c.request("POST", "/api/v1/auth/token")
    assert status == 200, body
    return float(body["expires_at"]) - before


# ------------------------------------------------------------------------------ --token-ttl


async def test_token_ttl_sets_the_lifetime_of_issued_tokens(tmp_path: Path) -> None:
    async with coordinator(tmp_path / "a", "--token-ttl", "5") as short:
        assert 3.5 <= await token_lifetime(short) <= 5.0
    async with coordinator(tmp_path / "b") as default:
        assert 898.5 <= await token_lifetime(default) <= 900.0


@pytest.mark.parametrize("ttl", ["0.5", "1.5", "0"])
async def test_token_ttl_that_a_token_cannot_carry_is_refused_at_startup(tmp_path: Path, ttl: str) -> None:
    """JWT times are whole seconds: a --token-ttl the coordinator could not issue tokens for is
    refused when it starts (usage error or ConfigError naming the flag), never at the first
    POST /api/v1/auth/token. (A float below 1 used to be accepted and made every request 400.)"""
    try:
        coordinator_config(tmp_path, "--token-ttl", ttl)
    except SystemExit as exc:
        assert exc.code == 2
        return
    except ConfigError as exc:
        assert "--token-ttl" in str(exc)
        return
    async with coordinator(tmp_path, "--token-ttl", ttl) as c:  # accepted: then tokens must work
        status, body = await c.request("POST", "/api/v1/auth/token")
        assert status == 200, body


# ----------------------------------------------------------------------- --heartbeat-interval


async def test_heartbeat_interval_is_announced_and_a_silent_peer_is_closed_after_its_ttl(tmp_path: Path) -> None:
    """The coordinator never pings: a peer that sends nothing (not even pings) is dropped by the
    TTL alone, the one rule that decides death."""
    async with coordinator(tmp_path, "--heartbeat-interval", "0.3", "--worker-ttl", "1") as c:
        key = await c.create_key("worker")
        async with raw_worker(c.base_url, key, "silent", autoping=False) as (ws, registered):
            assert (registered.heartbeat_interval_s, registered.worker_ttl_s) == (0.3, 1.0)
            frame = await ws.receive(timeout=10)  # no ping ever comes: the close is the next frame
            assert frame.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), frame
            assert not c.runtime.state.workers["silent"].connected
            assert (await workers_by_id(c))["silent"]["state"] == "disconnected"


async def test_heartbeat_interval_is_the_interval_of_workers_that_ask_for_none(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    async with coordinator(tmp_path, "--heartbeat-interval", "0.2", "--worker-ttl", "1") as c:
        agent = await start_cli_worker(c, ["--coordinator", c.base_url, "--api-key", await c.create_key("worker"),
                                           "--worker-id", "w"])
        assert agent.liveness == (0.2, 1.0)
        beats: list[float] = []
        real = c.runtime.state.heartbeat

        def counting(worker_id: str, hb: Any, now: float) -> Any:
            beats.append(now)
            return real(worker_id, hb, now)

        c.runtime.state.heartbeat = counting  # type: ignore[method-assign]
        await wait_for(lambda: len(beats) >= 5, timeout=10, what="five heartbeats at the coordinator's interval")


async def test_default_heartbeat_interval_and_ttl_are_announced(tmp_path: Path) -> None:
    async with coordinator(tmp_path) as c:
        async with raw_worker(c.base_url, await c.create_key("worker"), "w") as (_, registered):
            assert (registered.heartbeat_interval_s, registered.worker_ttl_s) == (1.0, 3.0)


async def test_liveness_flags_that_contradict_each_other_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--worker-ttl: must be at least twice --heartbeat-interval \(1s\)"):
        coordinator_config(tmp_path, "--worker-ttl", "1")
    with pytest.raises(ConfigError, match=r"^--max-heartbeat-interval: must be at least --heartbeat-interval \(5s\)"):
        coordinator_config(tmp_path, "--heartbeat-interval", "5", "--worker-ttl", "15", "--max-heartbeat-interval", "2")
    defaults = coordinator_config(tmp_path)
    assert (defaults.heartbeat_interval_s, defaults.worker_ttl_s, defaults.max_heartbeat_interval_s) == (1.0, 3.0, 60.0)


# ------------------------------------------------------------------------------ --worker-ttl


async def test_worker_ttl_declares_a_silent_worker_lost(tmp_path: Path, start_cli_worker: StartWorker) -> None:
    async with coordinator(tmp_path, "--worker-ttl", "1", "--heartbeat-interval", "0.2") as c:
        await start_cli_worker(c, ["--coordinator", c.base_url, "--api-key", await c.create_key("worker"),
                                   "--worker-id", "beating", "--heartbeat-interval", "0.2"])
        async with raw_worker(c.base_url, await c.create_key("worker"), "silent"):  # sends nothing after register
            registered_at = c.runtime.state.workers["silent"].first_seen
            await wait_for(lambda: not c.runtime.state.workers["silent"].connected, timeout=8,
                           what="a worker silent for longer than --worker-ttl 1 to be declared lost")
            listed = await workers_by_id(c)
            assert listed["silent"]["state"] == "disconnected"
            assert c.runtime.clock() - registered_at > 1.0
            assert listed["beating"]["state"] == "ready", "a worker that heartbeats must not be declared lost"


# ------------------------------------------------------------------------ --max-heartbeat-interval


async def test_max_heartbeat_interval_refuses_a_longer_interval_at_registration_on_both_sides(
        tmp_path: Path, start_cli_worker: StartWorker, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    async with coordinator(tmp_path, "--max-heartbeat-interval", "5") as c:
        key = await c.create_key("worker")
        slow = await start_cli_worker(c, ["--coordinator", c.base_url, "--api-key", key, "--worker-id", "slow",
                                          "--heartbeat-interval", "10"], wait=False)
        with pytest.raises(SessionRejected, match="above this coordinator's maximum of 5s"):
            await asyncio.wait_for(c.agent_tasks[-1], 20)  # refused: no reconnect loop, exit 2 in dt-worker
        assert not slow.registered.is_set() and "slow" not in c.runtime.state.workers
        assert c.runtime.stats["refused_heartbeat_interval"] == 1
        coordinator_line = ("refused register of worker 'slow': a heartbeat interval of 10s is above this "
                            "coordinator's maximum of 5s (--max-heartbeat-interval)")
        assert coordinator_line in caplog.text
        assert "coordinator refused this worker's heartbeat interval: a heartbeat interval of 10s" in caplog.text
        ok = await start_cli_worker(c, ["--coordinator", c.base_url, "--api-key", key, "--worker-id", "ok",
                                        "--heartbeat-interval", "5"])
        assert ok.liveness == (5.0, 15.0)


# ---------------------------------------------------------------------------- --worker-grace


async def run_until_disconnected(c: Cluster, start_cli_worker: StartWorker, *, max_retries: int) -> tuple[str, float]:
    """A sleep task running on worker w0 whose agent then goes away; returns (task id, when)."""
    await start_cli_worker(c, ["--coordinator", c.base_url, "--api-key", await c.create_key("worker"), "--worker-id", "w0"])
    # long enough to be running still once w1 has started (a CLI worker's start took over a second
    # on a loaded 2-core machine: a 1 s task had succeeded on w0 by then)
    [tid] = await c.submit({"type": "custom", "config": {"name": "sleep", "parameters": {"seconds": 8.0}},
                            "max_retries": max_retries})
    await wait_for(lambda: c.runtime.state.tasks[tid].state == "running", timeout=20, what="the task to run on w0")
    await start_cli_worker(c, ["--coordinator", c.base_url, "--api-key", await c.create_key("worker"), "--worker-id", "w1"])
    c.agents[0].stop()
    await wait_for(lambda: not c.runtime.state.workers["w0"].connected, timeout=10, what="w0 to disconnect")
    gone_at = c.runtime.state.workers["w0"].disconnected_at
    assert gone_at is not None
    t = c.runtime.state.tasks[tid]
    assert (t.state, t.worker_id) == ("running", "w0"), "requeued before the grace period"
    return tid, gone_at


def lost_entry(task: dict[str, Any]) -> dict[str, Any]:
    return next(h for h in task["history"] if "lost (no reconnect within" in h["cause"])


async def test_worker_grace_requeues_a_lost_workers_task_after_the_grace(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    async with coordinator(tmp_path, "--worker-grace", "1.5", "--worker-ttl", "60") as c:
        tid, gone_at = await run_until_disconnected(c, start_cli_worker, max_retries=1)
        await wait_for(lambda: c.runtime.state.tasks[tid].worker_id == "w1", timeout=6,
                       what="the task to be requeued to w1 after --worker-grace 1.5")
        task = await c.wait(tid, timeout=40)
        assert (task["state"], task["outcome"]["worker_id"], task["attempt"]) == ("succeeded", "w1", 2)
        lost = lost_entry(task)
        assert "within 1.5s" in lost["cause"]
        assert lost["at"] - gone_at >= 1.5


async def test_worker_grace_default_keeps_the_task_waiting_for_the_worker(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    """The control for the test above: with the default 10 s grace the task stays with w0 although
    another worker is idle (checked a few coordinator ticks after the disconnect)."""
    async with coordinator(tmp_path) as c:
        tid, gone_at = await run_until_disconnected(c, start_cli_worker, max_retries=1)
        await wait_for(lambda: c.runtime.clock() > gone_at + 1.0, timeout=5, what="four coordinator ticks")
        t = c.runtime.state.tasks[tid]
        assert (t.state, t.worker_id) == ("running", "w0")
