"""``--dt-env`` through the plugin: the variables it names reach the tests on the workers (``NAME=VALUE``,
or ``NAME`` for its value where pytest runs), and nothing else of the submitter's shell does (a
variable exported here and not named is absent there, as the worker's own are) but ``CI`` and
``BUILD_NUMBER``, which pytest reads to show whole assertion diffs on CI, and ``PYTHONHASHSEED``:
a suite that parametrizes over a set of strings (isodate's ``TEST_CASES``) has its ids in the
order the hash seed gives the set; before the seed travelled, the workers collected other ids than
the local run (each test not found there: 6 errors of 9 tests here)."""

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

TESTS = '''\
import os

import pytest

# in the order of the hash seed; the frozensets get ids by their place in it ("echo-letters3")
WORDS = {(w, frozenset(w)) for w in ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot")}


def test_named():
    assert os.environ["APP_STAGE"] == "staging" and os.environ["APP_REGION"] == "eu west"


def test_unnamed_stays_here():
    assert "APP_SECRET" not in os.environ


def test_what_pytest_reads_to_tell_ci_travels():
    assert os.environ.get("CI") == "true" and "BUILD_NUMBER" not in os.environ


@pytest.mark.parametrize(("word", "letters"), WORDS)
def test_a_set_in_the_hash_seeds_order(word, letters):
    assert os.environ["PYTHONHASHSEED"] == "1234" and set(word) == letters
'''


async def test_named_variables_reach_the_workers_tests_and_no_others(tmp_path: Path) -> None:
    tree = tmp_path / "proj"
    tree.mkdir()
    (tree / "test_env.py").write_text(TESTS)
    python = await asyncio.to_thread(submitter_env, tmp_path / "venv", [])
    async with bundle_cluster(tmp_path, workers=2) as (c, key):
        env = {**os.environ, "DT_API_KEY": key, "APP_REGION": "eu west", "APP_SECRET": "s3cret", "CI": "true",
               "PYTHONHASHSEED": "1234"}
        env.pop("BUILD_NUMBER", None)

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([str(python), "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", "-rA",
                                   "--dt-coordinator", c.base_url, *args], cwd=tree, env=env, capture_output=True,
                                  text=True, timeout=300, check=False)

        done = await asyncio.to_thread(run, "--dt-env", "APP_STAGE=staging", "--dt-env", "APP_REGION")
        refused = await asyncio.to_thread(run, "--dt-env", "PATH=/tmp", "--dt-env", "APP_STAGE=x")
        unset = await asyncio.to_thread(run, "--dt-env", "APP_NOT_SET_ANYWHERE")
    assert done.returncode == 0 and "9 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    assert refused.returncode == 4 and "--dt-env PATH: set by the worker" in refused.stderr, refused.stderr[-2000:]
    assert unset.returncode == 4 and "APP_NOT_SET_ANYWHERE: not set here" in unset.stderr, unset.stderr[-2000:]
