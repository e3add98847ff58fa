"""The local pytest invocation travels with a shipped run, and its report reads as local, over a
real coordinator and a bundle worker in its sandbox: a suite that needs ``-p no:asyncio``,
``-o xfail_strict=true``, ``-W error::DeprecationWarning``, ``-k``, ``-m`` (from
``PYTEST_ADDOPTS``), its ini's markers and its invocation directory gives local pytest's per-test
outcomes, with local paths and each ``-v`` line naming the worker; a task that fails as a whole
(its conftest cannot import there) is printed once, and a module skipped there for a missing
import is a skip with that reason. A test whose id the workers do not collect (an id made of the
collecting process's pid; isodate's from a set's order) is an error whose one line says pytest's
``not found``: it said only ``pytest usage error in its session:`` before."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import pytest

from distributed_testing.testing import run_cluster
from distributed_testing.testing.suites import plugin_args, short_summary
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

OPTIONS = '''import os, warnings
from pathlib import Path

import pytest


def test_runs_without_the_disabled_plugin(request):
    assert not request.config.pluginmanager.has_plugin("asyncio")


@pytest.mark.xfail(reason="was a bug")
def test_passes_where_xfail_is_strict():
    pass


def test_deprecation_is_an_error():
    warnings.warn("old api", DeprecationWarning)


def test_deselected_by_k():
    assert False


@pytest.mark.gpu
def test_deselected_by_m():
    assert False


@pytest.mark.slow
def test_marker_from_the_ini():
    pass


def test_runs_in_the_invocation_directory():
    assert Path("data.txt").read_text() == "beside the tests"


def test_skips_here():
    pytest.skip("not today")


def test_fails():
    value = 41
    assert value == 42


def test_warns():
    warnings.warn("heads up", UserWarning)
'''
INI = "[pytest]\nmarkers =\n    slow: slow\n    gpu: needs one\n"
ARGS = ("-p", "no:asyncio", "-o", "xfail_strict=true", "-W", "error::DeprecationWarning", "-k", "not deselected_by_k",
        "--strict-markers", "-v", "-rA")


def _suite(root: Path) -> Path:
    tests = root / "tests"
    for d in ("broken", "opt"):
        (tests / d).mkdir(parents=True)
        (tests / d / "localdep.py").write_text("VALUE = 1\n")  # here, but not shipped (.dtignore)
    (root / "pytest.ini").write_text(INI)
    (root / ".dtignore").write_text("localdep.py\n")
    (tests / "data.txt").write_text("beside the tests")
    (tests / "test_options.py").write_text(OPTIONS)
    (tests / "broken" / "conftest.py").write_text("import localdep\n")
    (tests / "broken" / "test_b.py").write_text("".join(f"def test_{i}():\n    pass\n\n\n" for i in range(3)))
    (tests / "ids").mkdir()
    (tests / "ids" / "test_pid.py").write_text(
        "import os\n\nimport pytest\n\n\n@pytest.mark.parametrize('n', [1], ids=[f'pid{os.getpid()}'])\n"
        "def test_pid(n):\n    pass\n")
    (tests / "opt" / "test_optional.py").write_text(
        "import pytest\n\nlocaldep = pytest.importorskip('localdep')\npytestmark = pytest.mark.dt(tags=['opt'])\n\n\n"
        "def test_one():\n    pass\n\n\ndef test_two():\n    pass\n")
    return tests


async def _pytest(cwd: Path, *args: str, env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, cwd=cwd, env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


async def test_a_shipped_run_takes_the_local_options_and_reports_as_local(tmp_path: Path) -> None:
    tests = _suite(tmp_path / "suite")
    env = {"PYTEST_ADDOPTS": "-m 'not gpu'"}
    plugin = plugin_args()
    code, want = await _pytest(tests, "-p", "no:distributed_testing", *ARGS, "test_options.py", env=env)
    assert code == 1 and "4 passed" in want, want  # what local pytest says, to compare with
    async with run_cluster(tmp_path / "c", workers=0) as c:
        await c.add_worker(worker_id="wv", accept_bundles=True, sandbox="bwrap", task_network="none",
                           max_concurrent_tasks=1, tags=("opt",))
        key = await c.create_key("submitter", allow_code=True)
        env = {**env, "DT_API_KEY": key}
        code, out = await _pytest(tests, *plugin, "--dt-coordinator", c.base_url, "--dt-no-env", *ARGS, "test_options.py", env=env)
        assert code == 1, out
        assert short_summary(out) == short_summary(want), (out, want)
        assert re.search(r"^\[wv\] \[ *\d+%\] PASSED test_options.py::test_marker_from_the_ini", out, re.M), out
        for local in ("SKIPPED [1] test_options.py:39: not today", "\ntest_options.py:44: AssertionError",
                      f"{tests}/test_options.py:48: UserWarning: heads up"):
            assert local in out and local in want, (local, out)
        assert "/trees/" not in out, out  # no path of the worker's

        code, out = await _pytest(tests, *plugin, "--dt-coordinator", c.base_url, "--dt-no-env", "-rA", "broken", "opt", env=env)
        pid_code, pid_out = await _pytest(tests, *plugin, "--dt-coordinator", c.base_url, "--dt-no-env", "ids", env=env)
    assert code == 1 and "3 errors" in out and "2 skipped" in out, out
    conftest = f"ImportError while loading conftest '{tests}/broken/conftest.py'"  # the cause, with the local path
    assert out.count(conftest) == 1 and out.count("distributed_testing: failed as a whole") == 1, out
    assert "tests it took down: tests/broken/test_b.py::test_0, tests/broken/test_b.py::test_1, " in out, out
    said = "[dt worker wv] pytest usage error in its session: ModuleNotFoundError: No module named 'localdep'"
    assert out.count(f"\n{said} (not run: task pytest-") == 3, out  # each test's one line
    assert "SKIPPED [2] opt/test_optional.py:3: could not import 'localdep'" in out, out
    said = f"[dt worker wv] pytest usage error in its session: not found: {tests}/ids/test_pid.py::test_pid"
    assert pid_code == 1 and "1 error" in pid_out and f"\n{said} (not run: task pytest-" in pid_out, pid_out
    assert "/trees/" not in out, out
