"""A user's usual pytest options, and popular plugins installed beside pytest, act through
``--dt-coordinator`` as in a plain local run: a synthetic project (passing, failing, erroring in
setup and in ``setup_class``, skipped, xfail and xpass strict and not, parametrized with unicode
and ids holding ``::`` and ``[``, printing, warning, a doctest, a flaky test, a sleeping one) runs
through one bundle worker and, on a copy of the tree, in plain pytest, with the same options; each
pair must agree on the exit code, the short summary (``-rA``, sorted: a fleet reports tests as they
end), the final line, and what each option leaves behind; a run that stops early (``-x``,
``--maxfail``, ``--sw``) by its exit code and the failures where it stopped (a test of another
chunk may have passed meanwhile, as with xdist). What this found and proves fixed:

* ``-x`` / ``--maxfail`` ended the run without pytest's ``Failed`` (the last progress column was
  printed), and ``--sw``'s stop without its ``Interrupted``: exit code 1 and no ``Interrupted:``
  line instead of 2;
* ``-s``: each test's output was kept in "Captured stdout" sections (the workers capture all the
  same) instead of being written as the test is reported;
* a doctest's failure had the start of its text as the short summary's message (pytest sends a
  representation without a crash line as text), where local pytest prints none;
* pytest-randomly's seed: the workers drew their own, not the one the header printed;
* pytest-json-report: the tests' stdout and stderr (made where they run) were missing from the
  local report, and every passing stage had the worker's line as its ``longrepr``;
* live logging (``--log-cli-level``, ``log_cli``) printed no ``live log`` section;
* ``--setup-plan`` (which sets nothing up) was shipped and printed nothing; ``--setup-show`` and
  ``--setup-only``, whose lines pytest prints from the process that sets the fixtures up, are
  now refused before anything is sent;
* ``record_property`` under ``--junitxml`` warned here only (junitxml was not active where the
  test ran: the warning, and under ``-W error`` the failure, were missing);
* a unittest ``subTest``'s captured output (pytest's subtests write their progress letters into
  it, by verbosity: the workers ran at ``-q`` where the local run had none);
* a subtest's parameters: ``SUBFAILED(i='2')`` for a local ``(i=2)`` (pytest's ``SubtestContext``
  makes them reprs again when a report is read back from JSON);
* a collection error's ``Interrupted: 1 error(s) during collection`` (pytest: ``1 error``);
* under load, ``-x`` stopped at a test reported "not run" instead of at its failure: a session's
  task stopped by ``--maxfail`` left it stopped for its next task (pytest 8+ ignores unsetting
  ``Session.shouldfail``), which ran one test and ended
  (``test_exec_pytest_session.py::test_a_task_stopped_by_maxfail_...``).

Equal without a change: the final line's counts, ``--lf`` and ``--ff`` after a plugin run (the
cache's ``lastfailed``), ``--durations``, ``--tb`` styles, ``-q``/``-vv`` (``-v`` names the worker
on each line, as xdist), ``--junitxml``'s outcomes, ``-k``/``-m``/``--deselect``, ``--runxfail``,
``--strict-markers``, ``-W error::UserWarning``, ``-p no:cacheprovider``, ``--import-mode
importlib``, a conftest option, pytest-rerunfailures, pytest-repeat and pytest-timeout.

The submitter's environment is a virtual environment with the plugins installed
(:func:`distributed_testing.testing.suites.submitter_env`); it travels with the run.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from distributed_testing.testing import bundle_cluster
from distributed_testing.testing.suites import PLUGIN, outcomes, short_summary, submitter_env
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(400), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

PLUGINS = ["pytest-rerunfailures", "pytest-repeat", "pytest-randomly", "pytest-timeout", "pytest-json-report"]
FILES = {
    "pyproject.toml": '[tool.pytest.ini_options]\nmarkers = ["slow: slow", "fast: quick", "sleepy: sleeps"]\n',
    "conftest.py": '''import pytest


def pytest_addoption(parser):
    parser.addoption("--run-sleepy", action="store_true")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "sleepy" in item.keywords and not config.getoption("--run-sleepy"):
            item.add_marker(pytest.mark.skip(reason="needs --run-sleepy"))
''',
    "pkg/__init__.py": "",
    "pkg/calc.py": '''def add(a, b):
    """
    >>> add("é", "x")
    'éx'
    """
    return a + b


def broken():
    """
    >>> broken()
    2
    """
    return 1
''',
    "tests/__init__.py": "",
    "tests/test_outcomes.py": '''import logging
import random
import sys
import time
import unittest
import warnings

import pytest

CALLS = []


@pytest.fixture
def broken_fixture():
    raise RuntimeError("setup blew up")


def test_pass():
    pass


@pytest.mark.slow
def test_fail():
    assert [1, 2, 3] == [1, 2, 4]


def test_setup_error(broken_fixture):
    pass


@pytest.mark.fast
def test_skip():
    pytest.skip("not today")


@pytest.mark.xfail(reason="known bug")
def test_xfail():
    assert 0


@pytest.mark.xfail(reason="fixed meanwhile")
def test_xpass():
    pass


@pytest.mark.xfail(reason="strict one", strict=True)
def test_xpass_strict():
    pass


@pytest.mark.xfail(reason="strict and failing", strict=True)
def test_xfail_strict():
    raise ValueError("still broken")


def test_prints():
    print("hello from stdout ünïcode")
    print("and from stderr", file=sys.stderr)


def test_warns():
    warnings.warn("careful now", UserWarning)


def test_flaky():
    CALLS.append(1)
    assert len(CALLS) > 1, "fails the first time in a process"


def test_random_value():
    print(f"random value {random.random()!r}")


def test_logs():
    logging.getLogger("proj").info("logged info")


class TestCases(unittest.TestCase):
    def test_subtests(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertLess(i, 2)


def test_records(record_property):
    record_property("kind", "fidelity")  # under --junitxml (xunit2): pytest's PytestWarning, there as here


@pytest.mark.sleepy
def test_sleeps():
    time.sleep(5)
''',
    "tests/test_params.py": '''import pytest


@pytest.mark.parametrize("value", ["é", "日本", "a::b", "c[d", "e]f", "x y"])
def test_unicode(value):
    assert value != "c[d"


@pytest.mark.parametrize("n", [1, 2, 3], ids=["one::1", "two[2]", "three"])
def test_odd_ids(n):
    assert n < 3


class TestWithSetup:
    @classmethod
    def setup_class(cls):
        cls.value = 41

    def test_value(self):
        assert self.value == 41


class TestBrokenSetup:
    @classmethod
    def setup_class(cls):
        raise OSError("no class today")

    def test_one(self):
        pass

    def test_two(self):
        pass
''',
}
NO_RANDOMLY = ("-p", "no:randomly")


def _project(root: Path) -> Path:
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _pytest(python: Path, tree: Path, args: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    done = subprocess.run([str(python), "-m", "pytest", "-p", PLUGIN, *args], cwd=tree, capture_output=True,
                          text=True, timeout=180, env={**os.environ, **(env or {})}, check=False)
    out = (done.stdout + done.stderr).replace(str(tree), "ROOT")
    out = re.sub(r" in \d+\.\d+s( \(\d+:\d+:\d+\))?$", "", out, flags=re.M)  # the final line's time (also under -q)
    return done.returncode, re.sub(r"0x[0-9a-f]+", "0x", out)


def _lastfailed(tree: Path) -> object:
    path = tree / ".pytest_cache" / "v" / "cache" / "lastfailed"
    return json.loads(path.read_text()) if path.exists() else None


def _json_tests(path: Path) -> dict[str, dict[str, object]]:
    """pytest-json-report's tests, by node id: outcome and each stage's outcome, streams and
    whether it has a longrepr (its text holds the tree's path)."""
    out = {}
    for t in json.loads(path.read_text())["tests"]:
        stages = {w: {"longrepr": bool(t[w].get("longrepr")), **{k: v for k, v in t[w].items()
                                                                if k in ("outcome", "stdout", "stderr")}}
                  for w in ("setup", "call", "teardown") if w in t}
        out[t["nodeid"]] = {"outcome": t["outcome"], **stages}
    return out


def _summary(out: str) -> tuple[list[str], str]:
    """The short summary and final line (:func:`short_summary`); a run without one (nothing ran:
    ``--setup-plan``) by its final line alone."""
    if "short test summary info" in out:
        return short_summary(out)
    return [], out.strip().splitlines()[-1].strip("= ").rsplit(" in ", 1)[0]


def _stopped(out: str) -> list[str]:
    """The final line's counts of failures and errors (where a run stopped: ``-x``, ``--sw``)."""
    return re.findall(r"(\d+ (?:failed|errors?))", _summary(out)[1])


def _same(what: str, local: tuple[int, str], remote: tuple[int, str], differ: list[str], *, stops: bool) -> None:
    """Exit codes and short summaries alike; for a run that ``stops`` at a failure only the
    failures and errors of its final line (the fleet reports tests as they end, as xdist does: one
    that passed in another chunk meanwhile is reported too)."""
    (code, want), (got_code, got) = local, remote
    if code != got_code or (_stopped(want) != _stopped(got) if stops else _summary(want) != _summary(got)):
        lines = difflib.unified_diff([*_summary(want)[0], _summary(want)[1]], [*_summary(got)[0], _summary(got)[1]],
                                     "local", "plugin", lineterm="")
        differ.append(f"{what}: exit {code} here, {got_code} there\n" + "\n".join(lines) + f"\n--- plugin:\n{got[-2000:]}")


async def test_usual_options_and_plugins_act_through_the_plugin_as_in_a_local_run(tmp_path: Path) -> None:
    python = await asyncio.to_thread(submitter_env, tmp_path / "venv", PLUGINS)
    mine, here = _project(tmp_path / "mine"), tmp_path / "here"
    shutil.copytree(mine, here)
    differ: list[str] = []
    async with bundle_cluster(tmp_path) as (c, key):
        fleet = ["--dt-coordinator", c.base_url]

        async def both(what: str, *args: str, local: tuple[str, ...] = (),
                       stops: bool = False) -> tuple[tuple[int, str], tuple[int, str]]:
            remote = await asyncio.to_thread(_pytest, python, mine, [*args, *fleet], {"DT_API_KEY": key})
            if "--randomly-seed" in local:  # the seed the plugin run's header printed
                seed = re.search(r"Using --randomly-seed=(\d+)", remote[1])
                assert seed is not None, remote[1]
                local = (f"--randomly-seed={seed.group(1)}",)
            here_ = await asyncio.to_thread(_pytest, python, here, [*args, *local])
            _same(what, here_, remote, differ, stops=stops)
            return here_, remote

        # pytest-randomly as installed (its seed drawn here), the reports' files, durations
        reports = ("--doctest-modules", "-rA", "--junitxml=junit.xml", "--json-report", "--json-report-file=r.json",
                   "--durations=3")
        (_, want), (_, got) = await both("reports", *reports, local=("--randomly-seed",))
        values = [re.findall(r"random value [0-9.e-]+", out) for out in (want, got)]
        if not values[0] or values[0] != values[1]:
            differ.append(f"pytest-randomly: the seed printed here gives {values[0]}, the plugin run's tests {values[1]}")
        if outcomes(here / "junit.xml") != outcomes(mine / "junit.xml"):
            differ.append(f"--junitxml: {outcomes(here / 'junit.xml')} != {outcomes(mine / 'junit.xml')}")
        if _json_tests(here / "r.json") != _json_tests(mine / "r.json"):
            differ.append(f"--json-report: {_json_tests(here / 'r.json')}\n!=\n{_json_tests(mine / 'r.json')}")
        if "slowest 3 durations" not in got:
            differ.append(f"--durations=3: no durations\n{got[-2000:]}")
        if _lastfailed(here) != _lastfailed(mine):
            differ.append(f"lastfailed: {_lastfailed(here)} != {_lastfailed(mine)}")
        await both("--lf after a plugin run", *NO_RANDOMLY, "-rA", "--doctest-modules", "--lf")
        await both("--ff", *NO_RANDOMLY, "-rA", "--doctest-modules", "--ff", "-q", "--tb=line", "--json-report",
                   "--json-report-file=omit.json", "--json-report-omit", "streams", "--durations=1")
        if _json_tests(here / "omit.json") != _json_tests(mine / "omit.json"):
            differ.append(f"--json-report-omit: {_json_tests(here / 'omit.json')}\n!=\n{_json_tests(mine / 'omit.json')}")

        (_, want), (_, got) = await both("-x", *NO_RANDOMLY, "-rA", "-x", "-k", "unicode or odd", stops=True)
        unfinished = [bool(re.search(r"^\S+\.py [.FEsxX]+$", out, re.M)) for out in (want, got)]
        if "stopping after 1 failures" not in got or unfinished != [True, True]:  # no progress column after the stop
            differ.append(f"-x: no stopping line, or a progress column after the stop\n{got[-2000:]}")
        await both("--maxfail=2", *NO_RANDOMLY, "-rA", "--maxfail=2", "--tb=no", "-k", "unicode or odd",
                   stops=True)
        for step in (1, 2):  # stops at the first failure, then goes on from it: an interruption each time
            (_, want), (_, got) = await both(f"--sw {step}", *NO_RANDOMLY, "-rA", "--sw", "--doctest-modules",
                                             "-k", "not Broken and not setup_error", stops=True)
            if "Interrupted: Test failed, continuing from this test next run." not in got:
                differ.append(f"--sw {step}: no 'Interrupted:' line\n{got[-2000:]}")

        (_, want), (_, got) = await both("-s", *NO_RANDOMLY, "-rA", "-s", "--tb=native", "-W", "error::UserWarning",
                                         "--runxfail", "-k", "prints or warns or xfail or xpass")
        for out in (want, got):  # written as the test ran, in no section
            if "hello from stdout ünïcode\n" not in out or "Captured stdout" in out:
                differ.append(f"-s: the test's output\n{out[-2000:]}")

        await both("selection", *NO_RANDOMLY, "-rA", "-vv", "--strict-markers", "-m", "not fast", "-k", "not xpass",
                   "--deselect", "tests/test_params.py::test_odd_ids[one::1]", "-p", "no:cacheprovider",
                   "--import-mode=importlib")
        (_, want), (_, got) = await both("--log-cli-level", *NO_RANDOMLY, "-rA", "--log-cli-level=INFO", "-k", "logs")
        for out in (want, got):
            if not re.search(r"-+ live log call -+\nINFO +proj:test_outcomes.py:\d+ logged info\n", out):
                differ.append(f"--log-cli-level: no live log\n{out[-2000:]}")
        (_, want), (_, got) = await both("--setup-plan", *NO_RANDOMLY, "-rA", "--setup-plan", "-k", "Setup")
        if "distributed_testing: bundle" in got or "SETUP    C _xunit_setup_class_fixture_TestWithSetup" not in got:
            differ.append(f"--setup-plan: shipped, or not shown here\n{got[-2000:]}")
        code, got = await asyncio.to_thread(_pytest, python, mine, ["--setup-show", *fleet], {"DT_API_KEY": key})
        if code != 4 or "distributed_testing: --setup-show needs the terminal" not in got:
            differ.append(f"--setup-show: not refused\n{got[-2000:]}")
        # a timed-out test fails (the rerun is for AssertionError: under pytest-timeout's signal a rerun passes)
        (_, want), (_, got) = await both("plugins", *NO_RANDOMLY, "-rA", "--reruns", "1", "--only-rerun",
                                         "AssertionError", "--count", "2", "--timeout", "1", "--run-sleepy",
                                         "-k", "flaky or sleeps or test_pass")
        if "1 rerun" not in got or "Timeout (>1.0s) from pytest-timeout" not in got:
            differ.append(f"--reruns / --timeout: not seen\n{got[-2000:]}")
        # pytest's subtests write progress letters into the test's captured output, by verbosity
        for flags in (("-rA",), ("-rA", "-q"), ("-rA", "-v")):
            (_, want), (_, got) = await both(f"subtests {flags}", *NO_RANDOMLY, *flags, "-k", "subtests")
            passes = [re.findall(r"Captured stdout call -+\n(.*?)\n=", out, re.S) for out in (want, got)]
            if passes[0] != passes[1]:
                differ.append(f"subtests {flags}: captured {passes[0]} here, {passes[1]} there")
        for tree in (mine, here):  # a module that fails to import: nothing runs, worded as pytest words it
            (tree / "tests" / "test_zz_broken.py").write_text("import a_module_nobody_has\n")
        (_, want), (_, got) = await both("a collection error", *NO_RANDOMLY, "-rA", "tests")
        if "Interrupted: 1 error during collection" not in got:
            differ.append(f"a collection error: not worded as pytest's\n{got[-2000:]}")
    assert not differ, "\n\n".join(differ)
