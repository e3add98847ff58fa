"""--reconnect-attempts counts *consecutive* failed connects (a real worker behind a TCP proxy
whose connections the test severs), and --api-key must be a worker key (refused at once, with a
one-line error from ``dt-worker``). What counts as a failed connect (a handshake without a session
id, another HTTP status, a connection dropped before registration) is checked against a fake
coordinator; a session the coordinator ends is followed by a fresh registration."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest
from aiohttp import web
from flags_support import Proxy, StartWorker, ThreadCluster, worker_config

from distributed_testing.cli import worker as worker_cli
from distributed_testing.errors import ProtocolError
from distributed_testing.protocol.signing import SESSION_HEADER
from distributed_testing.retry import RetriesExhausted
from distributed_testing.testing import Cluster, Respond, fake_coordinator, run_cluster, wait_for
from distributed_testing.worker.factory import build_agent
from distributed_testing.worker.session import SessionRejected

pytestmark = pytest.mark.timeout(60)


async def sever_and_wait_for_reconnect(c: Cluster, proxy: Proxy, worker_id: str) -> None:
    """Drop the worker's connection; wait until it has a new session (or its agent has ended)."""
    before, agent_task = c.runtime.sessions[worker_id], c.agent_tasks[-1]
    proxy.sever()
    await wait_for(lambda: c.runtime.sessions.get(worker_id) not in (None, before) or agent_task.done(), timeout=15,
                   what=f"{worker_id} to reconnect after the network dropped")
    if agent_task.done():
        exc = agent_task.exception()
        pytest.fail(f"the worker stopped instead of reconnecting: {type(exc).__name__}: {exc}")


@pytest.mark.asyncio
async def test_network_drops_within_the_attempt_budget_are_survived(tmp_path: Path, start_cli_worker: StartWorker) -> None:
    """One drop with --reconnect-attempts 2: one failed session, then a good connect."""
    async with run_cluster(tmp_path, workers=0) as c:
        async with Proxy(urlsplit(c.base_url).port or 0) as proxy:
            agent = await start_cli_worker(c, ["--coordinator", f"http://127.0.0.1:{proxy.port}", "--api-key",
                                               await c.create_key("worker"), "--worker-id", "flaky",
                                               "--reconnect-attempts", "2", "--reconnect-interval", "0.05"])
            await sever_and_wait_for_reconnect(c, proxy, "flaky")
            # the coordinator holds the new session before the worker has read its ``registered``
            await wait_for(lambda: agent.registered.is_set() or c.agent_tasks[-1].done(), timeout=15,
                           what="flaky to read its registration")
            assert agent.registered.is_set() and not c.agent_tasks[-1].done()


@pytest.mark.asyncio
async def test_reconnect_attempts_count_only_consecutive_failures(tmp_path: Path, start_cli_worker: StartWorker) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        async with Proxy(urlsplit(c.base_url).port or 0) as proxy:
            await start_cli_worker(c, ["--coordinator", f"http://127.0.0.1:{proxy.port}", "--api-key",
                                       await c.create_key("worker"), "--worker-id", "flaky",
                                       "--reconnect-attempts", "2", "--reconnect-interval", "0.05"])
            for _ in range(3):  # every drop is followed by a successful connect: never two failures in a row
                await sever_and_wait_for_reconnect(c, proxy, "flaky")


@pytest.mark.asyncio
async def test_a_key_without_the_worker_role_is_refused_without_retrying(tmp_path: Path, fast_hardware: None) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        config = worker_config(["--coordinator", c.base_url, "--api-key", await c.create_key("submitter"),
                                "--reconnect-attempts", "50", "--reconnect-interval", "5"])
        agent = await build_agent(config)
        with pytest.raises(SessionRejected, match="HTTP 403.*worker:connect"):
            await asyncio.wait_for(agent.run(), 20)  # at once: 50 attempts 5 s apart would time out


