"""Guessing keys through the dashboard mounted in a real ``run_coordinator.py --dashboard``: the
guesser's browser address is limited like any client (429 with ``Retry-After``), and nobody else
is: not the coordinator's local clients (the dashboard reaches the coordinator over the loopback,
workers and CI on the same host use it too), not another browser signing in.

The guesser's browser connects from 127.0.0.2 (every 127/8 address is the loopback on Linux), the
coordinator's local clients from 127.0.0.1, another browser from 127.0.0.3."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from distributed_testing.testing import Procs, Rest, start_coordinator_process

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
GUESSES = 25


def browser(source: str) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(source, 0)),
                                 cookie_jar=aiohttp.CookieJar(unsafe=True))


async def _guess(dash: str, n: int) -> list[tuple[int, str | None]]:
    out = []
    async with browser("127.0.0.2") as http:
        for i in range(n):
            async with http.post(dash + "/login", data={"key": f"dtk_guess{i:04d}_wrongwrongwrong"},
                                 allow_redirects=False) as r:
                out.append((r.status, r.headers.get("Retry-After")))
    return out


async def _other_browser_signs_in(dash: str, key: str) -> int:
    async with browser("127.0.0.3") as http, http.post(dash + "/login", data={"key": key}, allow_redirects=False) as r:
        return r.status


def test_guessing_through_the_dashboard_is_limited_per_browser_and_locks_out_nobody_else(procs: Procs,
                                                                                          tmp_path: Path) -> None:
    _p, port = start_coordinator_process(procs, tmp_path / "c.duckdb", args=["--dashboard"],
                                         log=tmp_path / "coordinator.log")
    admin = Rest(f"http://127.0.0.1:{port}", (tmp_path / "admin.key").read_text().strip(), timeout=10)
    viewer = admin.create_key("viewer")
    dash = f"http://127.0.0.1:{port}/dashboard"

    answers = asyncio.run(_guess(dash, GUESSES))
    statuses = [s for s, _ in answers]
    assert 429 in statuses, f"{GUESSES} wrong keys through the dashboard were never refused: {statuses}"
    first = statuses.index(429)
    assert set(statuses[:first]) == {401} and set(statuses[first:]) == {429}, statuses
    assert all(ra is not None and 1 <= int(ra) <= 60 for s, ra in answers if s == 429)

    # the coordinator's local clients (127.0.0.1, as the dashboard itself) are not refused
    status, body = admin.request("GET", "/api/v1/tasks")
    assert status == 200, (status, body)
    assert Rest(admin.base_url, viewer, timeout=10).request("GET", "/api/v1/overview")[0] == 200
    # nor is another browser signing in through the same dashboard
    assert asyncio.run(_other_browser_signs_in(dash, viewer)) == 303
