"""The change feed over HTTP and the dashboard without a browser: resuming from Last-Event-ID,
who may read the feed, nothing published while nobody listens, the standalone dashboard using
the first healthy of several coordinators, its cookie and CSRF rules, and its launcher."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from distributed_testing.dashboard.app import DashboardConfig, create_dashboard_app
from distributed_testing.testing import Procs, free_port, run_cluster, wait_until

pytestmark = [pytest.mark.timeout(60)]
REPO = Path(__file__).resolve().parents[3]
NOOP = {"type": "custom", "config": {"name": "noop"}, "requirements": {"tags": ["nowhere"]}}


async def read_events(resp: aiohttp.ClientResponse, want: int) -> list[dict[str, str]]:
    """The next ``want`` events (``id``, ``event``, ``data``) of a server-sent event stream."""
    out: list[dict[str, str]] = []
    ev: dict[str, str] = {}
    async with asyncio.timeout(10):
        async for raw in resp.content:
            line = raw.decode().rstrip("\n")
            if not line:
                if "data" in ev:  # the opening frame carries only ``retry``
                    out.append(ev)
                    ev = {}
                if len(out) >= want:
                    return out
            elif not line.startswith(":"):
                name, _, value = line.partition(": ")
                ev[name] = value
    return out


@pytest.mark.asyncio
async def test_the_feed_resumes_after_a_reconnect_and_only_readers_may_open_it(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, 0) as c:
        hub = c.runtime.events
        await c.submit({**NOOP, "task_id": "before"})
        assert not hub.active and hub.last_id.endswith("-0")  # nobody listened: nothing was published
        worker_key, viewer = await c.create_key("worker"), await c.create_key("viewer")
        url = c.base_url + "/api/v1/events"
        async with c.http.get(url, headers={"Authorization": f"Bearer {worker_key}"}) as r:
            assert r.status == 403
        async with c.http.get(url) as r:
            assert r.status == 401
        async with c.http.get(url, headers={"Authorization": f"Bearer {viewer}"}) as other:  # keeps the ring going
            async with c.http.get(url, headers={"Authorization": f"Bearer {viewer}"}) as feed:
                assert feed.status == 200 and feed.headers["Content-Type"] == "text/event-stream"
                await c.submit({**NOOP, "task_id": "one"})
                (ev,) = await read_events(feed, 1)
                assert ev["event"] == "task" and '"task_id":"one"' in ev["data"] and '"state":"pending"' in ev["data"]
            await c.submit({**NOOP, "task_id": "missed"})  # while this client is away
            headers = {"Authorization": f"Bearer {viewer}", "Last-Event-ID": ev["id"]}
            async with c.http.get(url, headers=headers) as feed:
                await c.submit({**NOOP, "task_id": "after"})
                got = await read_events(feed, 2)
            assert ['"task_id":"missed"' in got[0]["data"], '"task_id":"after"' in got[1]["data"]] == [True, True]
            assert len(await read_events(other, 3)) == 3
        headers["Last-Event-ID"] = "someone-else-7"
        async with c.http.get(url, headers=headers) as feed:
            (reset,) = await read_events(feed, 1)
            assert reset["event"] == "reset"


@contextlib.asynccontextmanager
async def dashboard(urls: list[str], ttl: float = 3600.0) -> AsyncIterator[str]:
    runner = web.AppRunner(create_dashboard_app(DashboardConfig(coordinator_urls=tuple(urls), session_ttl_s=ttl)))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_the_standalone_dashboard_uses_the_first_healthy_coordinator_and_checks_csrf(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with run_cluster(tmp_path, 1) as c, dashboard([dead, c.base_url]) as dash, \
            aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(dash + "/tasks", allow_redirects=False) as r:
            assert r.status == 303 and r.headers["Location"] == "/login"
        async with http.get(dash + "/data/tasks") as r:
            assert r.status == 401
        async with http.post(dash + "/login", data={"key": c.admin_key}, allow_redirects=False) as r:
            assert r.status == 303
            cookie = r.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" not in cookie  # plain http
        async with http.get(dash + "/") as r:
            page = await r.text()
        assert c.admin_key not in page and 'name="csrf-token"' in page and 'data-can-drain="1"' in page
        csrf = page.split('name="csrf-token" content="')[1].split('"')[0]
        async with http.get(dash + "/data/overview") as r:
            overview = await r.json()
        assert [(x["url"], x["healthy"], x["in_use"]) for x in overview["coordinators"]] == [
            (dead, False, False), (c.base_url, True, True)]
        (tid,) = await c.submit(NOOP)
        async with http.get(dash + "/data/tasks", params={"state": "pending"}) as r:
            assert [t["task_id"] for t in (await r.json())["tasks"]] == [tid]
        async with http.post(dash + f"/actions/tasks/{tid}/cancel") as r:
            assert r.status == 403 and "X-CSRF-Token" in (await r.json())["message"]
        async with http.post(dash + f"/actions/tasks/{tid}/cancel", headers={"X-CSRF-Token": csrf}) as r:
            assert r.status == 200 and (await r.json())["state"] == "cancelled"
        async with http.post(dash + "/logout", headers={"X-CSRF-Token": csrf}) as r:
            assert r.status == 200
        async with http.get(dash + "/data/tasks") as r:
            assert r.status == 401


@pytest.mark.asyncio
async def test_a_sign_in_ends_after_the_session_ttl(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, 0) as c, dashboard([c.base_url], ttl=0.5) as dash, \
            aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.post(dash + "/login", data={"key": c.admin_key}) as r:
            assert r.status == 200
        async with http.get(dash + "/data/workers") as r:
            assert r.status == 200
        await asyncio.sleep(0.6)  # the TTL itself is what is tested
        async with http.get(dash + "/data/workers") as r:
            assert r.status == 401


@pytest.mark.asyncio
async def test_without_the_flag_the_coordinator_serves_no_dashboard(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, 0) as c:
        async with c.http.get(c.base_url + "/dashboard/login") as r:
            assert r.status == 404
    async with run_cluster(tmp_path / "with", 0, dashboard=True) as c:
        async with c.http.get(c.base_url + "/dashboard/tasks", allow_redirects=False) as r:
            assert r.status == 303 and r.headers["Location"] == "/dashboard/login"
        async with c.http.get(c.base_url + "/dashboard/static/vendor/chart.umd.min.js") as r:
            assert r.status == 200 and b"Chart.js v4" in (await r.read())[:200]


def test_the_launcher_serves_the_login_page(tmp_path: Path) -> None:
    procs = Procs(tmp_path, cwd=REPO)
    try:
        port_file = tmp_path / "dash.port"
        procs.start(["dashboard_server.py", "--coordinator", "http://127.0.0.1:9", "--port", "0",
                     "--port-file", str(port_file)], tmp_path / "dash.log")
        wait_until(port_file.exists, 20, "the dashboard to listen")
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{int(port_file.read_text())}/login", timeout=10) as r:
            assert r.status == 200 and b'name="key"' in r.read()
    finally:
        procs.close()