@pytest.mark.asyncio
async def test_an_unknown_key_is_refused_without_retrying(tmp_path: Path, fast_hardware: None) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        config = worker_config(["--coordinator", c.base_url, "--api-key", "dtk_nosuchid_" + "k" * 43,
                                "--reconnect-attempts", "50", "--reconnect-interval", "5"])
        with pytest.raises(SessionRejected, match="HTTP 401.*invalid API key"):  # the reason is the body's
            await asyncio.wait_for((await build_agent(config)).run(), 20)


@pytest.mark.asyncio
async def test_a_session_the_coordinator_ends_is_followed_by_a_new_registration(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        agent = await start_cli_worker(c, ["--coordinator", c.base_url, "--api-key", await c.create_key("worker"),
                                           "--worker-id", "closed", "--reconnect-attempts", "1",
                                           "--reconnect-interval", "0.05"])
        for n in (2, 3):  # each close is followed by a good connect: the one allowed attempt is never used up
            c.runtime.sessions["closed"].close("test: the coordinator ends the session")
            await wait_for(lambda n=n: agent.sessions == n or c.agent_tasks[-1].done(), timeout=15,
                           what="the worker to register again")
            assert not c.agent_tasks[-1].done(), c.agent_tasks[-1]
            assert agent.registered.is_set() and c.runtime.sessions["closed"].worker_id == "closed"




async def upgrade_without_session_id(request: web.Request) -> web.StreamResponse:
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    async for _ in ws:
        pass
    return ws


async def upgrade_then_drop(request: web.Request) -> web.StreamResponse:
    ws = web.WebSocketResponse()
    ws.headers[SESSION_HEADER] = "s1"
    await ws.prepare(request)
    await ws.receive()  # the worker's register
    assert request.transport is not None
    request.transport.abort()  # no close frame
    return ws


async def unavailable(request: web.Request) -> web.StreamResponse:
    return web.Response(status=503, text="busy")


@pytest.mark.asyncio
@pytest.mark.parametrize(("respond", "cause", "message"), [
    (upgrade_without_session_id, ProtocolError, "did not send a session id header"),
    (upgrade_then_drop, ConnectionError, "closed abnormally"),
    (unavailable, aiohttp.WSServerHandshakeError, "503"),
])
async def test_failed_connects_are_retried_up_to_the_attempt_budget(
        fast_hardware: None, respond: Respond, cause: type[Exception], message: str) -> None:
    async with fake_coordinator(respond) as (url, seen):
        config = worker_config(["--coordinator", url, "--api-key", "dtk_a_b", "--reconnect-attempts", "3",
                                "--reconnect-interval", "0.05"])
        with pytest.raises(RetriesExhausted, match="gave up after 3 attempts") as info:
            await asyncio.wait_for((await build_agent(config)).run(), 20)
    assert isinstance(info.value.__cause__, cause) and message in str(info.value.__cause__), repr(info.value.__cause__)
    assert len(seen) == 3
    assert {r.headers["Authorization"] for r in seen} == {"Bearer dtk_a_b"}


@pytest.mark.asyncio
async def test_retries_exhausted_is_what_a_dead_coordinator_gives(tmp_path: Path, fast_hardware: None) -> None:
    config = worker_config(["--coordinator", "http://127.0.0.1:1", "--api-key", "dtk_a_b",
                            "--reconnect-attempts", "1"])
    with pytest.raises(RetriesExhausted, match="gave up after 1 attempts"):
        await asyncio.wait_for((await build_agent(config)).run(), 20)


def test_worker_main_reports_refused_credentials_cleanly(
        thread_cluster: ThreadCluster, fast_hardware: None, clean_env: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    key = thread_cluster.call(thread_cluster.c.create_key("submitter"))
    code = worker_cli.main(["--coordinator", thread_cluster.c.base_url, "--api-key", key])
    assert isinstance(code, int) and code != 0
    assert "dt-worker: coordinator refused credentials: HTTP 403" in capsys.readouterr().err
