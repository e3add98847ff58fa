"""What a CI user does after a red build (issue 38), end to end over real processes: a
``run_coordinator.py --dashboard`` process, one ``run_worker_example.py`` process, the pytest
plugin in its own process, ``dt`` processes and Debian's Chromium.

- a plugin session makes a run in which one test fails; a task file submitted with ``dt submit``
  makes another run;
- ``dt logs -f`` prints a running test task's output before the task ends, and the dashboard's
  task page shows the same output streamed while it runs;
- ``dt rerun RUN --failed`` runs only the failed test's task again, as a new run;
- ``dt cancel --run RUN`` cancels what is left of a run;
- Chromium finds the plugin's run on the Runs page and its failure's first line on the run page.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from distributed_testing.testing import Procs, Rest, hidden_accelerators, start_coordinator_process, wait_until
from distributed_testing.testing.suites import plugin_args

CHROMIUM = os.environ.get("DT_TEST_CHROMIUM", "/usr/bin/chromium")
pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

SUITE = {
    "test_ok.py": "def test_one():\n    assert True\n\n\ndef test_two():\n    assert True\n",
    "test_red.py": "def test_breaks():\n    value = 41\n    assert value == 42, 'off by one'\n",
    "test_wait.py": ("import pathlib, sys, time\n\n\ndef test_waits_for_go():\n"
                     "    print('waiting for go', file=sys.stderr, flush=True)\n"
                     "    go = pathlib.Path(__file__).with_name('go')\n"
                     "    deadline = time.monotonic() + 120\n"
                     "    while not go.exists() and time.monotonic() < deadline:\n"
                     "        time.sleep(0.05)\n"
                     "    assert go.exists()\n"),
}
RUN_LINE = re.compile(r"run (run-[0-9a-f]{12}) \((.*)\): (\S+)$", re.M)


def _env(url: str, key: str, dashboard: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DT_")}
    for var in ("GITHUB_WORKFLOW", "GITHUB_SHA", "CI_JOB_NAME", "BUILDKITE_PIPELINE_SLUG", "JOB_NAME"):
        env.pop(var, None)
    return {**env, "DT_COORDINATOR_URL": url, "DT_API_KEY": key, "DT_DASHBOARD_URL": dashboard}


def _dt(env: dict[str, str], *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "distributed_testing.cli.dt", *argv], env=env, capture_output=True,
                          text=True, timeout=timeout)


def _plugin(suite: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "--rootdir", str(suite),
                           "--dt-coordinator", env["DT_COORDINATOR_URL"], "--dt-shared-tree", *args, str(suite)],
                          cwd=suite, env=env, capture_output=True, text=True, timeout=180)


def _sign_in(browser: Any, dash: str, key: str) -> Any:
    page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
    page.goto(dash + "/login")
    page.fill("input[name=key]", key)
    page.click("button[type=submit]")
    page.wait_for_selector("#signout")
    return page


def test_a_red_build_is_found_read_rerun_and_cancelled(procs: Procs, tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if not shutil.which(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium; scripts/setup.sh does it as root)")
    suite = tmp_path / "suite"
    suite.mkdir()
    for name, text in SUITE.items():
        (suite / name).write_text(text)
    _c, port = start_coordinator_process(procs, tmp_path / "c.duckdb", args=["--dashboard", "--log-level", "WARNING"])
    url, dash = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/dashboard"
    admin = Rest(url, (tmp_path / "admin.key").read_text().strip(), timeout=30)
    submitter = admin.create_key("submitter")
    procs.start(["run_worker_example.py", "--coordinator", url, "--api-key", admin.create_key("worker"),
                 "--worker-id", "w1", "--test-root", str(suite), "--max-concurrent-tasks", "3",
                 "--log-level", "WARNING"], tmp_path / "worker.log", env=hidden_accelerators(tmp_path))
    env = _env(url, submitter, dash)
    me = Rest(url, submitter, timeout=30)

    # a plugin session: one run, one failed test
    red = _plugin(suite, env, "--dt-run-name", "ci #12 main", "-k", "ok or red")
    assert red.returncode == 1 and "1 failed, 2 passed" in red.stdout, red.stdout + red.stderr
    [(plugin_run, name, link)] = RUN_LINE.findall(red.stdout + red.stderr)
    assert name == "ci #12 main" and link == f"{dash}/runs/{plugin_run}"
    run = me.ok("GET", f"/api/v1/runs/{plugin_run}")
    failed = run["tasks"][0]  # failures first
    assert run["state"] == "failed" and failed["tests"]["failing"] == ["test_red.py::test_breaks"], run

    # a task file: a test that waits for its go file, and a long task to cancel with the run
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps([
        {"task_id": "waits", "type": "test", "config": {"test_file": "test_wait.py", "test_args": ["-s"]}},
        {"task_id": "long", "type": "custom", "config": {"name": "sleep", "parameters": {"seconds": 120}}}]))
    submitted = _dt(env, "submit", str(tasks), "--run-name", "task file")
    assert submitted.returncode == 0, submitted.stderr
    [(file_run, _name, _link)] = RUN_LINE.findall(submitted.stderr)
    assert submitted.stdout.split() == ["waits", "long"]

    # dt logs -f shows the running test's output before it ends; so does its task page
    follow = subprocess.Popen([sys.executable, "-m", "distributed_testing.cli.dt", "logs", "-f", "waits"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = ""
        assert follow.stdout is not None
        while "waiting for go" not in seen:
            line = follow.stdout.readline()
            assert line, f"dt logs -f ended before the output came: {seen!r} {follow.stderr.read() if follow.stderr else ''}"
            seen += line
        assert me.ok("GET", "/api/v1/tasks/waits")["state"] == "running"
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
            try:
                page = _sign_in(browser, dash, submitter)
                page.goto(f"{dash}/tasks/waits")
                page.wait_for_function("() => document.getElementById('output-log')?.textContent.includes('waiting for go')",
                                       timeout=30000)
                assert me.ok("GET", "/api/v1/tasks/waits")["state"] == "running"
                (suite / "go").write_text("")
                rest, _err = follow.communicate(timeout=60)
                assert follow.returncode == 0, (seen + rest, _err)

                # the Runs page lists the plugin's run; its page gives the failure's first line
                page.goto(f"{dash}/runs")
                page.wait_for_selector(f'#runs tr[data-id="{plugin_run}"]')
                page.click(f'#runs tr[data-id="{plugin_run}"] a')
                row = f'#run-tasks tr[data-id="{failed["task_id"]}"]'
                page.wait_for_selector(row)
                first = page.eval_on_selector_all("#run-tasks tbody tr", "rs => rs.map(r => r.dataset.id)")[0]
                assert first == failed["task_id"]
                text = page.inner_text(row)
                assert "test_red.py::test_breaks" in text and "failed" in text, text
                page.screenshot(path=str(tmp_path / "run.png"), full_page=True)
            finally:
                browser.close()
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()

    # dt rerun --failed: only the failed test's task, under a new run
    again = _dt(env, "rerun", plugin_run, "--failed", "--wait")
    assert again.returncode == 1, again.stderr  # it fails again: the code did not change
    [(new_run, _name, _link)] = RUN_LINE.findall(again.stderr)
    assert new_run != plugin_run
    rerun = me.ok("GET", f"/api/v1/runs/{new_run}")
    assert [t["task_id"] for t in rerun["tasks"]] == [f"{failed['task_id']}@{new_run.removeprefix('run-')}"], rerun
    assert rerun["tasks"][0]["tests"]["failing"] == ["test_red.py::test_breaks"]

    # dt cancel --run: what is left of the task file's run
    wait_until(lambda: me.ok("GET", "/api/v1/tasks/long")["state"] in ("assigned", "running"), 60, "long to start")
    cancelled = _dt(env, "cancel", "--run", file_run)
    assert cancelled.returncode == 0, cancelled.stderr
    wait_until(lambda: me.ok("GET", "/api/v1/tasks/long")["state"] == "cancelled", 60, "long to be cancelled")
    ended = me.ok("GET", f"/api/v1/runs/{file_run}")
    assert {t["task_id"]: t["state"] for t in ended["tasks"]} == {"waits": "succeeded", "long": "cancelled"}
    deadline = time.monotonic() + 30
    while ended["ended_at"] is None and time.monotonic() < deadline:
        time.sleep(0.2)
        ended = me.ok("GET", f"/api/v1/runs/{file_run}")
    assert ended["ended_at"] is not None and ended["state"] == "cancelled", ended
