"""``dt`` output without a network: help on every flag, ISO times, table cells, the JUnit file (read
back with junitparser), the progress tracker and displays, and the wait's exit codes against a
scripted API."""

from __future__ import annotations

import argparse
import io
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import junitparser
import pytest

from distributed_testing.cli import dt, progress, report, submit


def walk(parser: argparse.ArgumentParser, path: str = "dt") -> list[tuple[str, argparse.Action]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                out += walk(child, f"{path} {name}")
        else:
            out.append((path, action))
    return out


def test_every_flag_and_argument_of_every_subcommand_has_help() -> None:
    actions = walk(dt.build_parser())
    assert len(actions) > 40
    missing = [f"{path} {a.option_strings or a.dest}" for path, a in actions if not a.help]
    assert missing == []
    subparsers = [a for _, a in actions if isinstance(a, argparse._SubParsersAction)]
    assert subparsers == []  # walked into, not listed
    helps = dt.build_parser().format_help()
    assert "3  submit --fail-if-unschedulable" in helps and "4  submit --timeout" in helps


def test_iso_times_in_utc_or_the_local_zone() -> None:
    assert report.iso_time(0) == "1970-01-01T00:00:00Z"
    assert report.iso_time(1_700_000_000.7) == "2023-11-14T22:13:20Z"
    assert report.iso_time(None) is None
    local = report.iso_time(0, local=True)
    assert local is not None and local[-6] in "+-" and local[-3] == ":"
    doc = {"task_id": "t", "submitted_at": 0, "priority": 5, "history": [{"at": 60.0, "to": "pending"}],
           "outcome": None, "result": {"started_at": 1, "finished_at": True}}
    assert report.with_iso_times(doc) == {
        "task_id": "t", "submitted_at": "1970-01-01T00:00:00Z", "priority": 5,
        "history": [{"at": "1970-01-01T00:01:00Z", "to": "pending"}], "outcome": None,
        "result": {"started_at": "1970-01-01T00:00:01Z", "finished_at": True}}


def test_a_table_keeps_one_line_per_row_whatever_the_text() -> None:
    out = io.StringIO()
    long_error = "Traceback (most recent call last):\n  File x\nValueError: " + "y" * 300
    report.print_table([{"a": "x", "error": long_error}, {"a": "z", "error": "e" * 500}, {"a": None}], ["a", "error"], out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 4
    assert lines[1].split(None, 1)[1] == "Traceback (most recent call last): …"
    assert lines[2].endswith("…") and len(lines[2].split(None, 1)[1]) == report.MAX_CELL
    assert lines[3].split() == ["-", "-"]


def test_the_summary_wraps_a_long_error_under_its_column() -> None:
    out = io.StringIO()
    reason = "no connected worker satisfies the requirements (" + "; ".join(f"w{i} lacks tag gpu" for i in range(9)) + ")"
    report.print_summary([{**GAVE_UP, "outcome": {"status": "wait_timeout", "error": reason}}], out)
    header, first, *more = out.getvalue().splitlines()
    column = header.index("ERROR")
    assert more and all(line[:column].isspace() and not line[column].isspace() for line in more)
    assert " ".join([first[column:], *(line[column:] for line in more)]) == reason


@pytest.mark.parametrize(("nodeid", "expected"), [
    ("tests/test_more.py::ChunkedTests::test_x", ("tests.test_more.ChunkedTests", "test_x")),
    ("test_a.py::test_b[1-a::b]", ("test_a", "test_b[1-a::b]")),
    ("pkg/test_c.py::A::B::test_d", ("pkg.test_c.A.B", "test_d")),
    ("pkg/test_e.py", ("pkg.test_e", "test_e.py")),
])
def test_node_ids_become_pytest_classname_and_name(nodeid: str, expected: tuple[str, str]) -> None:
    assert report.split_nodeid(nodeid) == expected


TEST_TASK = {
    "task_id": "suite-1", "type": "test", "state": "failed", "worker_id": "w1",
    "outcome": {"status": "failed", "worker_id": "w1", "duration_s": 2.5, "error": "1 of 4 tests failed"},
    "result": {"output": {"tests": [
        {"nodeid": "tests/test_more.py::ChunkedTests::test_ok", "outcome": "passed", "duration_s": 0.25},
        {"nodeid": "tests/test_more.py::ChunkedTests::test_bad", "outcome": "failed", "duration_s": 0.5,
         "message": "AssertionError: 1 == 2\nassert 1 == 2"},
        {"nodeid": "tests/test_more.py::test_skip", "outcome": "skipped", "duration_s": 0, "message": "later"},
        {"nodeid": "tests/test_more.py::test_boom", "outcome": "error", "duration_s": 0.1, "message": "fixture"},
    ]}},
}
BENCH_TASK = {"task_id": "bench-1", "type": "benchmark", "state": "timed_out", "worker_id": "w2",
              "outcome": {"status": "timed_out", "worker_id": "w2", "duration_s": 9.0, "error": "timed out after 9s"},
              "result": {"output": {}}}
GAVE_UP = {"task_id": "wait-1", "type": "custom", "state": "pending", "worker_id": None,
           "outcome": {"status": "wait_timeout", "error": "dt: gave up waiting while pending: no worker is connected"}}


def test_junit_follows_pytest_conventions(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "report.xml"
    report.write_junit(path, [TEST_TASK, BENCH_TASK, GAVE_UP])
    xml = junitparser.JUnitXml.fromfile(str(path))
    suites = {s.name: s for s in xml}
    suite = suites["suite-1"]
    assert (suite.tests, suite.failures, suite.errors, suite.skipped, suite.time) == (4, 1, 1, 1, 2.5)
    assert suite.hostname == "w1"
    cases = {(c.classname, c.name): c for c in suite}
    assert set(cases) == {("tests.test_more.ChunkedTests", "test_ok"), ("tests.test_more.ChunkedTests", "test_bad"),
                          ("tests.test_more", "test_skip"), ("tests.test_more", "test_boom")}
    [failure] = cases["tests.test_more.ChunkedTests", "test_bad"].result
    assert isinstance(failure, junitparser.Failure)
    assert failure.message == "AssertionError: 1 == 2" and "assert 1 == 2" in (failure.text or "")
    assert isinstance(cases["tests.test_more", "test_skip"].result[0], junitparser.Skipped)
    assert isinstance(cases["tests.test_more", "test_boom"].result[0], junitparser.Error)

    bench = suites["bench-1"]
    assert (bench.tests, bench.failures, bench.errors, bench.skipped, bench.time) == (1, 0, 1, 0, 9.0)
    [case] = list(bench)
    assert (case.classname, case.name, case.result[0].message) == ("dt.benchmark", "bench-1", "timed out after 9s")
    [case] = list(suites["wait-1"])
    assert "no worker is connected" in case.result[0].message
    assert (xml.tests, xml.failures, xml.errors, xml.skipped) == (6, 1, 3, 1)


def test_summary_rows_carry_task_state_worker_duration_and_the_first_error_line() -> None:
    assert report.summary_row(TEST_TASK) == {
        "task": "suite-1", "state": "failed", "worker": "w1", "duration_s": 2.5,
        "result": "1 passed, 1 failed, 1 skipped, 1 error",  # counted from the per-test entries
        "error": "1 of 4 tests failed: tests/test_more.py::ChunkedTests::test_bad, tests/test_more.py::test_boom"}
    multi = {**BENCH_TASK, "outcome": {**BENCH_TASK["outcome"], "error": "\n  first\nsecond"}}
    assert report.summary_row(multi)["error"] == "first"
    assert report.summary_row(GAVE_UP)["worker"] is None


def view(task_id: str, state: str, **extra: Any) -> dict[str, Any]:
    return {"task_id": task_id, "state": state, "worker_id": None, "pending_reason": None, "unschedulable": False,
            "outcome": None, "updated_at": 100.0, **extra}


def test_the_tracker_reports_state_changes_and_becoming_unschedulable() -> None:
    t = progress.Tracker()
    first = t.update(view("a", "pending", pending_reason="waiting for a free slot on 1 eligible worker(s)"))
    assert first == progress.Change("a", None, "pending", None, "waiting for a free slot on 1 eligible worker(s)", False)
    assert t.update(view("a", "pending", pending_reason="waiting for a free slot on 2 eligible worker(s)")) is None
    blocked = t.update(view("a", "pending", pending_reason="no connected worker satisfies the requirements "
                                                         "(w1 lacks tag gpu)", unschedulable=True))
    assert blocked is not None and progress.describe(blocked) == (
        "a: pending -> pending, no connected worker can run it (no connected worker satisfies the requirements "
        "(w1 lacks tag gpu))")
    running = t.update(view("a", "running", worker_id="w1"))
    assert running is not None and progress.describe(running) == "a: pending -> running on w1"
    t.update(view("b", "succeeded"))
    assert t.counts() == {"running": 1, "succeeded": 1}


def test_the_tracker_reports_each_new_progress_message_of_a_running_task() -> None:
    t = progress.Tracker()
    step = {"fraction": 1 / 6, "message": "cnn b1 fp32: 0.85 ms (1 of 6)", "at": 101.0}
    started = t.update(view("b", "running", worker_id="w1", progress=step))
    assert started is not None and progress.describe(started) == "b: running on w1; cnn b1 fp32: 0.85 ms (1 of 6)"
    assert t.update(view("b", "running", worker_id="w1", progress={**step, "at": 102.0})) is None  # same message
    third = t.update(view("b", "running", worker_id="w1", progress={**step, "fraction": 0.5,
                                                                     "message": "cnn b8 fp32: 1.23 ms (3 of 6)"}))
    assert third is not None and progress.describe(third) == "b: cnn b8 fp32: 1.23 ms (3 of 6)"
    done = t.update(view("b", "succeeded", progress=None))
    assert done is not None and progress.describe(done) == "b: running -> succeeded"


def test_frequent_progress_is_reported_by_tenths_or_after_a_quiet_while() -> None:
    t = progress.Tracker()
    said = []
    for step in range(1, 101):  # a training run's report every half second: 100 steps in 50 s
        p = {"fraction": step / 100, "message": f"training step {step}/100", "at": 100.0 + step / 2}
        change = t.update(view("tr", "running", worker_id="w1", progress=p))
        if change is not None:
            said.append(change.progress)
    assert said == [f"training step {s}/100" for s in (1, 11, 21, 31, 41, 51, 61, 71, 81, 91, 100)]
    slow = [t.update(view("sl", "running", progress={"fraction": 0.01 * i, "message": f"m{i}", "at": 20.0 * i}))
            for i in range(1, 4)]  # small steps, far apart: one line at least every PROGRESS_QUIET_S
    assert [c.progress if c else None for c in slow] == ["m1", None, "m3"]


def test_plain_progress_writes_one_stamped_line_per_change_and_nothing_else() -> None:
    out = io.StringIO()
    plain = progress.PlainProgress(out, clock=lambda: 0.0)
    t = progress.Tracker()
    changes = [c for c in (t.update(view("a", "pending")), t.update(view("b", "running", worker_id="w9"))) if c]
    plain.show(t, changes)
    plain.show(t, [])
    assert out.getvalue() == "1970-01-01T00:00:00Z a: pending\n1970-01-01T00:00:00Z b: running on w9\n"
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue()


def test_live_progress_draws_counts_workers_elapsed_and_reasons() -> None:
    out = io.StringIO()
    live = progress.LiveProgress(out, clock=lambda: 142.0, force_terminal=True)
    t = progress.Tracker()
    t.update(view("run-1", "running", worker_id="w1", progress={"fraction": 0.5, "message": "mlp b8 int8: 0.31 ms "
                                                                                  "(1 of 2)", "at": 141.0}))
    t.update(view("wait-1", "pending", pending_reason="no connected worker satisfies the requirements (w1 lacks "
                  "tag gpu)", unschedulable=True))
    t.update(view("done-1", "succeeded"))
    live.show(t, [])
    live.close()
    text = out.getvalue()
    assert "\x1b[" in text  # drawn for a terminal
    plain = progress.Console(file=io.StringIO(), width=200)
    with plain.capture() as cap:
        plain.print(live.render(t))
    drawn = cap.get()
    assert "pending 1  running 1  succeeded 1" in drawn
    assert "run-1" in drawn and "w1" in drawn and "42s" in drawn and "mlp b8 int8: 0.31 ms (1 of 2)" in drawn
    assert "cannot run on any connected worker: no connected worker satisfies" in drawn
    assert "done-1" not in drawn  # finished tasks are counted, not listed


class ScriptedApi:
    """Answers ``GET /api/v1/tasks/{id}`` from a list of views per task (the last one repeats)."""

    def __init__(self, script: dict[str, list[dict[str, Any]]]) -> None:
        self.script, self.calls = script, 0

    def get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        self.calls += 1
        views = self.script[path.rsplit("/", 1)[1]]
        return views.pop(0) if len(views) > 1 else views[0]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def wait(script: dict[str, list[dict[str, Any]]], timeout: float = 60, unschedulable_s: float | None = None
         ) -> tuple[submit.Waited, FakeClock]:
    clock = FakeClock()
    waited = submit.wait_tasks(ScriptedApi(script), list(script), timeout, unschedulable_s,  # type: ignore[arg-type]
                               progress.NoProgress(), clock=clock, sleep=clock.sleep)
    return waited, clock


def done(task_id: str, state: str) -> dict[str, Any]:
    return view(task_id, state, outcome={"status": state, "error": None if state == "succeeded" else "boom"})


BLOCKED = {"pending_reason": "no connected worker satisfies the requirements (w1 lacks tag gpu)", "unschedulable": True}


def test_wait_ends_when_every_task_is_final() -> None:
    waited, clock = wait({"a": [view("a", "pending"), view("a", "running"), done("a", "succeeded")],
                          "b": [done("b", "succeeded")]})
    assert (waited.stopped, waited.exit_code(), clock.now) == (None, 0, 2 * submit.POLL_S)
    waited, _ = wait({"a": [done("a", "failed")], "b": [done("b", "succeeded")]})
    assert waited.exit_code() == submit.EXIT_FAILED == 1


def test_an_unschedulable_task_ends_the_wait_after_the_grace_period_with_exit_3() -> None:
    waited, clock = wait({"a": [view("a", "pending", **BLOCKED)], "b": [view("b", "running")]}, unschedulable_s=2)
    assert (waited.stopped, waited.exit_code(), clock.now) == (submit.UNSCHEDULABLE, 3, 2.0)
    a, b = waited.tasks
    assert a["outcome"]["status"] == "unschedulable"
    assert a["outcome"]["error"] == ("dt: no connected worker can run it (waited 2s): no connected worker satisfies "
                                     "the requirements (w1 lacks tag gpu)")
    assert b["outcome"] == {"status": "wait_timeout", "error": "dt: gave up waiting while running"}


def test_a_task_that_becomes_schedulable_again_restarts_the_grace_period() -> None:
    flapping = [view("a", "pending", **BLOCKED)] * 3 + [view("a", "pending")] + [view("a", "pending", **BLOCKED)] * 6
    waited, clock = wait({"a": list(flapping)}, unschedulable_s=2)
    assert waited.stopped == submit.UNSCHEDULABLE and clock.now == 4.0  # blocked again since 2.0


def test_without_the_flag_an_unschedulable_task_waits_out_the_timeout_and_says_why() -> None:
    waited, clock = wait({"a": [view("a", "pending", **BLOCKED)]}, timeout=3)
    assert (waited.stopped, waited.exit_code(), clock.now) == (submit.GAVE_UP, 4, 3.0)
    assert waited.tasks[0]["outcome"]["error"] == ("dt: gave up waiting while pending: no connected worker satisfies "
                                                   "the requirements (w1 lacks tag gpu)")
    assert waited.tasks[0]["state"] == "pending"


def test_a_failure_outranks_stopping_early() -> None:
    waited, _ = wait({"a": [done("a", "error")], "b": [view("b", "pending", **BLOCKED)]}, unschedulable_s=1)
    assert waited.exit_code() == 1


def test_polls_are_bounded_per_round() -> None:
    many = {f"t{i}": [view(f"t{i}", "pending")] for i in range(250)}
    clock = FakeClock()
    api = ScriptedApi(many)
    submit.wait_tasks(api, list(many), 1.0, None, progress.NoProgress(), clock=clock,  # type: ignore[arg-type]
                      sleep=clock.sleep)
    rounds = 1 + int(1.0 / submit.POLL_S)
    assert api.calls == rounds * submit.MAX_POLLS_PER_ROUND


MEASURED = {"task_id": "bench-2", "type": "benchmark", "state": "succeeded", "worker_id": "w2",
            "outcome": {"status": "succeeded", "worker_id": "w2", "duration_s": 3.0},
            "result": {"output": {"model": "mlp", "precision": "fp32", "device": "cpu", "weights": "random",
                                  "batch_results": [
                                      {"batch_size": 1, "latency_ms": {"median": 0.025}, "measured_s": 1.0,
                                       "verdict": "quiet", "verdict_reason": "cv 0.02; kept their CPU"},
                                      {"batch_size": 4, "latency_ms": {"median": 24.0}, "measured_s": 1.0,
                                       "verdict": "disturbed", "verdict_reason": "waited for a CPU 90%"}]}}}


def test_a_benchmark_says_its_verdicts_and_random_weights_in_the_summary_and_junit(tmp_path: Path) -> None:
    row = report.summary_row(MEASURED)
    assert row["result"] == "mlp fp32 cpu random weights: bs1 0.025ms (quiet), bs4 24ms (disturbed)"
    path = tmp_path / "r.xml"
    report.write_junit(path, [MEASURED])
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "2" and suite.get("skipped") == "1"
    quiet, disturbed = suite.findall("testcase")
    assert quiet.get("name") == "bench-2[bs=1]" and quiet.find("skipped") is None
    assert "measurement quiet: cv 0.02" in (quiet.findtext("system-out") or "")
    skipped = disturbed.find("skipped")
    assert skipped is not None and "measurement disturbed: waited for a CPU 90%" in skipped.get("message", "")
    assert "random weights" in (disturbed.findtext("system-out") or "")
