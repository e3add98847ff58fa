"""What the plugin replays live from a running task's ``reports`` page (plugin/replay.py,
``report_live``): only a finished test's entry; one that is not (a pytest-rerunfailures rerun's
so far, with no final teardown report) or that a misbehaving worker malformed is left to the
task's result, and never raises in the plugin's main thread."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from distributed_testing.plugin.replay import report_live


def _report(nodeid: Any, when: str, outcome: str) -> dict[str, Any]:
    return {"$report_type": "TestReport", "nodeid": nodeid, "when": when, "outcome": outcome}


def _entry(nodeid: Any, *reports: tuple[str, str]) -> dict[str, Any]:
    return {"nodeid": nodeid, "outcome": "passed", "duration_s": 0.1,
            "reports": [_report(nodeid, w, o) for w, o in reports]}


class _NotToReplay:
    """An item that must not be replayed: any use of it fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"replayed: .{name} read")


def test_an_entry_with_no_final_outcome_or_a_bad_node_id_is_left_to_the_result(tmp_path: Path) -> None:
    items: dict[str, Any] = {"t.py::test_a": [_NotToReplay()], "5": [_NotToReplay()], "t.py::test_b": [_NotToReplay()]}
    tests: list[Any] = [_entry("t.py::test_a", ("setup", "passed"), ("call", "rerun")),  # a rerun's first run: it runs again
             _entry("t.py::test_b", ("setup", "passed"), ("call", "passed"), ("teardown", "rerun")),
             _entry(5, ("setup", "passed"), ("call", "passed"), ("teardown", "passed")),  # a node id that is no string
             _entry(["t.py::test_a"], ("teardown", "passed")),
             {**_entry("t.py::test_b", ("teardown", "passed")), "reports": {"teardown": "passed"}},
             "t.py::test_a", None]
    durations: dict[str, float] = {}
    assert report_live(items, tests, "w1", "/tree", tmp_path, durations, lambda: False) == []
    assert durations == {}
