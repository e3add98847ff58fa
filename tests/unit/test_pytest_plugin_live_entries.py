"""What the plugin replays live from a running task's ``reports`` pages (plugin/replay.py,
``report_live``): only a finished test's entry; one that is not (a pytest-rerunfailures rerun's
so far, with no final teardown report) or that a misbehaving worker malformed is left to the
task's result, and never raises in the plugin's main thread. Items that share a node id each take
their own entry, across pages and across a retry, whose entries start again at its first test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from distributed_testing.plugin import replay
from distributed_testing.plugin.replay import report_live


def _report(nodeid: Any, when: str, outcome: str) -> dict[str, Any]:
    return {"$report_type": "TestReport", "nodeid": nodeid, "when": when, "outcome": outcome}


def _entry(nodeid: Any, *reports: tuple[str, str], said: str = "") -> dict[str, Any]:
    return {"nodeid": nodeid, "outcome": "passed", "duration_s": 0.1, "said": said,
            "reports": [_report(nodeid, w, o) for w, o in reports]}


ENDED = (("setup", "passed"), ("call", "passed"), ("teardown", "passed"))


class _NotToReplay:
    """An item that must not be replayed: any use of it fails the test."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"replayed: .{name} read")


def test_an_entry_with_no_final_outcome_or_a_bad_node_id_is_left_to_the_result(tmp_path: Path) -> None:
    items: dict[str, Any] = {"t.py::test_a": [_NotToReplay()], "5": [_NotToReplay()], "t.py::test_b": [_NotToReplay()]}
    tests: list[Any] = [_entry("t.py::test_a", ("setup", "passed"), ("call", "rerun")),  # a rerun's first run: it runs again
             _entry("t.py::test_b", ("setup", "passed"), ("call", "passed"), ("teardown", "rerun")),
             _entry(5, *ENDED),  # a node id that is no string
             _entry(["t.py::test_a"], ("teardown", "passed")),
             {**_entry("t.py::test_b", ("teardown", "passed")), "reports": {"teardown": "passed"}},
             "t.py::test_a", None]
    durations: dict[str, float] = {}
    assert report_live(items, {}, set(), tests, "w1", "/tree", tmp_path, durations, lambda: False) == []
    assert durations == {}


@pytest.fixture
def replayed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(item, what its entry said) for each entry replayed, in order."""
    said: list[tuple[str, str]] = []
    monkeypatch.setattr(replay, "_replay_entry", lambda item, entry, worker, local: said.append((item, entry["said"])))
    return said


def test_items_that_share_a_node_id_take_their_own_entries_across_pages_and_a_retry(
        tmp_path: Path, replayed: list[tuple[str, str]]) -> None:
    items: dict[str, Any] = {"c::shared": ["item-1", "item-2", "item-3"], "t.py::other": ["item-o"]}
    done: set[Any] = set()

    def page(seen: dict[str, int], *entries: dict[str, Any]) -> None:
        done.update(report_live(items, seen, done, list(entries), "w1", "/tree", tmp_path, {}, lambda: False))

    first: dict[str, int] = {}  # attempt 1: its first two tests, one page each, then the worker is lost
    page(first, _entry("c::shared", *ENDED, said="ok-1"))
    page(first, _entry("c::shared", ("setup", "passed"), ("call", "failed"), ("teardown", "passed"), said="bad-2"))
    assert replayed == [("item-1", "ok-1"), ("item-2", "bad-2")]
    retry: dict[str, int] = {}  # attempt 2 runs the task again from its first test
    page(retry, _entry("c::shared", *ENDED, said="ok-1 again"), _entry("c::shared", *ENDED, said="bad-2 passing now"),
         _entry("c::shared", *ENDED, said="ok-3"))
    page(retry, _entry("t.py::other", *ENDED, said="other"), _entry("c::shared", *ENDED, said="one too many"))
    assert replayed == [("item-1", "ok-1"), ("item-2", "bad-2"), ("item-3", "ok-3"), ("item-o", "other")]
