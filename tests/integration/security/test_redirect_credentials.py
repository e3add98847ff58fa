"""Credentials follow no redirect out of the group, and never from https to http (issue 27 item 4;
client.Members): a fake standby (a real aiohttp server) answers ``dt``, the API client and the
worker with a 307 or a 503 naming a foreign listener, or, over TLS with a certificate the client
trusts, an ``http://`` leader. The foreign listener must receive no credential, and the client
must fail naming the refused redirect."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from aiohttp import web

from distributed_testing.cli import worker as worker_cli
from distributed_testing.cli.http import ApiClient, ApiError
from distributed_testing.security import tls
from distributed_testing.testing import fake_coordinator, make_tls_files, record_only, standby_answer, wait_for
from distributed_testing.worker import hardware
from distributed_testing.worker.factory import build_agent

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
KEY = "dtk_secretkeythatmustnotleak"


def credentials_seen(requests: list[web.Request]) -> list[str]:
    return [r.headers["Authorization"] for r in requests if "Authorization" in r.headers]


@pytest.mark.parametrize("redirect", [True, False], ids=["307", "503-leader"])
async def test_the_api_client_refuses_a_standby_pointing_at_a_foreign_host(redirect: bool) -> None:
    async with fake_coordinator(record_only) as (foreign, got):
        async with fake_coordinator(standby_answer(foreign, redirect=redirect)) as (standby, asked):
            api = ApiClient(standby, KEY, failover_s=0.0)
            with pytest.raises(ApiError, match=f"refused the redirect from {standby} to {foreign}: not a member"):
                await asyncio.to_thread(api.get, "/api/v1/workers")
    assert got == []  # nothing at all reached it
    assert asked and credentials_seen(asked) == [f"Bearer {KEY}"] * len(asked)  # only the configured member


async def test_a_leader_the_standby_lists_as_a_member_is_followed() -> None:
    """The rule's other half: a URL a member's ``GET /api/v1/cluster`` lists is a member."""
    async with fake_coordinator(record_only) as (leader, got):
        def respond(request: web.Request) -> asyncio.Future[web.StreamResponse]:
            async def answer() -> web.StreamResponse:
                if request.path == "/api/v1/cluster":
                    return web.json_response({"leader": leader, "members": [{"url": standby}, {"url": leader}]})
                return await standby_answer(leader, redirect=True)(request)
            return asyncio.ensure_future(answer())

        async with fake_coordinator(respond) as (standby, _):
            api = ApiClient(standby, KEY, failover_s=0.0)
            assert await asyncio.to_thread(api.get, "/api/v1/workers") == {}
    assert credentials_seen(got) == [f"Bearer {KEY}"]


async def test_dt_with_a_ca_file_refuses_a_redirect_from_https_to_http(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path / "tls")
    server_tls = tls.server_context(files.cert, files.key)
    async with fake_coordinator(record_only) as (plain, got):
        def respond(request: web.Request) -> asyncio.Future[web.StreamResponse]:
            async def answer() -> web.StreamResponse:
                if request.path == "/api/v1/cluster":  # even listed as a member, http is not followed
                    return web.json_response({"leader": plain, "members": [{"url": standby}, {"url": plain}]})
                return await standby_answer(plain, redirect=True)(request)
            return asyncio.ensure_future(answer())

        async with fake_coordinator(respond, ssl_context=server_tls) as (standby, asked):
            env = {**os.environ, "DT_API_KEY": KEY, "DT_COORDINATOR_URL": standby, "DT_CA_FILE": str(files.ca)}
            proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "distributed_testing.cli.dt", "workers",
                                                        env=env, stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert got == [], "the viewer key went over plain http"
    assert asked, "dt never reached the https standby (its certificate should be trusted)"
    assert proc.returncode != 0 and b"it would send the credential from https to plain http" in err, (out, err)


async def test_the_worker_key_goes_to_no_foreign_leader_nor_over_plain_ws(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "probe_devices_in_child", lambda *a, **k: {})
    files = make_tls_files(tmp_path / "tls")
    async with fake_coordinator(record_only) as (foreign, got):
        async with fake_coordinator(standby_answer(foreign)) as (plain_standby, _), \
                fake_coordinator(standby_answer(foreign), ssl_context=tls.server_context(files.cert, files.key)) \
                as (tls_standby, tls_asked):
            for standby, extra in ((plain_standby, []), (tls_standby, ["--ca-file", str(files.ca)])):
                argv = ["--coordinator", standby, "--api-key", KEY, "--worker-id", "w", "--reconnect-attempts", "2",
                        "--reconnect-interval", "0.05", *extra]
                agent = await build_agent(worker_cli.config_from_args(worker_cli.build_parser().parse_args(argv), {}))
                run = asyncio.create_task(agent.run())
                await wait_for(run.done, timeout=30, what="the worker to give up")
                assert foreign not in agent.candidates.urls
    assert got == [], "the worker key reached a host outside the group"
    assert tls_asked, "the worker never reached the https standby"



async def test_the_dashboards_client_follows_no_redirect_and_moves_past_a_silent_member() -> None:
    from distributed_testing.dashboard.client import CoordinatorClient

    async def healthy_but_redirecting(request: web.Request) -> web.StreamResponse:
        if request.path == "/healthz":
            return web.json_response({"status": "ok"})
        return await standby_answer(foreign, redirect=True)(request)

    async with fake_coordinator(record_only) as (foreign, got), \
            fake_coordinator(healthy_but_redirecting) as (standby, _):
        client = CoordinatorClient([standby])
        try:
            status, body = await client.request("GET", "/api/v1/workers", KEY)
        finally:
            await client.close()
    assert status == 307 and body["leader"] == foreign  # handed back as it is, not followed
    assert got == []
