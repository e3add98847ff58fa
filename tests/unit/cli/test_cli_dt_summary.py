"""The one-line RESULT and ERROR of ``dt submit --wait``'s summary (and ``dt results``' SUMMARY)
for what a real cluster cannot cheaply produce in a test: a multi-node training result, a failed
pip install of a shipped run's environment, many failing tests. The documents are the forms the
coordinator answers with (``GET /api/v1/tasks/{id}``)."""

from __future__ import annotations

from typing import Any

from distributed_testing.cli import report, status

# what a worker reported for a bundle whose ./mypkg depends on a distribution no index has (the
# text of tests/integration/bundles/test_pyenv.py's first task, as a real worker wrote it)
PIP_ERROR = ("installing the task's Python requirements failed (pip install exit code 1):\n"
             "Processing ./pip-src/mypkg\n"
             "  Preparing metadata (pyproject.toml): started\n"
             "  Preparing metadata (pyproject.toml): finished with status 'done'\n"
             "ERROR: Could not find a version that satisfies the requirement definitely-not-here-dt==9.9 (from mypkg) "
             "(from versions: none)\n"
             "ERROR: No matching distribution found for definitely-not-here-dt==9.9 (from mypkg)\n"
             "(after 8.9 s)")

# node 0's output of a two-node training run, as the coordinator stores it (the form of
# tests/integration/flags/test_flags_dt_results_training.py)
TRAINING_OUTPUT = {"node_rank": 0, "nnodes": 2, "nproc_per_node": 1, "backend": "gloo", "model": "mlp",
                   "global_samples_per_s": 350.14, "scaling_efficiency": 0.91,
                   "metrics": {"kind": "training", "model": "mlp", "world_size": 2, "global_samples_per_s": 350.14}}


def task(kind: str, state: str, output: dict[str, Any] | None, error: str | None = None) -> dict[str, Any]:
    status_ = "succeeded" if state == "succeeded" else state
    return {"task_id": f"{kind}-1", "type": kind, "state": state, "worker_id": "w1",
            "outcome": {"status": status_, "worker_id": "w1", "duration_s": 1.5, "error": error},
            "result": None if output is None else {"status": status_, "output": output}}


def test_a_pip_failure_shows_pips_reason_not_only_the_line_that_introduces_it() -> None:
    row = report.summary_row(task("test", "error", {}, PIP_ERROR))
    assert row["error"] == ("installing the task's Python requirements failed (pip install exit code 1): ERROR: Could "
                            "not find a version that satisfies the requirement definitely-not-here-dt==9.9 (from mypkg) "
                            "(from versions: none)")
    assert row["result"] is None  # pytest never ran: no counts to show
    assert report.error_summary("setting up: \n\n  the disk is full\n") == "setting up: the disk is full"


def test_a_training_result_says_its_throughput_as_dt_results_does() -> None:
    row = report.summary_row(task("training", "succeeded", TRAINING_OUTPUT))
    assert row["result"] == "mlp training, 2 node(s): 350.1 samples/s"
    assert row["result"] == report.result_summary(TRAINING_OUTPUT, "training", "succeeded")


def test_custom_results_say_their_fields_in_short_or_ok() -> None:
    env = {"environment": {"python_version": "3.11.7"}}
    assert report.summary_row(task("custom", "succeeded", {"slept_s": 0.203317, **env}))["result"] == "slept_s=0.2033"
    assert report.summary_row(task("custom", "succeeded", dict(env)))["result"] == "ok"
    assert report.summary_row(task("custom", "error", {}, "boom"))["result"] is None
    long = report.summary_row(task("custom", "succeeded", {"rows": list(range(100)), "name": "a  b\nc"}))["result"]
    assert long.startswith("rows=[0,1,2,") and long.endswith("…") and len(long) == report.MAX_CUSTOM_CHARS


def test_the_error_names_the_failing_tests_and_counts_the_rest() -> None:
    tests = [{"nodeid": f"test_m.py::test_{i}", "outcome": "failed" if i % 2 else "passed", "duration_s": 0.1}
             for i in range(10)]
    tests.append({"nodeid": "test_n.py", "outcome": "error", "duration_s": 0, "message": "collection failed"})
    row = report.summary_row(task("test", "failed", {"passed": 5, "failed": 5, "skipped": 0, "errors": 1,
                                                       "tests": tests}, "5 of 10 tests failed; 1 errored"))
    assert row["result"] == "5 passed, 5 failed, 0 skipped, 1 error"
    assert row["error"] == ("5 of 10 tests failed; 1 errored: test_m.py::test_1, test_m.py::test_3, test_m.py::test_5 "
                            "and 3 more")
    # an error that already names the test is left as it is
    named = report.summary_row(task("test", "failed", {"tests": tests[:2]}, "test_m.py::test_1 timed out"))
    assert (named["error"], named["result"]) == ("test_m.py::test_1 timed out", "1 passed, 1 failed, 0 skipped")


def test_status_of_a_running_and_of_a_pending_task() -> None:
    running = {"task_id": "r", "type": "custom", "state": "running", "attempt": 2, "retries_used": 1,
               "worker_id": "w3", "submitted_at": 1000.0, "updated_at": 1010.0, "outcome": None, "result": None}
    lines = status.render(running, now=1072.4)
    assert lines[:3] == ["task       r (custom)", "state      running, attempt 2 (1 retry used)", "worker     w3"]
    assert "running    for 62 s (since 1970-01-01T00:16:50Z)" in lines
    pending = {"task_id": "p", "type": "test", "state": "pending", "submitted_at": 1000.0, "updated_at": 1000.0,
               "pending_reason": "w0 lacks tag gpu", "unschedulable": True, "outcome": None, "result": None}
    assert "waiting    no connected worker can run it: w0 lacks tag gpu" in status.render(pending, now=1001.0)
    failed = {**task("test", "error", {}, PIP_ERROR), "submitted_at": 1000.0, "updated_at": 1009.0}
    shown = status.render(failed, now=2000.0)
    assert shown[shown.index(next(x for x in shown if x.startswith("error"))) + 1] == "           Processing ./pip-src/mypkg"
