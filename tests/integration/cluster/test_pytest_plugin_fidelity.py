"""Suite shapes found in registry suites that a shipped run must report as local pytest does, over a
real coordinator and a bundle worker in its sandbox, compared with plain pytest on a copy of the
same tree:

* pytest's cache: a ``cache_dir`` in the ini under ``filterwarnings = error`` (the workers' pytest
  had its cache off, so the key was an unknown option, and the warning an error that stopped the
  session: every test an error), and a test that uses the ``cache`` fixture (not found there);
* ``--ignore``: the run's sessions collect the run's paths, and an ignored folder's conftest,
  whose ``pytest_collection_modifyitems`` acts on every test, loaded there (every test skipped).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path

import pytest

from distributed_testing.testing import run_cluster
from distributed_testing.testing.suites import plugin_args, short_summary
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

PYPROJECT = '''[tool.pytest.ini_options]
cache_dir = ".cache/pytest"
testpaths = ["tests"]
filterwarnings = ["error"]
'''
TESTS = '''
def test_the_cache_fixture(cache):
    cache.set("suite/value", [1, 2])
    assert cache.get("suite/value", None) == [1, 2]


def test_plain():
    pass


def test_fails():
    assert 1 == 2
'''
LEGACY_CONFTEST = '''import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.skip(reason="the legacy conftest skips everything"))
'''


def _suite(root: Path) -> None:
    (root / "tests" / "legacy").mkdir(parents=True)
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / "tests" / "test_a.py").write_text(TESTS)
    (root / "tests" / "legacy" / "conftest.py").write_text(LEGACY_CONFTEST)
    (root / "tests" / "legacy" / "test_old.py").write_text("def test_old():\n    pass\n")


async def _pytest(cwd: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pytest", "-p", "no:asyncio", "-rA", *args, cwd=cwd, env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


async def test_the_cache_and_ignored_folders_act_there_as_here(tmp_path: Path) -> None:
    suite, copy = tmp_path / "suite", tmp_path / "copy"
    _suite(suite)
    shutil.copytree(suite, copy)
    code, want = await _pytest(copy, "-p", "no:distributed_testing", "--ignore=tests/legacy")
    assert code == 1 and "1 failed, 2 passed" in want, want  # what local pytest says, to compare with
    async with run_cluster(tmp_path / "c", workers=0) as c:
        await c.add_worker(worker_id="w1", accept_bundles=True, sandbox="bwrap", max_concurrent_tasks=1)
        key = await c.create_key("submitter", allow_code=True)
        code, out = await _pytest(suite, *plugin_args(), "--dt-coordinator", c.base_url, "--dt-no-env",
                                  "--ignore=tests/legacy", env={"DT_API_KEY": key})
    assert code == 1, out
    assert short_summary(out) == short_summary(want), (out, want)
