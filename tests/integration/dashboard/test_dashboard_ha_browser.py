"""The Overview of an HA group in a real browser (Debian's headless Chromium driven by Playwright):
two ``run_coordinator.py --dashboard`` members on a private PostgreSQL database; the leader is
SIGKILLed, and the new leader's Overview must still list the dead member, unhealthy, beside
itself (``GET /api/v1/cluster`` keeps a member an hour).

Skips, saying why, when Playwright or /usr/bin/chromium is missing."""

from __future__ import annotations

import json
import signal
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from browser_support import ARGS, CHROMIUM, playwright_or_skip

from distributed_testing.testing import Procs, pg_database_sync, wait_until

playwright_api = playwright_or_skip()

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
REPO = Path(__file__).resolve().parents[3]


def role(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url + "/api/v1/health", timeout=5) as r:
            return str(json.loads(r.read())["role"])
    except (OSError, ValueError):
        return None


def start_member(procs: Procs, tmp: Path, name: str, dsn: str) -> tuple[Any, str]:
    port_file = tmp / f"{name}.port"
    p = procs.start(["run_coordinator.py", "--host", "127.0.0.1", "--port", "0", "--db-path", dsn, "--dashboard",
                     "--port-file", str(port_file), "--admin-key-file", str(tmp / "admin.key")], tmp / f"{name}.log")
    wait_until(port_file.exists, 30, f"member {name} to listen")
    return p, f"http://127.0.0.1:{int(port_file.read_text())}"


async def test_the_new_leader_s_overview_lists_the_dead_member_as_unhealthy(tmp_path: Path) -> None:
    procs = Procs(tmp_path, cwd=REPO)
    try:
        with pg_database_sync(prefix="dt_dash_ha") as dsn:
            a, a_url = start_member(procs, tmp_path, "a", dsn)
            wait_until(lambda: role(a_url) == "leader", 30, "a to lead")
            _, b_url = start_member(procs, tmp_path, "b", dsn)
            wait_until(lambda: role(b_url) == "standby", 30, "b to stand by")
            a.send_signal(signal.SIGKILL)
            a.wait()
            wait_until(lambda: role(b_url) == "leader", 30, "b to take over")
            async with playwright_api.async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                try:
                    page = await browser.new_page(viewport={"width": 1280, "height": 700})
                    await page.goto(b_url + "/dashboard/login")
                    await page.fill("input[name=key]", (tmp_path / "admin.key").read_text().strip())
                    await page.click("button[type=submit]")
                    await page.wait_for_function(  # the group marks it after MEMBER_STALE_S; the page redraws every 5 s
                        f"""() => document.querySelector('#coordinators tr[data-url="{a_url}"] td:nth-child(3)')
                            ?.textContent === 'unhealthy'""", timeout=20000)
                    rows = await page.eval_on_selector_all(
                        "#coordinators tbody tr", "rows => rows.map(r => [r.dataset.url, ...[...r.cells].map(c => c.textContent)])")
                    await page.screenshot(path=str(tmp_path / "screenshot.png"), full_page=True)
                finally:
                    await browser.close()
        by_url = {r[0]: r[1:] for r in rows}
        assert set(by_url) == {a_url, b_url}, rows
        assert by_url[b_url][1:4] == ["leader", "healthy", "yes"], rows  # role, health, in use
        assert by_url[a_url][2] == "unhealthy" and "not seen" in by_url[a_url][7], rows
    finally:
        procs.close()
