"""The dashboard's Training page and task page in a real browser (Debian's headless Chromium driven
by Playwright) after a REAL two-node training task: a coordinator serving the dashboard, two
in-process workers on loopback, the gang's gloo ranks in child processes. Both pages must show the
run's ranks and samples/s as the result holds them (``output.metrics``, task_type ``training``).

Skips, saying why, when Playwright or /usr/bin/chromium is missing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from browser_support import ARGS, CHROMIUM, playwright_or_skip

from distributed_testing.testing import run_cluster

playwright_api = playwright_or_skip()

pytestmark = [pytest.mark.asyncio, pytest.mark.slow, pytest.mark.timeout(240)]
TRAINING = {"type": "training", "timeout_s": 150,
            "config": {"model": "mlp", "nodes": 2, "nproc_per_node": 1, "batch_size": 16, "steps": 4,
                       "warmup_steps": 1, "load_balance": "none"}}


def shown(value: float) -> str:
    """A number as the pages print it (``num(v, 1)``: en-US grouping, at most one decimal)."""
    return f"{round(value, 1):,}".removesuffix(".0")


async def cells(page: Any, selector: str) -> list[list[str]]:
    return list(await page.eval_on_selector_all(
        f"{selector} tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))"))


async def test_a_two_node_run_shows_its_ranks_and_samples_per_second_on_both_pages(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=2, dashboard=True, worker_overrides={"interface": "lo"}) as c:
        (tid,) = await c.submit(TRAINING)
        task = await c.wait(tid, timeout=180)
        assert task["state"] == "succeeded", task["outcome"]
        metrics = task["result"]["output"]["metrics"]
        assert [r["rank"] for r in metrics["ranks"]] == [0, 1]
        errors: list[str] = []
        async with playwright_api.async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            try:
                context = await browser.new_context(viewport={"width": 1280, "height": 900}, locale="en-US")
                page = await context.new_page()
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
                page.on("console", lambda msg: errors.append(f"{msg.text} at {msg.location}")
                        if msg.type == "error" and not msg.location.get("url", "").endswith("/favicon.ico") else None)
                base = c.base_url + "/dashboard/"
                await page.goto(base + "login")
                await page.fill("input[name=key]", c.admin_key)
                await page.click("button[type=submit]")
                await page.wait_for_selector("#signout")

                await page.goto(base + "training")
                try:
                    await page.wait_for_selector(f'#runs tr[data-id="{tid}"]', timeout=20000)
                    await page.wait_for_selector("#ranks tbody tr td", timeout=20000)
                finally:
                    await page.screenshot(path=str(tmp_path / "training.png"), full_page=True)
                run = (await cells(page, "#runs"))[0]
                assert run[0] == tid and run[2:6] == ["mlp", "2", "2", "none"], run
                assert run[6] == shown(metrics["global_samples_per_s"]), (run, metrics["global_samples_per_s"])
                ranks = await cells(page, "#ranks")
                assert [(r[0], r[1]) for r in ranks] == [("0", "0"), ("1", "1")], ranks
                assert [r[4] for r in ranks] == [shown(r["samples_per_s"]) for r in metrics["ranks"]], ranks
                assert f"Run {tid}: mlp, 2 node(s), 2 rank(s)" in await page.inner_text("#ranks-box h2")

                await page.goto(base + f"tasks/{tid}")
                try:
                    await page.wait_for_selector("#task-ranks tbody tr td", timeout=20000)
                finally:
                    await page.screenshot(path=str(tmp_path / "task.png"), full_page=True)
                heading = await page.inner_text("#training-box h2")
                assert heading == (f"Training ranks: {shown(metrics['global_samples_per_s'])} samples/s over 2 rank(s)")
                ranks = await cells(page, "#task-ranks")
                assert [(r[0], r[1], r[4]) for r in ranks] == [
                    (str(r["rank"]), str(r["node_rank"]), shown(r["samples_per_s"])) for r in metrics["ranks"]], ranks
                await page.click("#training-box a")
                await page.wait_for_url(f"**/dashboard/training?task={tid}")
                await context.close()
            finally:
                await browser.close()
        assert errors == [], errors
