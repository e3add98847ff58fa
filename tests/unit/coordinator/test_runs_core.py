"""What a run shows is derived from its tasks (``coordinator/core/runs.py``), and a task's run is
not part of the body a resubmission is compared by (``spec_digest``)."""

from __future__ import annotations

from typing import Any

import pytest

from distributed_testing.coordinator.core import runs as cr
from distributed_testing.coordinator.core.rows import RunRow, TaskRow
from distributed_testing.tasks import spec as specs


def row(task_id: str, state: str, history: list[dict[str, Any]] | None = None, error: str | None = None,
        at: float = 5.0) -> TaskRow:
    outcome = None if state in ("pending", "assigned", "running") else {"status": state, "error": error, "attempt": 1}
    return TaskRow(task_id, "custom", state, 1, 0, 1.0, at, "d", {}, history=history or [], outcome=outcome)


@pytest.mark.parametrize(("counts", "state"), [
    ({}, "queued"), ({"pending": 2}, "queued"), ({"pending": 1, "succeeded": 1}, "running"),
    ({"running": 1}, "running"), ({"succeeded": 2}, "succeeded"), ({"succeeded": 1, "cancelled": 1}, "cancelled"),
    ({"timed_out": 1, "cancelled": 1}, "failed"), ({"error": 1}, "failed"),
])
def test_a_runs_state_follows_its_tasks(counts: dict[str, int], state: str) -> None:
    assert cr.run_state(counts) == state


def test_summary_and_lines_put_failures_first_with_their_first_error_line() -> None:
    run = RunRow("run-0123456789ab", "ci", 0.5, {"commit": "abc"}, "k1")
    sub = {"to": "pending", "at": 1.0}
    tasks = [row("b", "succeeded", [sub, {"to": "assigned", "at": 2.0}], at=3.0),
             row("a", "failed", [sub, {"to": "assigned", "at": 1.5}, {"to": "running", "at": 1.7}],
                 error="\n  AssertionError: 1 != 2\nmore", at=4.0),
             row("c", "running", [sub, {"to": "assigned", "at": 2.4}, {"to": "running", "at": 2.5}])]
    s = cr.summary(run, tasks)
    # started: the first dispatch of any task; each task's line: its latest attempt's start
    assert (s["state"], s["total"], s["started_at"], s["ended_at"]) == ("running", 3, 1.5, None)
    assert s["counts"] == {"failed": 1, "running": 1, "succeeded": 1}
    lines = cr.ordered([cr.task_line(t) for t in tasks])
    assert [x["task_id"] for x in lines] == ["a", "c", "b"]
    assert lines[0]["error_line"] == "AssertionError: 1 != 2" and lines[0]["duration_s"] == pytest.approx(2.3)
    assert cr.summary(run, tasks[:2])["ended_at"] == 4.0


def test_tests_of_counts_and_names_the_failing_tests() -> None:
    output = {"passed": 2, "failed": 1, "skipped": 0, "tests": [{"nodeid": "t.py::ok", "outcome": "passed"},
                                                                 {"nodeid": "t.py::bad", "outcome": "failed"}]}
    assert cr.tests_of(output) == {"passed": 2, "failed": 1, "skipped": 0, "xfailed": 0, "errors": 0,
                                   "failing": ["t.py::bad"]}
    assert cr.tests_of({"value": 1}) is None


def test_derived_ids_do_not_grow_with_each_rerun() -> None:
    first = RunRow("run-000000000001", "ci", 1.0)
    second = RunRow("run-000000000002", "ci (re-run)", 2.0, {"rerun_of": first.run_id})
    assert cr.derived_id("t1", first, second.run_id) == "t1@000000000002"
    assert cr.derived_id("t1@000000000002", second, "run-000000000003") == "t1@000000000003"
    assert cr.derived_id("x" * 128, first, second.run_id) == "x" * 115 + "@000000000002"
    assert [t.task_id for t in cr.to_rerun([row("a", "failed"), row("b", "succeeded"), row("c", "cancelled")],
                                           failed_only=True)] == ["a", "c"]


def test_a_tasks_run_is_not_part_of_its_digest() -> None:
    doc = {"task_id": "a", "type": "custom", "config": {"name": "noop"}, "requirements": {"tags": ["x"]},
           "timeout_s": 1.5}
    (plain,) = specs.parse_tasks([doc])
    (in_run,) = specs.parse_tasks([{**doc, "run_id": "run-0123456789ab"}])
    # the digest of this body before runs existed: stored tasks keep theirs
    assert specs.spec_digest(plain) == specs.spec_digest(in_run) == \
        "0a345135c3d0a155074d91a09731bc246552c10ba5161742a069ca9bb9decf91"
    # a config of its own with a run_id key, a bundle, no task id: only the top-level member is left out
    odd = {"type": "custom", "config": {"name": "noop", "parameters": {"run_id": None, "task_id": "x"}},
           "bundle": "0" * 64}
    (a,) = specs.parse_tasks([odd])
    (b,) = specs.parse_tasks([{**odd, "run_id": "run-0123456789ab"}])
    assert specs.spec_digest(a) == specs.spec_digest(b) != specs.spec_digest(
        specs.parse_tasks([{**odd, "config": {"name": "noop", "parameters": {"task_id": "x"}}}])[0])
    with pytest.raises(Exception, match="run_id"):
        specs.parse_tasks([{**doc, "run_id": "not a run"}])
