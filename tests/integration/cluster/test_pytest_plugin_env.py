"""The Python environment travels with a shipped run, over a real coordinator and two bundle
workers in their sandboxes, with no file written by hand: the submitter's pytest runs in a
virtual environment holding pytest 9.1.1 (not the workers' version) and cloudpickle (which the
workers' Python lacks), and the suite that needs it passes there; the workers' own pytest plugins
(pytest-asyncio, installed beside them) and packages do not load into the run; the environment is
activated there as it is here (a test runs the ``pytest`` console script by name, as python-dotenv's
CLI tests run ``dotenv``: not found there before); the two workers share one environment, built
once, and the second run reuses it."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from distributed_testing.testing import run_cluster
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

PYTEST = "9.1.1"  # the submitter's; the workers run another (their .venv's)
CLOUDPICKLE = "3.1.2"
SUITE = f'''import importlib.util
import os
import shutil
import subprocess
import sys

import cloudpickle
import pytest


def test_the_dependency_came_with_the_run():
    assert cloudpickle.loads(cloudpickle.dumps(lambda: 3))() == 3


def test_no_plugin_or_package_of_the_worker(request):
    assert not request.config.pluginmanager.has_plugin("asyncio")
    assert importlib.util.find_spec("pytest_asyncio") is None
    assert importlib.util.find_spec("distributed_testing") is None


def test_the_submitters_pytest():
    assert pytest.__version__ == {PYTEST!r}


def test_the_environment_is_activated():
    found = shutil.which("pytest")
    assert found is not None and os.path.realpath(found) == os.path.realpath(os.path.join(sys.prefix, "bin", "pytest"))
    assert os.path.realpath(os.environ["VIRTUAL_ENV"]) == os.path.realpath(sys.prefix)
    done = subprocess.run(["pytest", "--version"], capture_output=True, text=True, check=True)
    assert {PYTEST!r} in done.stdout + done.stderr
'''


async def _run(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(*argv, cwd=cwd, env={**os.environ, **(env or {})},
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


async def _submitter_python(where: Path) -> Path:
    """A virtual environment with only pytest and cloudpickle installed, that imports this
    package (the plugin) from this interpreter's site directory, which it adds after its own: a
    path, not an installation, so it does not travel."""
    code, out = await _run(sys.executable, "-m", "venv", "--without-pip", str(where), cwd=where.parent)
    assert code == 0, out
    python = where / "bin" / "python"
    code, out = await _run(sys.executable, "-m", "pip", "--python", str(python), "install", "--no-input",
                           "--disable-pip-version-check", f"pytest=={PYTEST}", f"cloudpickle=={CLOUDPICKLE}",
                           cwd=where.parent)
    assert code == 0, out
    purelib = next((where / "lib").glob("python*/site-packages"))
    ours = Path(importlib.util.find_spec("aiohttp").origin).parents[1]  # type: ignore[union-attr, arg-type]
    (purelib / "zz_dt_dev.pth").write_text(f"import site; site.addsitedir({str(ours)!r})\n")
    return python


async def _envs(c: Any) -> list[dict[str, Any]]:
    """The python_env reports of the plugin's tasks, in submission order."""
    status, body = await c.request("GET", "/api/v1/tasks", params={"limit": "100"})
    assert status == 200, body
    out = []
    for t in body["tasks"]:
        if t["task_id"].startswith(("pytest-", "session-")):  # the tests' tasks and those that start sessions
            done = await c.wait(t["task_id"], timeout=60)
            result = done.get("result") or {}
            if done.get("state") == "cancelled":  # one that starts a session early, never given a worker
                continue
            out.append({**(result.get("output") or {}).get("python_env", {}), "task_id": t["task_id"],
                        "session": (result.get("output") or {}).get("session"), "worker": result.get("worker_id")})
    return sorted(out, key=lambda e: e["task_id"])


async def test_the_submitters_environment_runs_the_tests_on_two_workers_built_once(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    for name in ("test_a.py", "test_b.py"):  # eight tests: a chunk each, served by each worker's pytest session
        (suite / name).write_text(SUITE)
    python = await _submitter_python(tmp_path / "submitter")
    state = tmp_path / "state"  # both workers' state folder: one pyenvs/ for the host
    async with run_cluster(tmp_path / "c", workers=0) as c:
        for w in ("w1", "w2"):
            await c.add_worker(worker_id=w, accept_bundles=True, sandbox="bwrap", task_network="none",
                               max_concurrent_tasks=1, db_path=state / f"{w}.duckdb")
        key = await c.create_key("submitter", allow_code=True)
        argv = (str(python), "-m", "pytest", "-p", "no:cacheprovider", "-p", "distributed_testing.pytest_plugin",
                "--dt-coordinator", c.base_url, "-rA")
        env = {"DT_API_KEY": key, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # this interpreter's plugins stay out
               # the environment activated, as a user's shell has it
               "VIRTUAL_ENV": str(python.parent.parent), "PATH": os.pathsep.join([str(python.parent), os.environ.get("PATH", os.defpath)])}
        code, out = await _run(*argv, cwd=suite, env=env)
        assert code == 0 and "8 passed" in out, out
        first = await _envs(c)
        code, out = await _run(*argv, cwd=suite, env=env)
        assert code == 0 and "8 passed" in out, out
        second = [e for e in await _envs(c) if e["task_id"] not in {f["task_id"] for f in first}]
    # eight tests' tasks, and those that started a session early (one per slot, unless the run was over first)
    assert 8 <= len(first) <= 10 and 8 <= len(second) <= 10, (first, second)
    for e in first + second:
        assert e["isolated"] is True, e
        assert f"pytest=={PYTEST}" in e["requirements"] and f"cloudpickle=={CLOUDPICKLE}" in e["requirements"], e
        assert not any(r.startswith(("aiohttp", "torch", "distributed")) for r in e["requirements"]), e
    assert len({e["digest"] for e in first + second}) == 1, (first, second)
    # two workers, one build (the pyenvs check below): the task that built it is on record unless it was the
    # other worker's session-starting task, cancelled when the first worker had run every chunk before that
    # session was ready (a cancelled task records no result)
    assert [e["cached"] for e in first].count(False) <= 1, first
    assert all(e["cached"] for e in second), second
    for run in (first, second):  # each worker's pytest session served its tasks of one run, and no other run's
        started = [e["worker"] for e in run if not e["session"]["reused"]]
        assert sorted(started) == sorted({e["worker"] for e in run}), run
    assert len(list((state / "pyenvs").glob("*/.dt-complete"))) == 1
