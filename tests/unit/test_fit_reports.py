"""A test task's per-test reports are trimmed, cheapest loss first, until they fit one result;
every test's outcome, node id and crash message stay."""

from __future__ import annotations

import copy
from typing import Any

import msgspec

from distributed_testing.worker.executors.test import fit_reports


def _entry(i: int, outcome: str, out_chars: int, tb_chars: int) -> dict[str, Any]:
    report: dict[str, Any] = {"nodeid": f"t.py::test_{i}", "when": "call", "outcome": outcome,
                              "sections": [["Captured stdout call", "o" * out_chars]], "longrepr": None}
    entry: dict[str, Any] = {"nodeid": report["nodeid"], "outcome": outcome, "duration_s": 0.01, "message": None,
                             "reports": [report]}
    if outcome == "failed":
        report["longrepr"] = {"reprcrash": {"path": "t.py", "lineno": 3, "message": f"AssertionError: {i}"},
                              "reprtraceback": {"reprentries": [{"data": {"lines": ["x" * tb_chars]}}]}}
        entry.update(message=f"AssertionError: {i}", longrepr="x" * tb_chars)
    return entry


def _size(value: Any) -> int:
    return len(msgspec.msgpack.encode(value))


def test_what_fits_is_left_alone() -> None:
    tests = [_entry(i, "failed", 100, 100) for i in range(10)]
    before = copy.deepcopy(tests)
    assert fit_reports(tests, 1 << 20) is None
    assert tests == before


def test_passing_tests_output_goes_first() -> None:
    tests = [_entry(i, "passed", 20000, 0) for i in range(50)] + [_entry(i, "failed", 2000, 2000) for i in range(50, 55)]
    note = fit_reports(tests, 100_000)
    assert note is not None and "tests that passed" in note and "every pass before" not in note
    assert all(t["reports"][0]["sections"] == [] for t in tests if t["outcome"] == "passed")
    failed = [t for t in tests if t["outcome"] == "failed"]
    assert all(t["reports"][0]["sections"][0][1] == "o" * 2000 for t in failed)  # kept whole
    assert _size(tests) <= 100_000


def test_failures_are_cut_until_they_fit_and_keep_their_outcome_and_message() -> None:
    tests = [_entry(i, "failed", 20000, 20000) for i in range(200)]
    budget = 200 * 400
    note = fit_reports(tests, budget)
    assert note is not None and "crash line" in note
    assert _size(tests) <= budget
    assert [t["outcome"] for t in tests] == ["failed"] * 200
    assert [t["message"] for t in tests] == [f"AssertionError: {i}" for i in range(200)]
    assert all(t["reports"][0]["longrepr"] == f"AssertionError: {t['nodeid'][11:]}" for t in tests)
