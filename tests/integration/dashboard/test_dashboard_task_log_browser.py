"""The task page streams a running task's output: Debian's headless Chromium (Playwright) sees the
first line a custom handler prints while the handler still waits for a file, with the running
attempt's elapsed time, then the second line once it ends. Saves a screenshot under tmp_path.
Skips, saying why, when Playwright or /usr/bin/chromium is missing."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from browser_support import ARGS, CHROMIUM, playwright_or_skip

import distributed_testing.testing as testing
from distributed_testing.testing import run_cluster

playwright_api = playwright_or_skip()

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
HANDLER = '''
import pathlib, time

def print_wait(parameters, ctx):
    print("first line from the task")
    go = pathlib.Path(parameters["go"])
    while not go.exists():
        time.sleep(0.02)
    print("second line from the task")
    return {}
'''


async def test_the_task_page_shows_a_running_tasks_output_as_it_comes(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dt_page_handler.py").write_text(HANDLER)
    monkeypatch.setattr(testing, "default_executors", functools.partial(
        testing.default_executors, custom_handlers={"print_wait": "dt_page_handler:print_wait"},
        custom_pythonpath=[tmp_path]))
    go = tmp_path / "go"
    async with run_cluster(tmp_path, 1, dashboard=True) as c:
        viewer = await c.create_key("viewer")
        [tid] = await c.submit({"type": "custom", "config": {"name": "print_wait", "parameters": {"go": str(go)}}})
        async with playwright_api.async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = await (await browser.new_context(viewport={"width": 1280, "height": 800})).new_page()
            try:
                await page.goto(c.base_url + "/dashboard/login")
                await page.fill("input[name=key]", viewer)
                await page.click("button[type=submit]")
                await page.wait_for_selector("#signout")
                await page.goto(c.base_url + f"/dashboard/tasks/{tid}")
                await page.wait_for_function(
                    "() => document.getElementById('output-log')?.textContent.includes('first line from the task')")
                status, task = await c.request("GET", f"/api/v1/tasks/{tid}")
                assert task["state"] in ("assigned", "running")  # it waits for go: the line came while it runs
                await page.wait_for_function("() => /\\d s$/.test(document.getElementById('elapsed')?.textContent)")
                await page.screenshot(path=str(tmp_path / "running.png"), full_page=True)
                go.touch()
                await page.wait_for_function(
                    "() => document.getElementById('output-log')?.textContent.includes('second line from the task')")
                assert "first line from the task\nsecond line from the task" in await page.inner_text("#output-log")
            finally:
                await page.screenshot(path=str(tmp_path / "screenshot.png"), full_page=True)
                await browser.close()
