"""A project whose ini file runs pytest-xdist (``addopts = -n 2``, as many do) gives, with
``--dt-coordinator``, the outcomes of its local run with every test run on the fleet: the fleet
takes xdist's place here (no local xdist workers), and the workers' sessions, which read the same
ini file, run their chunks without starting xdist workers of their own.

Its ``--dist loadscope`` (xdist's remedy for a suite whose tests in a class depend on each other, as
pathspec 1.1.1's do) still holds: no chunk cuts a class, whose tests then run in one worker's
session, in order (before, a chunk boundary inside the class failed the tests past it).

The submitter's environment is a virtual environment with pytest-xdist installed (it travels with
the run); the workers run from this interpreter, in bwrap.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from pathlib import Path

import pytest

from distributed_testing.testing import bundle_cluster
from distributed_testing.testing.suites import PLUGIN, submitter_env
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(600), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

TESTS = '''\
import os

import pytest


@pytest.mark.parametrize("n", range(6))
def test_where(n):
    assert n < 5, os.environ.get("PYTEST_XDIST_WORKER", "no xdist worker")


def test_skip():
    pytest.skip("not here")
'''


def _pytest(python: Path, tree: Path, args: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    done = subprocess.run([str(python), "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", "-rA", *args],
                          cwd=tree, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=300,
                          check=False)
    return done.returncode, done.stdout + done.stderr


def _outcomes(out: str) -> list[str]:
    return sorted(re.findall(r"^(PASSED|FAILED|SKIPPED|ERROR) (\S+)", out, re.M))  # type: ignore[arg-type]


async def _through_two_workers(tmp_path: Path, python: Path, tree: Path) -> tuple[int, str]:
    """``pytest -v`` in ``tree`` through two one-slot bundle workers: its exit code and output."""
    async with bundle_cluster(tmp_path, workers=2) as (c, key):
        return await asyncio.to_thread(_pytest, python, tree, ["-v", "--dt-coordinator", c.base_url],
                                       {"DT_API_KEY": key})


async def test_the_fleet_takes_xdists_place_when_the_ini_file_asks_for_it(tmp_path: Path) -> None:
    tree = tmp_path / "proj"
    (tree / "tests").mkdir(parents=True)
    (tree / "tests" / "test_a.py").write_text(TESTS)
    (tree / "pytest.ini").write_text("[pytest]\ntestpaths = tests\naddopts = -n 2\n")
    python = await asyncio.to_thread(submitter_env, tmp_path / "venv", ["pytest-xdist"])
    code, local = await asyncio.to_thread(_pytest, python, tree, [])
    assert "created: 2/2 workers" in local and code == 1, local[-3000:]
    rcode, remote = await _through_two_workers(tmp_path, python, tree)
    assert rcode == code and _outcomes(remote) == _outcomes(local), remote[-4000:]
    assert "created:" not in remote, remote[-3000:]  # no xdist workers here
    assert re.search(r"\[w[12]\] .*PASSED", remote), remote[-3000:]  # the fleet's workers ran them
    assert "no xdist worker" in remote, remote[-3000:]  # nor there: the failing test says where it ran


ORDERED = '''\
import pytest

SETUPS = []


@pytest.fixture(scope="class")
def shared():
    SETUPS.append(1)
    return len(SETUPS)


class TestOrdered:
    def test_0_first(self, shared):
        type(self).ready = True

    @pytest.mark.parametrize("n", range(24))
    def test_1_later(self, shared, n):
        assert getattr(type(self), "ready", False), "test_0_first ran elsewhere"
        assert shared == 1, "the class fixture was set up again: the class was cut"


@pytest.mark.parametrize("n", range(8))
def test_alone(n):
    pass
'''


async def test_xdists_dist_loadscope_keeps_a_class_in_one_chunk_on_the_fleet(tmp_path: Path) -> None:
    tree = tmp_path / "proj"
    (tree / "tests").mkdir(parents=True)
    (tree / "tests" / "test_ordered.py").write_text(ORDERED)
    (tree / "pytest.ini").write_text("[pytest]\ntestpaths = tests\naddopts = -n 2 --dist loadscope\n")
    python = await asyncio.to_thread(submitter_env, tmp_path / "venv", ["pytest-xdist"])
    code, local = await asyncio.to_thread(_pytest, python, tree, [])
    assert code == 0 and "33 passed" in local, local[-3000:]
    rcode, remote = await _through_two_workers(tmp_path, python, tree)
    assert rcode == code and _outcomes(remote) == _outcomes(local), remote[-4000:]
    assert re.search(r"\[w[12]\] .*PASSED", remote), remote[-3000:]  # the fleet's workers ran them
