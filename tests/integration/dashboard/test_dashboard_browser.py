"""The dashboard in a real browser: Debian's headless Chromium driven by Playwright, against one
coordinator serving the dashboard under /dashboard, with one in-process worker and one worker
process (killed by one test). Every test saves a screenshot under its tmp_path.

Skips, saying why, when Playwright or /usr/bin/chromium is missing (scripts/setup.sh installs
chromium when it can)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from browser_support import ARGS, CHROMIUM, playwright_or_skip

from distributed_testing.testing import Cluster, Procs, hidden_accelerators, run_cluster, wait_for

playwright_api = playwright_or_skip()

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(60)]
REPO = Path(__file__).resolve().parents[3]
FAST_BENCH = {"model": "mlp", "batch_sizes": [1, 4], "iterations": 3, "warmup": 1, "min_duration_s": 0.01, "tiny": True}


class Env:
    def __init__(self, cluster: Cluster, browser: Any, procs: Procs, victim: Any, keys: dict[str, str],
                 bench_id: str) -> None:
        self.cluster, self.browser, self.procs, self.victim, self.keys = cluster, browser, procs, victim, keys
        self.bench_id = bench_id  # submitted at the start: it measures while the other tests run
        self.url = cluster.base_url + "/dashboard/"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    tmp = tmp_path_factory.mktemp("dash")
    procs = Procs(tmp, cwd=REPO)
    async with run_cluster(tmp, 1, dashboard=True, worker_grace_s=0.0,
                           worker_overrides={"max_concurrent_tasks": 4}) as cluster:
        (bench_id,) = await cluster.submit({"type": "benchmark", "config": FAST_BENCH})
        keys = {role: await cluster.create_key(role) for role in ("viewer", "submitter", "worker")}
        victim = procs.start(["run_worker_example.py", "--coordinator", cluster.base_url, "--api-key", keys["worker"],
                              "--worker-id", "victim", "--name", "victim", "--tags", "victim", "--log-level", "WARNING"],
                             tmp / "victim.log", env=hidden_accelerators(tmp))
        async with playwright_api.async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            try:
                yield Env(cluster, browser, procs, victim, keys, bench_id)
            finally:
                await browser.close()
                await asyncio.to_thread(procs.close)


@contextlib.asynccontextmanager
async def signed_in(env: Env, role: str, tmp_path: Path, page_path: str = "") -> AsyncIterator[Any]:
    """A fresh browser context signed in with a key of ``role``, on ``page_path``; the page's
    screenshot is saved as tmp_path/screenshot.png when the block ends."""
    context = await env.browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    try:
        await page.goto(env.url + "login")
        await page.fill("input[name=key]", env.cluster.admin_key if role == "admin" else env.keys[role])
        await page.click("button[type=submit]")
        await page.wait_for_selector("#signout")
        if page_path:
            await page.goto(env.url + page_path)
        yield page
    finally:
        await page.screenshot(path=str(tmp_path / "screenshot.png"), full_page=True)
        await context.close()


async def row_state(page: Any, task_id: str) -> str:
    return str(await page.eval_on_selector(f'#tasks tr[data-id="{task_id}"] td:nth-child(3)', "e => e.textContent"))


async def test_sign_in_keeps_the_key_out_of_the_page_and_sign_out_ends_the_session(env: Env, tmp_path: Path) -> None:
    context = await env.browser.new_context()
    page = await context.new_page()
    await page.goto(env.url + "tasks")
    assert page.url.endswith("/dashboard/login")  # no session: the login page
    await page.fill("input[name=key]", "not-a-key")
    await page.click("button[type=submit]")
    assert "not accepted" in await page.inner_text("main")
    await page.fill("input[name=key]", env.keys["worker"])
    await page.click("button[type=submit]")
    assert "no read access" in await page.inner_text("main")
    await page.fill("input[name=key]", env.keys["viewer"])
    await page.click("button[type=submit]")
    await page.wait_for_selector("#tasks-by-state")
    await page.screenshot(path=str(tmp_path / "overview.png"), full_page=True)
    (cookie,) = await context.cookies()
    assert cookie["name"] == "dt_session" and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert env.keys["viewer"] not in await page.content() and env.keys["viewer"] not in page.url
    assert await page.evaluate("() => document.cookie") == ""  # HttpOnly: not visible to scripts
    await page.click("#signout")
    await page.wait_for_url("**/dashboard/login")
    await page.goto(env.url + "workers")
    assert page.url.endswith("/dashboard/login")
    await page.screenshot(path=str(tmp_path / "screenshot.png"))
    await context.close()


async def test_a_task_submitted_through_rest_appears_and_changes_state_without_a_reload(env: Env, tmp_path: Path) -> None:
    async with signed_in(env, "submitter", tmp_path, "tasks") as page:
        await page.wait_for_selector("#tasks")
        await page.evaluate("() => { window.notReloaded = true; }")
        (tid,) = await env.cluster.submit({"type": "custom", "config": {"name": "sleep", "parameters": {"seconds": 1.5}}},
                                          key=env.keys["submitter"])
        await page.wait_for_selector(f'#tasks tr[data-id="{tid}"]', timeout=5000)
        await page.wait_for_function(
            f"""() => document.querySelector('#tasks tr[data-id="{tid}"] td:nth-child(3)')?.textContent === 'running'""",
            timeout=5000)
        await page.wait_for_function(
            f"""() => document.querySelector('#tasks tr[data-id="{tid}"] td:nth-child(3)')?.textContent === 'succeeded'""",
            timeout=10000)
        assert await page.evaluate("() => window.notReloaded") is True


async def test_cancel_from_the_tasks_page(env: Env, tmp_path: Path) -> None:
    (tid,) = await env.cluster.submit({"type": "custom", "config": {"name": "noop"},
                                       "requirements": {"tags": ["nowhere"]}}, key=env.keys["submitter"])
    async with signed_in(env, "submitter", tmp_path, "tasks?state=pending") as page:
        await page.wait_for_selector(f'#tasks tr[data-id="{tid}"] button.cancel')
        assert "nowhere" in await page.inner_text(f'#tasks tr[data-id="{tid}"]')  # why it waits
        await page.click(f'#tasks tr[data-id="{tid}"] button.cancel')
        await page.goto(env.url + "tasks")
        await page.wait_for_function(
            f"""() => document.querySelector('#tasks tr[data-id="{tid}"] td:nth-child(3)')?.textContent === 'cancelled'""",
            timeout=5000)
    assert env.cluster.runtime.state.tasks[tid].state == "cancelled"


async def test_a_worker_killed_mid_run_shows_as_disconnected(env: Env, tmp_path: Path) -> None:
    rt = env.cluster.runtime
    await wait_for(lambda: "victim" in rt.sessions, 30, "the victim worker process to register")
    (tid,) = await env.cluster.submit({"type": "custom", "config": {"name": "sleep", "parameters": {"seconds": 30}},
                                       "requirements": {"tags": ["victim"]}})
    await wait_for(lambda: rt.state.tasks[tid].state == "running", 15, "the task to run on the victim")
    async with signed_in(env, "admin", tmp_path, "workers") as page:
        await page.wait_for_selector('#workers tr[data-id="victim"]')
        assert "running" not in await page.inner_text('#workers tr[data-id="victim"] td:nth-child(5)')
        assert "1/" in await page.inner_text('#workers tr[data-id="victim"] td:nth-child(7)')
        env.victim.send_signal(signal.SIGKILL)
        await page.wait_for_function(
            """() => document.querySelector('#workers tr[data-id="victim"] td:nth-child(5)')?.textContent.startsWith('disconnected')""",
            timeout=10000)
        assert await page.locator('#workers tr[data-id="victim"] button.drain').count() == 0
        assert await page.locator('#workers tr[data-id="w0"] button.drain').count() == 1


async def test_a_viewer_sees_no_actions_and_the_server_refuses_them(env: Env, tmp_path: Path) -> None:
    (tid,) = await env.cluster.submit({"type": "custom", "config": {"name": "noop"},
                                       "requirements": {"tags": ["nowhere"]}})
    async with signed_in(env, "viewer", tmp_path, "tasks?state=pending") as page:
        await page.wait_for_selector(f'#tasks tr[data-id="{tid}"]')
        assert await page.locator("button.cancel").count() == 0
        await page.goto(env.url + "workers")
        await page.wait_for_selector('#workers tr[data-id="w0"]')
        assert await page.locator("button.drain").count() == 0
        statuses = await page.evaluate("""async ([tid]) => {
            const csrf = document.querySelector('meta[name=csrf-token]').content;
            const post = (p, token) => fetch(p, {method: 'POST', headers: {'X-CSRF-Token': token, 'Content-Type': 'application/json'}, body: '{}'}).then(r => r.status);
            return [await post(`actions/tasks/${tid}/cancel`, csrf), await post('actions/workers/w0/drain', csrf),
                    await post(`actions/tasks/${tid}/cancel`, 'wrong')]; }""", [tid])
        assert statuses == [403, 403, 403]
    assert env.cluster.runtime.state.tasks[tid].state == "pending"
    assert env.cluster.runtime.state.workers["w0"].health != "draining"


async def test_a_benchmark_task_page_draws_its_charts(env: Env, tmp_path: Path) -> None:
    tid = env.bench_id
    assert (await env.cluster.wait(tid, 60))["state"] == "succeeded"
    async with signed_in(env, "viewer", tmp_path, f"tasks/{tid}") as page:
        await page.wait_for_selector("#latency-chart")
        points = await page.evaluate("() => window.dtCharts['latency-chart'].data.datasets[0].data.map(p => p.x)")
        assert points == [1, 4]
        assert await page.evaluate("() => window.dtCharts['throughput-chart'].data.datasets[0].data.every(p => p.y > 0)")
        painted = await page.evaluate("""(() => { const c = document.getElementById('latency-chart');
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0;
            for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; })()""")
        assert painted > 1000, painted  # axes, labels and the line are drawn
        assert "fingerprint_hash" in await page.inner_text("#env")
        assert await page.locator("#bench-table tbody tr").count() == 2


async def test_failures_show_the_first_line_of_their_error_and_link_to_the_task(env: Env, tmp_path: Path) -> None:
    (env.cluster.tmp / "test_broken_import.py").write_text("import no_such_module_here\n\n\ndef test_x():\n    pass\n")
    (tid,) = await env.cluster.submit({"type": "test", "config": {"test_file": "test_broken_import.py"}})
    task = await env.cluster.wait(tid, 60)
    error = task["outcome"]["error"]
    assert task["state"] == "failed" and error.count("\n") > 5, error  # pytest's whole tail: what used to fill the page
    first = error.splitlines()[0]
    async with signed_in(env, "viewer", tmp_path) as page:
        cell = f'#failures tr[data-id="{tid}"] td:nth-child(6)'
        await page.wait_for_selector(cell)
        line = await page.inner_text(f"{cell} .err-line")  # the head, the cause pytest printed, the link
        assert line == f"{first} ModuleNotFoundError: No module named 'no_such_module_here' (full error)", line
        assert await page.get_attribute(f"{cell} a.more", "href") == f"tasks/{tid}"
        box = None
        for _ in range(50):  # the live page redraws its tables: a row can be between two draws
            box = await page.locator(f'#failures tr[data-id="{tid}"]').bounding_box()
            if box is not None:
                break
            await asyncio.sleep(0.1)
        assert box is not None and box["height"] < 120, box
        # an idle queue's axis starts at 0, not -1
        await page.wait_for_function("() => window.dtCharts?.['queue-chart']?.scales?.y")
        y = await page.evaluate("() => { const s = window.dtCharts['queue-chart'].scales.y; return [s.min, s.max]; }")
        assert y[0] == 0 and y[1] >= 1, y
        assert await page.inner_text('#coordinators tbody tr td:nth-child(3)') == "healthy"
        await page.goto(env.url + "tasks?state=failed")
        await page.wait_for_selector(f'#tasks tr[data-id="{tid}"] a.more')
        assert await page.inner_text(f'#tasks tr[data-id="{tid}"] .err-line') == line


async def test_the_benchmarks_page_opens_on_a_model_that_has_results(env: Env, tmp_path: Path) -> None:
    task = await env.cluster.wait(env.bench_id, 60)
    assert task["state"] == "succeeded"
    async with signed_in(env, "viewer", tmp_path, "benchmarks") as page:
        await page.wait_for_selector("#bench tbody tr td a")  # something shows without typing a name
        assert await page.input_value("select#model") == "mlp"
        assert "mlp" in await page.eval_on_selector_all("select#model option", "os => os.map(o => o.value)")
        heads = await page.eval_on_selector_all("#bench th", "ths => ths.map(t => t.textContent)")
        assert "cv (std/mean)" in heads and "IQR/median" in heads, heads
        cv, iqr = await page.eval_on_selector(
            "#bench tbody tr", "tr => [tr.cells[5].textContent, tr.cells[6].textContent]")
        assert cv.endswith(" %") and iqr.endswith(" %"), (cv, iqr)
        # one run: the time axis spans minutes around it, not years
        await page.wait_for_function("() => window.dtCharts?.['time-chart']?.scales?.x")
        lo, hi = await page.evaluate("() => { const s = window.dtCharts['time-chart'].scales.x; return [s.min, s.max]; }")
        assert hi - lo <= 3 * 3600 * 1000 and lo <= task["updated_at"] * 1000 <= hi, (lo, hi, task["updated_at"])


async def test_a_run_s_page_lists_failures_first_and_cancel_and_rerun_work_for_its_submitter(env: Env, tmp_path: Path) -> None:
    c, sub = env.cluster, env.keys["submitter"]
    (c.tmp / "test_run_red.py").write_text("def test_ok():\n    pass\n\n\ndef test_bad():\n    assert 1 == 2\n")
    (c.tmp / "test_run_green.py").write_text("def test_ok():\n    pass\n")
    status, run = await c.request("POST", "/api/v1/runs", key=sub, json={"name": "ci #7 main"})
    assert status == 201, run
    rid = run["run_id"]
    green, red, stuck = await c.submit([
        {"type": "test", "config": {"test_file": "test_run_green.py"}, "run_id": rid},
        {"type": "test", "config": {"test_file": "test_run_red.py"}, "run_id": rid},
        {"type": "custom", "config": {"name": "noop"}, "requirements": {"tags": ["nowhere"]}, "run_id": rid}], key=sub)
    assert [(await c.wait(t, 60))["state"] for t in (green, red)] == ["succeeded", "failed"]
    async with signed_in(env, "viewer", tmp_path, "runs") as page:
        await page.wait_for_selector(f'#runs tr[data-id="{rid}"]')
        row = await page.eval_on_selector(f'#runs tr[data-id="{rid}"]', "r => [...r.cells].map(c => c.textContent)")
        assert row[0] == "ci #7 main" and row[3] == "running", row  # one task still waits
        assert "1 failed" in row[4] and "1 pending" in row[4] and "1 succeeded" in row[4], row
        await page.click(f'#runs tr[data-id="{rid}"] a')
        await page.wait_for_selector(f'#run-tasks tr[data-id="{red}"]')
        ids = await page.eval_on_selector_all("#run-tasks tbody tr", "rs => rs.map(r => r.dataset.id)")
        assert ids[0] == red and set(ids) == {red, green, stuck}, ids  # the failure first
        cells = await page.eval_on_selector(f'#run-tasks tr[data-id="{red}"]', "r => [...r.cells].map(c => c.textContent)")
        assert cells[2:4] == ["failed", "w0"] and cells[6] == "1 passed, 1 failed", cells  # pytest's words
        assert cells[7].startswith("1 of 2 tests failed") and "test_run_red.py::test_bad" in cells[7], cells
        assert await page.get_attribute(f'#run-tasks tr[data-id="{red}"] a', "href") == f"tasks/{red}"
        assert await page.locator("button.act").count() == 0  # a viewer is offered neither
        statuses = await page.evaluate("""async ([rid]) => {
            const csrf = document.querySelector('meta[name=csrf-token]').content;
            const post = p => fetch(p, {method: 'POST', headers: {'X-CSRF-Token': csrf, 'Content-Type': 'application/json'},
                                        body: '{"failed": true}'}).then(r => r.status);
            return [await post(`actions/runs/${rid}/cancel`), await post(`actions/runs/${rid}/rerun`)]; }""", [rid])
        assert statuses == [403, 403]
        await page.goto(env.url + f"tasks/{red}")  # the task page words each test's outcome as pytest does
        await page.wait_for_selector("#tests tbody tr td")
        words = await page.eval_on_selector_all("#tests tbody tr td:nth-child(2)", "cs => cs.map(c => c.textContent)")
        assert sorted(words) == ["failed", "passed"], words
        await page.goto(env.url + "tasks?state=failed")  # the Tasks list links each task's run
        await page.wait_for_selector(f'#tasks tr[data-id="{red}"] a[href="runs/{rid}"]')
    async with signed_in(env, "submitter", tmp_path, f"runs/{rid}") as page:
        page.on("dialog", lambda dialog: dialog.accept())
        await page.click("button.cancel")
        await page.wait_for_function(
            f"""() => document.querySelector('#run-tasks tr[data-id="{stuck}"] td:nth-child(3)')?.textContent === 'cancelled'""",
            timeout=5000)
        assert await page.locator("button.cancel").count() == 0  # the run has ended
        await page.screenshot(path=str(tmp_path / "run.png"), full_page=True)  # docs/dashboard-run.png
        await page.click("button.rerun >> text=Re-run failed (2)")
        await page.wait_for_url(lambda url: "/runs/run-" in url and rid not in url)
        new = page.url.rsplit("/", 1)[1]
        await page.wait_for_selector("#run-tasks tbody tr[data-id]")
        ids = await page.eval_on_selector_all("#run-tasks tbody tr", "rs => rs.map(r => r.dataset.id)")
        short = new.removeprefix("run-")
        assert sorted(ids) == sorted([f"{red}@{short}", f"{stuck}@{short}"]), ids  # the failed and the cancelled one
        assert await page.inner_text("h1") == "Run ci #7 main (re-run failed)"
    status, body = await c.request("POST", f"/api/v1/runs/{new}/cancel", key=sub)  # leaves nothing waiting
    assert status == 200, body
