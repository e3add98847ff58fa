"""How the local pytest was started travels: ``python -m pytest`` puts its working directory first
on ``sys.path`` and the ``pytest`` command does not, so a package lying in the tree shadows an
installed one (the built copy, with its compiled parts) under the first and not under the second.
The workers' pytest starts alike (``safe_path``: Python's ``PYTHONSAFEPATH``), so a test that
imports the tree's folder under ``python -m pytest`` does there too, and one that must not find
it under ``pytest`` does not find it there either. Before, the workers always ran ``python -m
pytest``: the ``pytest`` command's run failed there and passed here."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from distributed_testing.testing import bundle_cluster
from distributed_testing.testing.suites import PLUGIN, submitter_env
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(600), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

# tests/ has no __init__.py and the root no conftest.py: pytest puts tests/ on sys.path, not the root
TESTS = '''\
import importlib.util
import os


def test_the_trees_package_is_found_as_where_pytest_was_started():
    assert (importlib.util.find_spec("flatpkg") is not None) == (os.environ["FOUND_HERE"] == "1")
'''
STARTS = {"command": "0", "module": "1"}  # the pytest command, python -m pytest: whether flatpkg is found


async def test_the_workers_pytest_starts_as_the_local_one_did(tmp_path: Path) -> None:
    tree = tmp_path / "proj"
    (tree / "flatpkg").mkdir(parents=True)
    (tree / "flatpkg" / "__init__.py").write_text("VALUE = 1\n")
    (tree / "tests").mkdir()
    (tree / "tests" / "test_start.py").write_text(TESTS)
    python = await asyncio.to_thread(submitter_env, tmp_path / "venv", [])
    async with bundle_cluster(tmp_path) as (c, key):

        def run(start: str, *fleet: str) -> subprocess.CompletedProcess[str]:
            head = [str(python.parent / "pytest")] if start == "command" else [str(python), "-m", "pytest"]
            return subprocess.run([*head, "-p", PLUGIN, "-p", "no:cacheprovider", "-rA", *fleet], cwd=tree,
                                  env={**os.environ, "DT_API_KEY": key, "FOUND_HERE": STARTS[start]},
                                  capture_output=True, text=True, timeout=300, check=False)

        outs = {}
        for start in STARTS:
            outs[start] = (await asyncio.to_thread(run, start),
                           await asyncio.to_thread(run, start, "--dt-coordinator", c.base_url, "--dt-env", "FOUND_HERE"))
    for start, (local, fleet) in outs.items():
        assert local.returncode == 0 and "1 passed" in local.stdout, local.stdout[-2000:] + local.stderr[-2000:]
        assert fleet.returncode == 0 and "1 passed" in fleet.stdout, (start, fleet.stdout[-3000:] + fleet.stderr[-2000:])
