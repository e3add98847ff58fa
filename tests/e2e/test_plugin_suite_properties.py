"""The ``<testsuite>`` properties of ``--junitxml`` through the plugin: what the tests record with
pytest's ``record_testsuite_property`` and what plugins add to the report's global properties
(hypothesis: a ``hypothesis-statistics-NODEID`` property per property-based test) are in the
submitter's XML, as in a local run's. Found with natsort and cattrs, whose local reports carry their
hypothesis statistics: the workers' pytest recorded them into its own report (``--junitxml`` there
is ``/dev/null``), so the fleet's XML had none (pytest-xdist loses them too: pytest issue 7767).
A session fixture's property, recorded once per worker session there, is in the report once."""

from __future__ import annotations

import asyncio
import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from distributed_testing.testing import bundle_cluster
from distributed_testing.testing.suites import PLUGIN, submitter_env
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(600), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

CONFTEST = '''\
import pytest
from _pytest.junitxml import xml_key


@pytest.fixture(scope="session", autouse=True)
def _arch(record_testsuite_property):
    record_testsuite_property("ARCH", "PPC")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    yield
    if call.when == "teardown":  # as hypothesis's plugin adds its statistics
        xml = item.config.stash.get(xml_key, None)
        if xml is not None:
            xml.add_global_property("stats-" + item.nodeid, "ran " + item.name)
'''

TESTS = '''\
import pytest


@pytest.mark.parametrize("n", range(6))
def test_storage(record_testsuite_property, n):
    record_testsuite_property(f"STORAGE_{n}", f"CEPH <{n}>")


class TestPlain:
    def test_a(self):
        pass

    def test_b(self):
        pass
'''


def suite_properties(junit: Path) -> list[tuple[str | None, str | None]]:
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    props = suite.find("properties")
    return [] if props is None else sorted((p.get("name"), p.get("value")) for p in props.iter("property"))


async def test_the_testsuite_properties_the_workers_record_are_in_the_submitters_junit(tmp_path: Path) -> None:
    tree = tmp_path / "proj"
    tree.mkdir()
    (tree / "conftest.py").write_text(CONFTEST)
    (tree / "test_props.py").write_text(TESTS)
    python = await asyncio.to_thread(submitter_env, tmp_path / "venv", [])
    async with bundle_cluster(tmp_path, workers=2) as (c, key):
        env = {**os.environ, "DT_API_KEY": key}

        def run(junit: Path, *args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([str(python), "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider",
                                   f"--junitxml={junit}", *args], cwd=tree, env=env, capture_output=True,
                                  text=True, timeout=300, check=False)

        here = await asyncio.to_thread(run, tmp_path / "local.xml")
        there = await asyncio.to_thread(run, tmp_path / "fleet.xml", "--dt-coordinator", c.base_url)
    assert here.returncode == 0 and "8 passed" in here.stdout, here.stdout[-3000:] + here.stderr[-2000:]
    assert there.returncode == 0 and "8 passed" in there.stdout, there.stdout[-3000:] + there.stderr[-2000:]
    local = suite_properties(tmp_path / "local.xml")
    assert len(local) == 1 + 6 + 8 and ("ARCH", "PPC") in local and ("STORAGE_3", "CEPH <3>") in local, local
    assert suite_properties(tmp_path / "fleet.xml") == local
