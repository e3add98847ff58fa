"""Run control of the pytest plugin over real processes: ``-x``, Ctrl-C and ``--dt-timeout``
cancel every task the run queued (none is left pending or running on the coordinator), and a
test no connected worker can run fails after ``--dt-unschedulable-timeout`` with the
coordinator's reason."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from distributed_testing.testing import Cluster, run_cluster
from distributed_testing.testing.suites import plugin_args

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300), pytest.mark.slow]

SLOW = "import time\n\ndef test_sleeps():\n    time.sleep(120)\n"


async def _start(root: Path, url: str, key: str, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "--rootdir", str(root),
        "--dt-coordinator", url, "--dt-shared-tree", *args, cwd=root, env={**os.environ, "DT_API_KEY": key},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)


async def _pytest(root: Path, url: str, key: str, *args: str) -> tuple[int, str]:
    proc = await _start(root, url, key, *args)
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


async def _open_tasks(c: Cluster) -> list[str]:
    """Ids of the tasks still pending, assigned or running."""
    status, body = await c.request("GET", "/api/v1/tasks", params={"limit": "1000"})
    assert status == 200, body
    return [t["task_id"] for t in body["tasks"] if t["state"] in ("pending", "assigned", "running")]


async def _states(c: Cluster) -> dict[str, str]:
    status, body = await c.request("GET", "/api/v1/tasks", params={"limit": "1000"})
    assert status == 200, body
    return {t["task_id"]: t["state"] for t in body["tasks"]}


async def test_x_and_ctrl_c_and_timeout_leave_no_task_queued(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_a_fails.py").write_text("def test_fails():\n    assert 1 == 2\n")
    for i in range(4):
        (suite / f"test_b{i}.py").write_text(SLOW)
    async with run_cluster(tmp_path, workers=0) as c:
        await c.add_worker(worker_id="w1", test_root=suite)  # one slot: four chunks, three queued
        key = await c.create_key("submitter")

        code, out = await _pytest(suite, c.base_url, key, "-x", "test_a_fails.py", "test_b0.py", "test_b1.py")
        assert code == 1 and "stopping after 1 failures" in out and "1 failed" in out, out
        assert await _open_tasks(c) == [], await _states(c)

        proc = await _start(suite, c.base_url, key, "test_b2.py", "test_b3.py")
        for _ in range(600):  # until the first chunk runs on the worker
            if "running" in (await _states(c)).values():
                break
            await asyncio.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out = (await proc.communicate())[0].decode()
        assert proc.returncode == 2 and "KeyboardInterrupt" in out, out
        assert await _open_tasks(c) == [], await _states(c)

        code, out = await _pytest(suite, c.base_url, key, "--dt-timeout", "3", "test_b0.py")
        assert code == 1 and "--dt-timeout ran out" in out, out
        assert await _open_tasks(c) == [], await _states(c)


async def test_a_test_no_worker_can_run_fails_with_the_coordinators_reason(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_gpu.py").write_text("import pytest\n\n@pytest.mark.dt(tags=['a100'])\ndef test_needs_a100():\n"
                                       "    pass\n\ndef test_anywhere():\n    pass\n")
    async with run_cluster(tmp_path, workers=0) as c:
        await c.add_worker(worker_id="w1", test_root=suite)
        key = await c.create_key("submitter")
        code, out = await _pytest(suite, c.base_url, key, "--dt-unschedulable-timeout", "1", "-rA")
        assert code == 1, out
        assert "1 passed, 1 error" in out, out
        assert "no connected worker can run it for 1 s" in out and "w1 lacks tag a100" in out, out
        [short] = [line for line in out.splitlines() if line.startswith("ERROR test_gpu.py::test_needs_a100")]
        assert "] no connected worker can" in short, out  # -rA's summary line starts with the reason (cut at 80 columns)
        assert await _open_tasks(c) == [], await _states(c)


async def test_listing_options_ship_nothing(tmp_path: Path) -> None:
    """The plugin starts its run at pytest's session start, before collecting: under the options
    that run no test (``--collect-only``, ``--fixtures``) it makes no run and sends no task."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_a.py").write_text("def test_a():\n    pass\n")
    async with run_cluster(tmp_path, workers=0) as c:
        await c.add_worker(worker_id="w1", test_root=suite)
        key = await c.create_key("submitter")
        for option in ("--collect-only", "--fixtures"):
            code, out = await _pytest(suite, c.base_url, key, option)
            assert code == 0 and "test_a" in out, out
        status, body = await c.request("GET", "/api/v1/runs")
        assert status == 200 and body["runs"] == [], body
        assert await _states(c) == {}

        code, out = await _pytest(suite, c.base_url, key)  # and the same suite does run
        assert code == 0 and "1 passed" in out, out
        status, body = await c.request("GET", "/api/v1/runs")
        assert status == 200 and len(body["runs"]) == 1, body
