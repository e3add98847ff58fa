"""Runs over a real coordinator and workers (issue 38): a pytest session makes one run (its name,
its line on the terminal, its tests' failures in the run's detail), ``--failed`` re-runs only what
failed under a new run, and a run with its tasks survives a restart of a DuckDB coordinator."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import pytest

from distributed_testing.testing import run_cluster
from distributed_testing.testing.suites import plugin_args

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]


async def test_a_run_and_its_tasks_survive_a_duckdb_coordinator_restart(tmp_path: Path) -> None:
    db = str(tmp_path / "c.duckdb")
    async with run_cluster(tmp_path, workers=1, db_path=db) as c:
        status, run = await c.request("POST", "/api/v1/runs", json={"name": "before", "labels": {"commit": "abc"}})
        assert status == 201, run
        rid = run["run_id"]
        ids = await c.submit([{"task_id": "ok", "run_id": rid, "type": "custom", "config": {"name": "noop"}},
                              {"task_id": "slow", "run_id": rid, "type": "custom", "timeout_s": 0.3,
                               "config": {"name": "sleep", "parameters": {"seconds": 5}}}])
        for tid in ids:
            await c.wait(tid)
        _, before = await c.request("GET", f"/api/v1/runs/{rid}")
    async with run_cluster(tmp_path, workers=0, db_path=db) as c:
        await c.add_worker(worker_id="w-after")  # w0 belongs to the first cluster's worker key
        status, after = await c.request("GET", f"/api/v1/runs/{rid}")
        assert status == 200 and after == before, after
        assert after["state"] == "failed" and after["counts"] == {"succeeded": 1, "timed_out": 1}
        assert [t["task_id"] for t in after["tasks"]] == ["slow", "ok"]
        # the re-run reads the finished tasks back from the file: only the one that failed runs again
        status, again = await c.request("POST", f"/api/v1/runs/{rid}/rerun", json={"failed": True})
        assert status == 201, again
        assert again["task_ids"] == {"slow": f"slow@{again['run_id'].removeprefix('run-')}"}
        status, listed = await c.request("GET", "/api/v1/runs")
        assert [r["run_id"] for r in listed["runs"]] == [again["run_id"], rid]


SUITE = {"test_good.py": "def test_one():\n    assert True\n\n\ndef test_two():\n    assert True\n",
         "test_bad.py": "def test_breaks():\n    value = 41\n    assert value == 42, 'off by one'\n"}


async def _pytest(root: Path, url: str, key: str, *args: str) -> tuple[int, str]:
    env = {**os.environ, "DT_API_KEY": key, "DT_DASHBOARD_URL": "http://dash.example/dashboard"}
    for var in ("GITHUB_WORKFLOW", "CI_JOB_NAME", "BUILDKITE_PIPELINE_SLUG", "JOB_NAME"):
        env.pop(var, None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "--rootdir", str(root),
        "--dt-coordinator", url, "--dt-shared-tree", *args, str(root), cwd=root, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


@pytest.mark.slow
async def test_a_pytest_session_makes_one_run_and_rerun_failed_runs_only_its_failure(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    for name, text in SUITE.items():
        (suite / name).write_text(text)
    async with run_cluster(tmp_path, workers=0) as c:
        await c.add_worker(worker_id="w1", test_root=suite, sandbox="none", max_concurrent_tasks=2)
        key = await c.create_key("submitter")
        code, out = await _pytest(suite, c.base_url, key, "--dt-run-name", "plugin session")
        assert code == 1 and "1 failed, 2 passed" in out, out
        (rid,) = re.findall(r"distributed_testing: run (run-[0-9a-f]{12}) \(plugin session\): "
                            r"http://dash\.example/dashboard/runs/\1", out)
        status, run = await c.request("GET", f"/api/v1/runs/{rid}")
        assert status == 200 and run["state"] == "failed", run
        first = run["tasks"][0]
        assert first["state"] == "failed" and first["tests"]["failing"] == ["test_bad.py::test_breaks"], run
        assert all(t["state"] == "succeeded" for t in run["tasks"][1:])
        assert run["total"] == sum(run["counts"].values()) == len(run["tasks"])

        status, again = await c.request("POST", f"/api/v1/runs/{rid}/rerun", json={"failed": True}, key=key)
        assert status == 201, again
        assert list(again["task_ids"]) == [first["task_id"]]
        (new_id,) = again["task_ids"].values()
        assert (await c.wait(new_id))["state"] == "failed"

        # without --dt-run-name and outside CI: "pytest <rootdir name>"
        code, out = await _pytest(suite, c.base_url, key, "-k", "good")
        assert code == 0 and re.search(r"distributed_testing: run run-[0-9a-f]{12} \(pytest suite\)", out), out
