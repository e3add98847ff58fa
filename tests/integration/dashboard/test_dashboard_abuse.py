"""Attacks on the dashboard mounted in a coordinator (``dashboard=True``, real sockets): event
streams that outlive their key or token, one session holding every stream, a sign-in posted from
another site (login CSRF), an action body that is not JSON or not what its Content-Encoding says."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import aiohttp
import pytest

from distributed_testing.dashboard.sessions import MAX_STREAMS_PER_KEY, MAX_STREAMS_PER_SESSION
from distributed_testing.testing import Cluster, run_cluster

pytestmark = [pytest.mark.timeout(90)]
ENDS_WITHIN_S = 5.0  # the streams end within a second; the margin is for a loaded CI machine


def jar_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def sign_in(http: aiohttp.ClientSession, c: Cluster, key: str) -> str:
    """Sign ``http`` in to the dashboard with ``key``; its CSRF token."""
    async with http.post(c.base_url + "/dashboard/login", data={"key": key}, allow_redirects=False) as r:
        assert r.status == 303, await r.text()
    async with http.get(c.base_url + "/dashboard/") as r:
        page = await r.text()
    return page.split('name="csrf-token" content="')[1].split('"')[0]


async def until_closed(resp: aiohttp.ClientResponse) -> None:
    async with asyncio.timeout(ENDS_WITHIN_S):
        while await resp.content.readany():
            pass


@pytest.mark.asyncio
async def test_a_revoked_keys_streams_end_on_the_api_and_through_the_dashboard(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, 0, dashboard=True) as c, jar_session() as browser:
        viewer = await c.create_key("viewer")
        status, keys = await c.request("GET", "/api/v1/keys")
        (key_id,) = [k["key_id"] for k in keys["keys"] if k["role"] == "viewer"]
        await sign_in(browser, c, viewer)
        async with c.http.get(c.base_url + "/api/v1/events", headers={"Authorization": f"Bearer {viewer}"}) as api, \
                browser.get(c.base_url + "/dashboard/events") as dash:
            assert (api.status, dash.status) == (200, 200)
            await api.content.readline()
            await dash.content.readline()
            status, _ = await c.request("POST", f"/api/v1/keys/{key_id}/revoke")
            assert status == 200
            await asyncio.gather(until_closed(api), until_closed(dash))
        async with browser.get(c.base_url + "/dashboard/events") as again:
            assert again.status == 401


@pytest.mark.asyncio
async def test_a_stream_ends_when_its_token_expires(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, 0, token_ttl_s=2.0) as c:
        viewer = await c.create_key("viewer")
        status, body = await c.request("POST", "/api/v1/auth/token", key=viewer)
        assert status == 200
        async with c.http.get(c.base_url + "/api/v1/events", headers={"Authorization": f"Bearer {body['token']}"}) as r:
            assert r.status == 200
            await r.content.readline()
            await until_closed(r)


@pytest.mark.asyncio
@pytest.mark.slow
async def test_one_session_cannot_hold_every_stream_and_others_are_served(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, 0, dashboard=True) as c, jar_session() as hog, jar_session() as other:
        await sign_in(hog, c, await c.create_key("viewer"))
        await sign_in(other, c, await c.create_key("viewer"))
        url = c.base_url + "/dashboard/events"
        opened = await asyncio.gather(*(hog.get(url) for _ in range(MAX_STREAMS_PER_SESSION + 4)))
        try:
            statuses = sorted(r.status for r in opened)
            assert statuses == [200] * MAX_STREAMS_PER_SESSION + [429] * 4, statuses
            assert all(r.headers.get("Retry-After") for r in opened if r.status == 429)
            async with asyncio.timeout(10), other.get(c.base_url + "/dashboard/data/tasks") as r:
                assert r.status == 200
            async with other.get(url) as r:  # the other session has its own allowance
                assert r.status == 200
        finally:
            for r in opened:
                r.close()
        async with asyncio.timeout(10):  # closed streams give their places back
            while True:
                async with hog.get(url) as r:
                    if r.status == 200:
                        break
                await asyncio.sleep(0.05)


@pytest.mark.asyncio
@pytest.mark.slow
async def test_two_hundred_streams_leave_the_pool_to_other_users(tmp_path: Path) -> None:
    """The issue's scenario: 200 streams held open through the dashboard (as many sessions as the
    caps need) while another user's page asks for its data."""
    async with run_cluster(tmp_path, 0, dashboard=True) as c, jar_session() as other:
        await sign_in(other, c, await c.create_key("viewer"))
        url, hogs, opened = c.base_url + "/dashboard/events", [], []
        try:
            for i in range(200 // MAX_STREAMS_PER_SESSION):
                if i % (MAX_STREAMS_PER_KEY // MAX_STREAMS_PER_SESSION) == 0:
                    key = await c.create_key("viewer")
                hog = jar_session()
                hogs.append(hog)
                await sign_in(hog, c, key)
                opened += await asyncio.gather(*(hog.get(url) for _ in range(MAX_STREAMS_PER_SESSION)))
            assert len(opened) == 200 and {r.status for r in opened} == {200}
            async with asyncio.timeout(10), other.get(c.base_url + "/dashboard/data/overview") as r:
                assert r.status == 200
        finally:
            for r in opened:
                r.close()
            for hog in hogs:
                await hog.close()


@pytest.mark.asyncio
async def test_a_sign_in_posted_from_another_site_is_refused(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, 0, dashboard=True) as c:
        login = c.base_url + "/dashboard/login"
        host = c.base_url.removeprefix("http://")
        cases = [({"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}, 403),
                 ({"Origin": "https://evil.example"}, 403),  # a browser without Sec-Fetch-* headers
                 ({"Origin": "null"}, 403),  # a sandboxed frame or a data: URL
                 ({"Sec-Fetch-Site": "same-site"}, 403),
                 ({"Origin": c.base_url, "Sec-Fetch-Site": "same-origin"}, 303),
                 ({"Origin": f"https://{host}"}, 303),  # behind a TLS proxy the scheme differs
                 ({}, 303)]  # not a browser
        for headers, want in cases:
            async with jar_session() as http, http.post(login, data={"key": c.admin_key}, headers=headers,
                                                        allow_redirects=False) as r:
                assert r.status == want, (headers, r.status)
                assert ("dt_session" in r.cookies) == (want == 303), headers


@pytest.mark.asyncio
async def test_an_action_whose_body_is_not_json_gets_400(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with run_cluster(tmp_path, 1, dashboard=True) as c, jar_session() as http:
        csrf = await sign_in(http, c, c.admin_key)
        with caplog.at_level(logging.ERROR):
            async with http.post(c.base_url + "/dashboard/actions/workers/w0/drain", data=b"{not json",
                                 headers={"X-CSRF-Token": csrf, "Content-Type": "application/json"}) as r:
                assert r.status == 400
                body = await r.json()
            # a body that is not what its Content-Encoding says: 400 naming it, not a 500
            async with http.post(c.base_url + "/dashboard/actions/workers/w0/drain", data=b"plainly not gzip",
                                 headers={"X-CSRF-Token": csrf, "Content-Type": "application/json",
                                          "Content-Encoding": "gzip"}) as r:
                assert r.status == 400, await r.text()
                encoded = await r.json()
            async with jar_session() as other, other.post(
                    c.base_url + "/dashboard/login", data=b"plainly not gzip", allow_redirects=False,
                    headers={"Content-Type": "application/x-www-form-urlencoded", "Content-Encoding": "gzip"}) as r:
                assert r.status == 400, await r.text()
        assert body["error"] == "ValidationError" and "not JSON" in body["message"]
        assert encoded["error"] == "ValidationError" and encoded["errors"][0]["field"] == "(body)", encoded
        assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
