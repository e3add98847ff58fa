"""The pytest plugin spreads one suite of 40 tests over three real workers with different tags:
every test runs once, on a worker that meets its ``dt`` marker, and failures, skips, xfails,
``-k``, ``-x``, ``--junitxml`` and the exit code read as plain pytest's."""

from __future__ import annotations

import asyncio
import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from distributed_testing.testing import run_cluster
from distributed_testing.testing.suites import plugin_args, short_summary
from distributed_testing.worker.sandbox import available as sandbox_unavailable

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]

CONFTEST = '''
import os, pytest

@pytest.fixture(autouse=True)
def _log_run(request):
    with open(os.path.join(os.path.dirname(__file__), "ran.log"), "a") as f:
        f.write(request.node.nodeid + "\\n")
'''


def _suite(root: Path) -> None:
    (root / "conftest.py").write_text(CONFTEST)
    anywhere = [f"def test_any_{i}():\n    assert {i} == {i}\n" for i in range(8)]
    anywhere.append("def test_any_fails():\n    value = 41\n    assert value == 42, 'off by one'\n")
    anywhere.append("import pytest\n\n@pytest.mark.skip(reason='not today')\ndef test_any_skipped():\n    pass\n")
    (root / "test_any.py").write_text("\n\n".join(anywhere))
    for tag in ("alpha", "beta"):
        body = [f"import pytest\n\npytestmark = pytest.mark.dt(tags=['{tag}'])\n"]
        body += [f"def test_{tag}_{i}():\n    pass\n" for i in range(10)]
        (root / f"test_{tag}.py").write_text("\n\n".join(body))
    mixed = ["import pytest\n"]
    mixed += [f"@pytest.mark.dt(tags=['gamma'])\ndef test_gamma_{i}():\n    pass\n" for i in range(5)]
    mixed += [f"def test_free_{i}():\n    pass\n" for i in range(4)]
    mixed.append("@pytest.mark.xfail(reason='known bug')\ndef test_free_xfail():\n    assert False\n")
    (root / "test_mixed.py").write_text("\n\n".join(mixed))


async def _pytest(root: Path, url: str, key: str, *args: str, shared_tree: bool = True) -> tuple[int, str]:
    """The plugin over ``root``; a shipped tree without the environment of this interpreter (its
    torch and the rest: tests/integration/cluster/test_pytest_plugin_env.py ships one)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "--rootdir", str(root),
        "--dt-coordinator", url, *(["--dt-shared-tree"] if shared_tree else ["--dt-no-env"]), *args, str(root), cwd=root, env={**os.environ, "DT_API_KEY": key},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


@pytest.mark.slow
async def test_a_suite_of_40_tests_runs_once_each_on_workers_that_meet_their_markers(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    _suite(suite)
    async with run_cluster(tmp_path, workers=0) as c:
        for wid, tag in (("wa", "alpha"), ("wb", "beta"), ("wg", "gamma")):
            # the suite's conftest logs each run into the suite, a write the confinement refuses
            await c.add_worker(worker_id=wid, tags=(tag,), test_root=suite, sandbox="none")
        key = await c.create_key("submitter")
        junit = tmp_path / "report.xml"
        code, out = await _pytest(suite, c.base_url, key, "-rs", "--junitxml", str(junit))
        print(out)
        assert code == 1, out
        assert "1 failed, 37 passed, 1 skipped, 1 xfailed" in out, out
        assert "assert value == 42" in out and "AssertionError: off by one" in out  # the remote traceback
        assert "SKIPPED [1] test_any.py:" in out and "not today" in out

        ran = (suite / "ran.log").read_text().split()
        assert len(ran) == 39 and len(set(ran)) == 39  # the skipped test never enters its fixtures

        cases = ET.parse(junit).getroot().iter("testcase")
        worker = {f"{tc.get('classname')}.{tc.get('name')}":
                  {p.get("name"): p.get("value") for p in tc.iter("property")}["dt_worker"] for tc in cases}
        assert len(worker) == 40
        for name, wid in worker.items():
            for tag, want in (("alpha", "wa"), ("beta", "wb"), ("gamma", "wg")):
                if f".test_{tag}_" in name:
                    assert wid == want, (name, wid)
        assert {worker[n] for n in worker if ".test_any_" in n or ".test_free_" in n} <= {"wa", "wb", "wg"}

        code, out = await _pytest(suite, c.base_url, key, "-x", "-k", "any")
        assert code == 1 and "stopping after 1 failures" in out, out
        assert "1 failed" in out and "passed" in out and "not today" not in out.split("short test summary")[0]


def _inherited_suite(root: Path) -> None:
    """networkx's shape: test classes that inherit their tests from a class in another module."""
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "sub" / "__init__.py").write_text("")
    (root / "pkg" / "test_base.py").write_text(
        "class BaseTester:\n"
        "    value = 1\n\n"
        "    def test_value(self):\n        assert self.value > 0\n\n"
        "    def test_fails_for_three(self):\n        assert self.value != 3, 'three is out'\n\n\n"
        "class TestBase(BaseTester):\n    pass\n")
    (root / "pkg" / "sub" / "test_derived.py").write_text(
        "import pytest\n\nfrom ..test_base import BaseTester\n\n\n"
        "class TestTwo(BaseTester):\n    value = 2\n\n\n"
        "class TestThree(BaseTester):\n    value = 3\n\n"
        "    @pytest.mark.parametrize('n', [1, 2])\n"
        "    def test_own(self, n):\n        assert n\n")


