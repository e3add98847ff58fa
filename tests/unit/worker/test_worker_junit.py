"""Parsing pytest's xunit1 JUnit XML into the test task's output."""

from __future__ import annotations

from pathlib import Path

import pytest

from distributed_testing.worker.executors.junit import node_id, parse_junit_xml

# Written by pytest 9 with -o junit_family=xunit1 (trimmed tracebacks).
REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">
<testsuite name="pytest" errors="1" failures="1" skipped="2" tests="7" time="0.076">
<testcase classname="sub.test_a" name="test_ok" file="sub/test_a.py" line="1" time="0.001" />
<testcase classname="sub.test_a" name="test_bad" file="sub/test_a.py" line="2" time="0.002">
<failure message="AssertionError: one is not two&#10;assert 1 == 2">E   AssertionError</failure></testcase>
<testcase classname="sub.test_a" name="test_skip" file="sub/test_a.py" line="3" time="0.000">
<skipped type="pytest.skip" message="nope">/tmp/sub/test_a.py:4: nope</skipped></testcase>
<testcase classname="sub.test_a.TestK" name="test_p[1.5]" file="sub/test_a.py" line="6" time="0.001" />
<testcase classname="sub.test_a.TestK" name="test_p[a.b]" file="sub/test_a.py" line="6" time="0.001" />
<testcase classname="sub.test_a" name="test_err" file="sub/test_a.py" line="10" time="0.000">
<error message="failed on setup with &quot;RuntimeError: fixture broke&quot;">E   RuntimeError</error></testcase>
<testcase classname="sub.test_a" name="test_xf" file="sub/test_a.py" line="11" time="0.001">
<skipped type="pytest.xfail" message="" /></testcase>
</testsuite></testsuites>"""

COLLECTION_ERROR = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">
<testsuite name="pytest" errors="1" failures="0" skipped="0" tests="1" time="0.165">
<testcase classname="" name="sub.test_c" file="sub/test_c.py" time="0.000"><error message="collection failure">
ImportError while importing test module
E   ModuleNotFoundError: No module named 'nonexistent_mod'</error></testcase></testsuite></testsuites>"""


def parse(tmp_path: Path, text: str):
    path = tmp_path / "report.xml"
    path.write_text(text)
    return parse_junit_xml(path)


def test_counts_and_outcomes(tmp_path: Path) -> None:
    out = parse(tmp_path, REPORT).as_output()
    counts = {k: out[k] for k in ("passed", "failed", "skipped", "xfailed", "errors", "total")}
    assert counts == {"passed": 3, "failed": 1, "skipped": 1, "xfailed": 1, "errors": 1, "total": 7}
    assert out["duration_s"] == pytest.approx(0.076)
    tests = {t["nodeid"]: t for t in out["tests"]}
    assert tests["sub/test_a.py::test_bad"] == {
        "nodeid": "sub/test_a.py::test_bad",
        "outcome": "failed",
        "duration_s": 0.002,
        "message": "AssertionError: one is not two\nassert 1 == 2",
        "longrepr": "E   AssertionError",  # the element's text: pytest's traceback
    }
    assert tests["sub/test_a.py::TestK::test_p[a.b]"]["outcome"] == "passed"
    assert tests["sub/test_a.py::test_skip"]["message"] == "nope"
    assert tests["sub/test_a.py::test_err"]["message"] == 'failed on setup with "RuntimeError: fixture broke"'
    assert tests["sub/test_a.py::test_xf"]["outcome"] == "xfailed"


def test_collection_error_entry(tmp_path: Path) -> None:
    summary = parse(tmp_path, COLLECTION_ERROR)
    assert summary.tests == [
        {"nodeid": "sub/test_c.py", "outcome": "error", "duration_s": 0.0, "message": "collection failure",
         "longrepr": "ImportError while importing test module\nE   ModuleNotFoundError: No module named 'nonexistent_mod'"}
    ]


def test_malformed_report_raises(tmp_path: Path) -> None:
    with pytest.raises(SyntaxError):  # xml.etree.ElementTree.ParseError
        parse(tmp_path, "<testsuites><testsuite>")


@pytest.mark.parametrize(
    ("file", "classname", "name", "expected"),
    [
        ("test_x.py", "test_x", "test_a", "test_x.py::test_a"),
        ("a/b/test_x.py", "a.b.test_x.C.D", "test_a[1.2]", "a/b/test_x.py::C::D::test_a[1.2]"),
        (None, "pkg.mod", "test_a", "pkg.mod::test_a"),
        ("a/test_x.py", "", "a.test_x", "a/test_x.py"),
    ],
)
def test_node_id(file: str | None, classname: str, name: str, expected: str) -> None:
    assert node_id(file, classname, name) == expected
