"""The report plugin the test executor loads into pytest: one JSON line per report, read back into
per-test entries under the node ids pytest itself used (also for tests a class inherits from a
class in another module, which pytest's JUnit XML files under the defining module)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from distributed_testing.worker.executors import pytest_report

SUITE = {
    "base_checks.py": "class Base:\n    def test_inherited(self):\n        assert True\n",
    "test_a.py": (
        "import warnings, pytest\nfrom base_checks import Base\n\n"
        "class TestKid(Base):\n    pass\n\n"
        "def test_bad():\n    print('to stdout')\n    assert 1 == 2, 'one is not two'\n\n"
        "@pytest.mark.skip(reason='not today')\ndef test_skip():\n    pass\n\n"
        "@pytest.mark.xfail(reason='known')\ndef test_xf():\n    assert False\n\n"
        "@pytest.fixture\ndef broken():\n    raise RuntimeError('fixture broke')\n\n"
        "def test_err(broken):\n    pass\n\n"
        "def test_warns():\n    warnings.warn('careful', UserWarning)\n"),
    "test_c.py": "import no_such_module_here\n",
}


def _run(tmp_path: Path) -> list[dict]:
    for name, text in SUITE.items():
        (tmp_path / name).write_text(text)
    out = tmp_path / "r.jsonl"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", pytest_report.__name__,
                    f"--dt-report={out}", "--continue-on-collection-errors", f"--rootdir={tmp_path}", str(tmp_path)], cwd=tmp_path,
                   capture_output=True, timeout=120, check=False)
    return pytest_report.summarise(pytest_report.read_lines(out))


@pytest.mark.slow
def test_entries_carry_pytests_node_ids_outcomes_and_reports(tmp_path: Path) -> None:
    tests = {t["nodeid"]: t for t in _run(tmp_path)}
    assert tests["test_a.py::TestKid::test_inherited"]["outcome"] == "passed"
    bad = tests["test_a.py::test_bad"]
    assert bad["outcome"] == "failed" and bad["message"].startswith("AssertionError: one is not two")
    assert "assert 1 == 2" in bad["longrepr"]
    call = next(r for r in bad["reports"] if r["when"] == "call")
    assert ["Captured stdout call", "to stdout\n"] in call["sections"]
    assert tests["test_a.py::test_skip"]["outcome"] == "skipped"
    assert tests["test_a.py::test_skip"]["message"] == "not today"
    assert tests["test_a.py::test_xf"]["outcome"] == "xfailed"
    assert tests["test_a.py::test_err"]["outcome"] == "error"
    assert "fixture broke" in tests["test_a.py::test_err"]["message"]
    [warning] = tests["test_a.py::test_warns"]["warnings"]
    assert warning["message"] == "careful" and warning["category"] == "builtins.UserWarning"
    assert tests["test_c.py"]["outcome"] == "error" and "no_such_module_here" in tests["test_c.py"]["longrepr"]


def test_a_line_cut_short_by_a_kill_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"kind": "report", "data": {"nodeid": "t.py::a", "when": "call", "outcome": "passed"}}\n'
                    '{"kind": "report", "data": {"nodeid": "t.py::b", "wh')
    [entry] = pytest_report.summarise(pytest_report.read_lines(path))
    assert entry["nodeid"] == "t.py::a" and entry["outcome"] == "passed"


def _rep(nodeid: str, when: str, outcome: str, attempt: int | None = None) -> dict[str, object]:
    return {"kind": "report", "data": {"nodeid": nodeid, "when": when, "outcome": outcome, "duration": 0.0,
                                       "longrepr": None, **({} if attempt is None else {"rerun": attempt})}}


def test_items_sharing_a_node_id_are_an_entry_each_in_the_order_they_ran() -> None:
    """A conftest's items may share a node id (docopt-ng's cases): each run is its own entry, a
    rerun (pytest-rerunfailures) stays in its test's entry, a warning goes to the latest run."""
    t = "t.cases::shared"
    lines = [_rep(t, "setup", "passed"), _rep(t, "call", "passed"), _rep(t, "teardown", "passed"),
             _rep(t, "setup", "passed"), _rep(t, "call", "rerun"), _rep(t, "teardown", "rerun"),
             _rep(t, "setup", "passed"), _rep(t, "call", "failed"), _rep(t, "teardown", "passed"),
             {"kind": "warning", "nodeid": t, "message": "w"},
             _rep("t.cases::other", "setup", "passed"), _rep("t.cases::other", "teardown", "passed")]
    entries = pytest_report.summarise(lines)
    assert [(e["nodeid"], e["outcome"], len(e["reports"])) for e in entries] == [
        (t, "passed", 3), (t, "failed", 6), ("t.cases::other", "passed", 2)]
    assert "warnings" in entries[1] and "warnings" not in entries[0]
    # pytest-rerunfailures 16: the attempt that reruns logs its teardown as passed; each report has its attempt
    flaky = "t.py::test_flaky"
    rerun = [_rep(flaky, "setup", "passed", 0), _rep(flaky, "call", "rerun", 0), _rep(flaky, "teardown", "passed", 0),
             _rep(flaky, "setup", "passed", 1), _rep(flaky, "call", "passed", 1), _rep(flaky, "teardown", "passed", 1)]
    assert [(e["outcome"], len(e["reports"])) for e in pytest_report.summarise(rerun)] == [("passed", 6)]


def test_suite_properties_go_to_the_entry_of_the_report_they_came_before() -> None:
    """A ``<testsuite>`` property (``record_testsuite_property``, hypothesis's statistics) is written
    before the report it preceded, so it is in the lines of the test it was recorded in, which end
    with that test's teardown (a session's streamed slices end there): the test's entry carries it."""
    prop = [{"kind": "suite_property", "nodeid": "t.py::test_a", "name": "ARCH", "value": "PPC"},
            {"kind": "suite_property", "nodeid": "t.py::test_a", "name": "stats-a", "value": "ran"}]
    lines = [prop[0], _rep("t.py::test_a", "setup", "passed"), _rep("t.py::test_a", "call", "passed"), prop[1],
             _rep("t.py::test_a", "teardown", "passed"), *(_rep("t.py::test_b", w, "passed")
                                                         for w in ("setup", "call", "teardown"))]
    a, b = pytest_report.summarise(lines)
    assert a["suite_properties"] == [["ARCH", "PPC"], ["stats-a", "ran"]] and "suite_properties" not in b
