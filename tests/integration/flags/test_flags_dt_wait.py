"""``dt submit --wait`` against a real coordinator: unschedulable tasks (``--fail-if-unschedulable``,
exit 3), the timeout's reason (exit 4), ``--progress``, the JUnit file of a real pytest run read
with junitparser, ``--json``'s summary; ``dt token``, ``--local-time``, and errors said once."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import junitparser
import pytest
from test_flags_dt_cli import DT, noop, run_dt, summary_rows, task_file, unrunnable

from distributed_testing.cli import dt

__all__ = ["run_dt"]  # the fixture, re-exported for this module's tests
pytestmark = pytest.mark.timeout(60)
LACKS = "no connected worker satisfies the requirements (w0 lacks tag no-such-worker)"


@pytest.fixture
def with_worker(run_dt: DT) -> DT:
    run_dt.tc.call(run_dt.tc.c.add_worker())
    return run_dt


def test_an_unschedulable_task_is_reported_at_once_and_ends_the_wait_with_exit_3(with_worker: DT, tmp_path: Path) -> None:
    started = time.monotonic()
    code, out, err = with_worker("submit", task_file(tmp_path, [unrunnable("u-1"), noop("u-ok")]),
                                 "--fail-if-unschedulable", "1", "--timeout", "50")
    assert code == dt.EXIT_UNSCHEDULABLE == 3, err
    assert time.monotonic() - started < 30  # not the --timeout
    assert out.split() == ["u-1", "u-ok"]
    assert re.search(rf"^\S+Z u-1: pending, no connected worker can run it \({re.escape(LACKS)}\)$", err, re.M), err
    rows = summary_rows(err)
    assert rows["u-ok"][:2] == ["u-ok", "succeeded"]
    assert " ".join(rows["u-1"]).endswith(f"dt: no connected worker can run it (waited 1s): {LACKS}")
    status = with_worker.task("u-1")
    assert (status["state"], status["unschedulable"], status["pending_reason"]) == ("pending", True, LACKS)
    assert with_worker.task("u-ok")["unschedulable"] is False


def test_the_timeout_exits_4_and_names_the_coordinator_s_reason(with_worker: DT, tmp_path: Path) -> None:
    code, _, err = with_worker("submit", task_file(tmp_path, unrunnable("t-1")), "--wait", "--timeout", "0.6",
                               "--progress", "off")
    assert code == dt.EXIT_GAVE_UP == 4
    assert err.splitlines()[0].startswith("run run-")  # the run it made (test_flags_dt_runs.py)
    assert err.splitlines()[1].split() == ["TASK", "STATE", "WORKER", "DURATION_S", "RESULT", "ERROR"]  # no progress lines
    assert " ".join(summary_rows(err)["t-1"]) == f"t-1 pending - - - dt: gave up waiting while pending: {LACKS}"
    assert with_worker.task("t-1")["state"] == "pending"  # still queued


@pytest.mark.parametrize("flag", ["--timeout", "--fail-if-unschedulable"])
def test_seconds_flags_refuse_bad_values(run_dt: DT, tmp_path: Path, flag: str) -> None:
    code, _, err = run_dt("submit", task_file(tmp_path, noop("x")), flag, "soon")
    assert code == 2 and f"{flag}: not a number of seconds: 'soon'" in err
    code, _, err = run_dt("submit", task_file(tmp_path, noop("x")), flag, "-1")
    assert code == 2 and "must be a finite number of seconds >= 0" in err


TESTS = '''
import pytest

class ChunkedTests:
    def test_ok(self):
        assert True

    def test_bad(self):
        assert 1 == 2, "one is not two"

def test_skipped():
    pytest.skip("not today")
'''


def test_junit_of_a_real_pytest_task_groups_by_module_and_class(with_worker: DT, tmp_path: Path) -> None:
    (tmp_path / "test_more.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\npython_classes = *Tests\n")
    junit, report = tmp_path / "report.xml", tmp_path / "report.json"
    task = {"task_id": "more-1", "type": "test", "config": {"test_file": "test_more.py"}}
    code, _, err = with_worker("submit", task_file(tmp_path, task), "--junit", str(junit), "--json", str(report))
    assert code == 1, err
    assert summary_rows(err)["more-1"][:3] == ["more-1", "failed", "w0"]
    [suite] = list(junitparser.JUnitXml.fromfile(str(junit)))
    assert (suite.name, suite.tests, suite.failures, suite.errors, suite.skipped) == ("more-1", 3, 1, 0, 1)
    assert suite.time > 0
    cases = {(c.classname, c.name): c for c in suite}
    assert set(cases) == {("test_more.ChunkedTests", "test_ok"), ("test_more.ChunkedTests", "test_bad"),
                          ("test_more", "test_skipped")}
    assert "one is not two" in cases["test_more.ChunkedTests", "test_bad"].result[0].message
    doc = json.loads(report.read_text())
    [row] = doc["summary"]
    assert (row["task"], row["state"], row["worker"]) == ("more-1", "failed", "w0")
    # the error's first line, naming the failing test
    assert row["error"] == doc["tasks"][0]["outcome"]["error"].splitlines()[0] + ": test_more.py::ChunkedTests::test_bad"


def test_token_prints_a_jwt_that_works_and_json_gives_the_whole_answer(run_dt: DT) -> None:
    viewer = run_dt.key("viewer")
    code, out, err = run_dt("token", key=viewer)
    token = out.strip()
    assert code == 0 and token.count(".") == 2 and "\n" not in token, err
    assert run_dt("workers", key=token)[0] == 0
    code, out, _ = run_dt("token", "--json", key=viewer)
    answer = json.loads(out)
    assert answer["role"] == "viewer" and answer["expires_at"] > time.time() and answer["token"].count(".") == 2
    code, _, err = run_dt("token", key="dtk_wrong_secret")
    assert code == 2 and err.count("\n") == 1 and "HTTP 401" in err


def test_an_error_is_printed_once(run_dt: DT, tmp_path: Path) -> None:
    bad = [{"type": "custom", "config": {}, "priority": "high"}]
    code, _, err = run_dt("submit", task_file(tmp_path, bad))
    assert code == 2
    for needle in ("priority", "config"):
        assert err.count(needle) == 1, err


@pytest.fixture
def kolkata(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_local_time_shows_the_zone_offset(run_dt: DT, tmp_path: Path, kolkata: None) -> None:
    run_dt("submit", task_file(tmp_path, unrunnable("lt-1")))
    code, out, _ = run_dt("--local-time", "status", "lt-1")
    status = json.loads(out)
    assert code == 0 and status["submitted_at"].endswith("+05:30") and status["history"][0]["at"].endswith("+05:30")
    code, out, _ = run_dt("status", "lt-1")
    assert json.loads(out)["submitted_at"].endswith("Z")
    code, out, _ = run_dt("--local-time", "keys", "list")
    assert "+05:30" in out.splitlines()[1]


def test_task_ids_with_a_slash_are_waited_for_shown_and_cancelled(with_worker: DT, tmp_path: Path) -> None:
    code, out, err = with_worker("submit", task_file(tmp_path, [noop("ci/run-1"), unrunnable("ci/run-2")]), "--wait",
                                 "--timeout", "1", "--progress", "off")
    assert code == 4 and out.split() == ["ci/run-1", "ci/run-2"], err
    assert summary_rows(err)["ci/run-1"][:2] == ["ci/run-1", "succeeded"]
    assert with_worker.task("ci/run-1")["state"] == "succeeded"
    assert with_worker("cancel", "ci/run-2")[:2] == (0, "ci/run-2: cancelled\n")