@pytest.mark.slow
async def test_tests_inherited_from_another_module_are_reported_as_they_ran(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    _inherited_suite(suite)
    async with run_cluster(tmp_path, workers=0) as c:
        await c.add_worker(worker_id="w1", test_root=suite)
        key = await c.create_key("submitter")
        junit = tmp_path / "report.xml"
        code, out = await _pytest(suite, c.base_url, key, "-rA", "--junitxml", str(junit))
        assert code == 1, out
        assert "1 failed, 7 passed" in out and "error" not in out, out
        assert "FAILED pkg/sub/test_derived.py::TestThree::test_fails_for_three" in out
        assert "PASSED pkg/sub/test_derived.py::TestTwo::test_value" in out
        cases = {f"{tc.get('classname')}.{tc.get('name')}" for tc in ET.parse(junit).getroot().iter("testcase")}
        assert "pkg.sub.test_derived.TestTwo.test_fails_for_three" in cases and len(cases) == 8


@pytest.mark.slow
@pytest.mark.skipif(sandbox_unavailable() is not None, reason=f"no sandbox here: {sandbox_unavailable()}")
async def test_by_default_the_local_tree_is_shipped_so_a_local_edit_is_what_runs(tmp_path: Path) -> None:
    """The issue's trap: the worker's own --test-root holds an old copy; the plugin ships what is
    on disk here, edit by edit, and a key without --allow-code is told what it lacks."""
    suite, stale = tmp_path / "suite", tmp_path / "worker-root"
    for d, value in ((suite, 1), (stale, 2)):
        d.mkdir()
        (d / "test_edit.py").write_text(f"VALUE = {value}\n\n\ndef test_value():\n    assert VALUE == 2\n")
    async with run_cluster(tmp_path, workers=0) as c:
        await c.add_worker(worker_id="w1", test_root=stale, accept_bundles=True, sandbox="bwrap")
        plain = await c.create_key("submitter")
        code, out = await _pytest(suite, c.base_url, plain, shared_tree=False)
        assert code == 4 and "--allow-code" in out and "--dt-shared-tree" in out, out
        key = await c.create_key("submitter", allow_code=True)
        code, out = await _pytest(suite, c.base_url, key, shared_tree=False)
        assert code == 1 and "assert 1 == 2" in out and "distributed_testing: bundle " in out, out
        (suite / "test_edit.py").write_text("VALUE = 2\n\n\ndef test_value():\n    assert VALUE == 2\n")
        code, out = await _pytest(suite, c.base_url, key, shared_tree=False)
        assert code == 0 and "1 passed" in out and "uploaded 1 blobs" in out, out
        # the tests' tasks (the others started the workers' sessions while the plugin collected)
        tasks = [t for t in (await c.request("GET", "/api/v1/tasks"))[1]["tasks"] if t["task_id"].startswith("pytest-")]
        bundles = {(await c.request("GET", f"/api/v1/tasks/{t['task_id']}"))[1]["spec"].get("bundle") for t in tasks}
        assert len(tasks) == 2 and len(bundles) == 2 and None not in bundles, bundles  # one digest per tree


FIDELITY = '''
import logging, sys, warnings

import pytest


def test_prints_and_fails():
    print("to stdout")
    print("to stderr", file=sys.stderr)
    logging.getLogger("suite").warning("to the log")
    assert 6 * 7 == 43, "the answer is off"


def test_warns():
    warnings.warn("mind the gap", DeprecationWarning)


def test_subtests(subtests):
    for i in range(3):
        with subtests.test(msg="each", i=i):
            assert i != 1


@pytest.mark.xfail(reason="known bug")
def test_xfails():
    assert False
'''


@pytest.mark.slow
async def test_the_report_reads_as_local_pytests(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_fidelity.py").write_text(FIDELITY)
    local = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:distributed_testing", "-rA",
        "--rootdir", str(suite), str(suite), cwd=suite, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    want = (await local.communicate())[0].decode()
    async with run_cluster(tmp_path, workers=0) as c:
        await c.add_worker(worker_id="w1", test_root=suite)
        key = await c.create_key("submitter")
        code, out = await _pytest(suite, c.base_url, key, "-rA")
    assert code == 1, out
    assert short_summary(out) == short_summary(want), (out, want)
    assert "FAILED test_fidelity.py::test_prints_and_fails - AssertionError: the answer i" in out
    for section in ("Captured stdout call", "to stdout", "Captured stderr call", "to stderr",
                    "Captured log call", "to the log", "warnings summary", "DeprecationWarning: mind the gap",
                    "test_subtests [each] (i="):  # pytest serializes a subtest's kwargs as text: (i='1')
        assert section in out, (section, out)


async def test_a_shipped_run_counts_only_the_slots_of_workers_that_accept_bundles(tmp_path: Path) -> None:
    """The plugin sizes its chunks by the slots that can run them: a bundle's tasks go only to
    ``--accept-bundles`` workers, so the others' slots do not count when it ships the tree."""
    from distributed_testing.client import ApiClient
    from distributed_testing.pytest_plugin import Fleet

    async with run_cluster(tmp_path, workers=0) as c:
        await c.add_worker(worker_id="w0", max_concurrent_tasks=3)
        await c.add_worker(worker_id="w1", max_concurrent_tasks=2, accept_bundles=True, sandbox="none")
        fleet = Fleet(ApiClient(c.base_url, c.admin_key))
        shared, shipped = await asyncio.to_thread(fleet.slots), await asyncio.to_thread(fleet.slots, bundle=True)
        status, body = await c.request("GET", "/api/v1/workers")
    assert (shared, shipped) == (5, 2)
    assert status == 200 and {w["worker_id"]: w["accept_bundles"] for w in body["workers"]} == {"w0": False, "w1": True}
