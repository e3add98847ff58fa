"""Several ``--coordinator`` URLs and ``--high-availability`` against real coordinators and a
standby's answer (a small aiohttp app answering the worker endpoint as a standby does: 503 with
``{"error": "not_leader", "leader": URL}``). The group itself (PostgreSQL, failover on a leader's
death) is tested in tests/integration/ha."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web
from flags_support import StartWorker

from distributed_testing.testing import fake_coordinator, refusing_port, run_cluster, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
NOOP = {"type": "custom", "config": {"name": "noop"}}


@asynccontextmanager
async def standby(leaders: list[str | None]) -> AsyncIterator[tuple[str, list[web.Request]]]:
    """A standby at the returned URL: its n-th worker handshake names ``leaders[n]`` (the last
    one from then on; None: no leader known yet), and its cluster view lists them as members (a
    worker follows only a member). The list holds the requests seen."""
    count = itertools.count(1)

    async def respond(request: web.Request) -> web.Response:
        if request.path == "/api/v1/cluster":
            return web.json_response({"leader": None, "members": [{"url": u} for u in leaders if u is not None]})
        leader = leaders[min(next(count), len(leaders)) - 1]
        return web.json_response({"error": "not_leader", "leader": leader, "message": "standby"}, status=503,
                                 headers={"Retry-After": "1"})

    async with fake_coordinator(respond) as (url, seen):
        yield url, seen


def handshakes(seen: list[web.Request]) -> list[web.Request]:
    """The worker handshakes among the requests a standby saw."""
    return [r for r in seen if r.path == "/ws/worker"]


async def test_a_worker_given_a_dead_coordinator_first_connects_to_the_next(tmp_path: Path,
                                                                           start_cli_worker: StartWorker) -> None:
    dead = f"http://127.0.0.1:{refusing_port()}"
    async with run_cluster(tmp_path, workers=0) as c:
        agent = await start_cli_worker(c, ["--coordinator", f"{dead},{c.base_url}", "--api-key",
                                           await c.create_key("worker"), "--worker-id", "two-urls",
                                           "--reconnect-interval", "0.05"])
        assert agent.candidates.current == c.base_url
        [tid] = await c.submit(NOOP)
        assert (await c.wait(tid))["state"] == "succeeded"


async def test_a_worker_follows_the_leader_a_standby_names(tmp_path: Path, start_cli_worker: StartWorker) -> None:
    async with run_cluster(tmp_path, workers=0) as c, standby([c.base_url]) as (url, seen):
        agent = await start_cli_worker(c, ["--coordinator", url, "--api-key", await c.create_key("worker"),
                                           "--worker-id", "redirected", "--reconnect-interval", "0.05",
                                           "--reconnect-attempts", "2"])
        assert handshakes(seen) and agent.candidates.current == c.base_url  # not configured: named by the standby
        assert c.base_url in agent.candidates.urls


async def test_high_availability_never_gives_up_and_switches_without_backoff(tmp_path: Path,
                                                                           start_cli_worker: StartWorker) -> None:
    """--reconnect-attempts 1 would end a plain worker at the first refusal; with
    --high-availability it goes round the group (a dead member, a standby that knows no leader
    yet) until the standby names one, and a 60 s --reconnect-interval never delays it: its pause
    between rounds starts at 0.1 s."""
    dead = f"http://127.0.0.1:{refusing_port()}"
    async with run_cluster(tmp_path, workers=0) as c, standby([None] * 3 + [c.base_url]) as (url, seen):
        agent = await start_cli_worker(c, ["--coordinator", f"{dead},{url}", "--api-key",
                                           await c.create_key("worker"), "--worker-id", "ha",
                                           "--high-availability", "--reconnect-attempts", "1",
                                           "--reconnect-interval", "60"])
        assert len(handshakes(seen)) == 4 and agent.candidates.current == c.base_url
        # the registry learned the group from GET /api/v1/cluster (a lone coordinator lists itself)
        await wait_for(lambda: c.base_url in agent.candidates.urls, what="the cluster view")
        assert agent._beat_interval(1.0) == 0.5  # heartbeats and pings every half of the granted interval


async def test_without_high_availability_a_refusing_group_is_given_up(tmp_path: Path,
                                                                    start_cli_worker: StartWorker) -> None:
    async with run_cluster(tmp_path, workers=0) as c, standby([None]) as (url, seen):
        agent = await start_cli_worker(c, ["--coordinator", url, "--api-key", await c.create_key("worker"),
                                           "--worker-id", "plain", "--reconnect-attempts", "2",
                                           "--reconnect-interval", "0.05"], wait=False)
        await wait_for(lambda: c.agent_tasks[-1].done(), timeout=20, what="the worker to give up")
        assert len(handshakes(seen)) == 2 and agent._beat_interval(1.0) == 1.0
