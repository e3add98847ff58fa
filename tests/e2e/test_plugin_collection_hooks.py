"""A plugin's or conftest's ``pytest_collection`` runs in a worker's session as in plain pytest.
The session's own implementation (the first command says what it collects) returned a result, which
ends that firstresult hook before the others: pytest-cases installs its fixture closure there, so
the workers collected other parametrizations than the submitter's pytest, and 868 of its 1,494 tests
were errors ("not found: PATH::ID") through the plugin."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import pytest

from distributed_testing.testing import bundle_cluster
from distributed_testing.testing.suites import plugin_pytest, submitter_env
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(600), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

# the ids of test_it follow what pytest_collection did, as pytest-cases' do
CONFTEST = '''\
SEEN = []


def pytest_collection(session):
    SEEN.append(session)


def pytest_generate_tests(metafunc):
    if "which" in metafunc.fixturenames:
        metafunc.parametrize("which", ["hooked" if SEEN else "unhooked"])
'''
TESTS = "def test_it(which):\n    assert which == 'hooked'\n\n\ndef test_plain():\n    pass\n"


async def test_a_conftests_pytest_collection_runs_in_the_workers_session(tmp_path: Path) -> None:
    tree = tmp_path / "proj"
    tree.mkdir()
    (tree / "conftest.py").write_text(CONFTEST)
    (tree / "test_hooked.py").write_text(TESTS)
    python = await asyncio.to_thread(submitter_env, tmp_path / "venv", [])

    run = functools.partial(plugin_pytest, python, tree)

    local = await asyncio.to_thread(run)
    assert "2 passed" in local.stdout, local.stdout[-3000:]
    async with bundle_cluster(tmp_path) as (c, key):
        remote = await asyncio.to_thread(run, "--dt-coordinator", c.base_url, env={"DT_API_KEY": key})
    said = local.stdout[-3000:] + "\n----- through the plugin -----\n" + remote.stdout[-3000:] + remote.stderr[-2000:]
    assert remote.returncode == local.returncode == 0, said
    assert "PASSED test_hooked.py::test_it[hooked]" in remote.stdout, said
