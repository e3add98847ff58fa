"""Runs in ``dt`` against a real coordinator (issue 38): ``dt submit`` makes a run (named by
``--run-name``, the CI job's variables or the file) and announces it (``DT_DASHBOARD_URL`` /
``--dashboard-url``); ``dt runs`` and ``dt run`` show it (failures first); ``dt rerun --failed``
runs only the failed task again, under a new run and a derived id; ``dt cancel --run`` cancels
what is left of a run; another key's run is refused; a changed body under a used id is still 409."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from test_flags_dt_cli import DT, noop, run_dt, sleep, task_file

__all__ = ["run_dt"]
pytestmark = pytest.mark.timeout(60)


def run_of(err: str) -> str:
    found = re.findall(r"^run (run-[0-9a-f]{12}) \(", err, re.M)
    assert len(found) == 1, err
    return found[0]


def test_submit_makes_a_run_that_runs_and_run_show_failures_first(run_dt: DT, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    run_dt.tc.call(run_dt.tc.c.add_worker())
    for var, value in {"GITHUB_WORKFLOW": "tests", "GITHUB_RUN_NUMBER": "41", "GITHUB_SHA": "3f2a9c1d0e4b5a6",
                       "GITHUB_REF_NAME": "main", "DT_DASHBOARD_URL": "http://dash.example/dashboard"}.items():
        monkeypatch.setenv(var, value)
    doc = [noop("ok-1"), sleep("slow-1", 5, timeout_s=0.3)]
    code, out, err = run_dt("submit", task_file(tmp_path, doc), "--wait", "--progress", "off")
    assert code == 1, err
    assert out.split() == ["ok-1", "slow-1"]
    rid = run_of(err)
    assert f"run {rid} (tests 41 3f2a9c1d0e4b): http://dash.example/dashboard/runs/{rid}" in err

    code, out, err = run_dt("runs", "--json")
    assert code == 0, err
    (listed,) = json.loads(out)["runs"]
    assert listed["run_id"] == rid and listed["state"] == "failed" and listed["total"] == 2
    assert listed["counts"] == {"succeeded": 1, "timed_out": 1}
    assert listed["labels"] == {"commit": "3f2a9c1d0e4b5a6", "branch": "main"}
    code, out, err = run_dt("runs", "--text", "--state", "failed")
    assert code == 0 and rid in out and "1 timed_out, 1 succeeded" in out, (out, err)

    code, out, err = run_dt("run", rid, "--text")
    assert code == 0, err
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if "slow-1" in line)
    assert first < next(i for i, line in enumerate(lines) if "ok-1" in line)  # failures first
    assert "timed_out" in lines[first] and "timed out after 0.3 s" in lines[first]
    code, out, err = run_dt("run", rid)  # not a terminal: the API's JSON
    assert [t["task_id"] for t in json.loads(out)["tasks"]] == ["slow-1", "ok-1"]

    # the same file again: the same ids and bodies stay in their first run
    code, out, err = run_dt("submit", task_file(tmp_path, doc), "--run-name", "again")
    assert code == 0 and "stay in the run they joined first" in err and "(again)" in err, err
    # a changed body under a used id: the API still answers 409, and dt names this run's tasks ID@RUN
    status, body = run_dt.tc.call(run_dt.tc.c.request("POST", "/api/v1/tasks", json=noop("ok-1", priority=3)))
    assert status == 409 and "different body" in body["message"], body
    code, out, err = run_dt("submit", task_file(tmp_path, [noop("ok-1", priority=3)]), "--wait", "--progress", "off")
    changed = run_of(err)
    assert code == 0 and out.split() == [f"ok-1@{changed.removeprefix('run-')}"], (out, err)
    assert "already exists with a different body; this run's tasks are named ID@" in err
    assert run_dt.task(out.strip())["run_id"] == changed


def test_rerun_failed_runs_only_the_failed_task_under_a_new_run(run_dt: DT, tmp_path: Path) -> None:
    run_dt.tc.call(run_dt.tc.c.add_worker())
    doc = [noop("a"), sleep("b", 5, timeout_s=0.3)]
    code, _, err = run_dt("submit", task_file(tmp_path, doc, "suite.json"), "--wait", "--progress", "off")
    assert code == 1 and "(suite.json)" in err, err  # no CI variables: the file's name
    old = run_of(err)

    code, out, err = run_dt("rerun", old, "--failed", "--wait", "--progress", "off")
    new = run_of(err)
    assert new != old and code == 1, err  # b times out again
    derived = f"b@{new.removeprefix('run-')}"
    assert out.split() == [derived]
    detail = json.loads(run_dt("run", new)[1])
    assert [t["task_id"] for t in detail["tasks"]] == [derived] and detail["state"] == "failed"
    assert detail["labels"]["rerun_of"] == old and detail["name"] == "suite.json (re-run failed)"
    # a re-run of the re-run derives from the first id, not b@x@y; --name names it
    code, out, err = run_dt("rerun", new, "--failed", "--name", "third time")
    assert code == 0 and out.split() == [f"b@{run_of(err).removeprefix('run-')}"], (out, err)
    assert "(third time)" in err
    code, out, _ = run_dt("runs", "--limit", "1", "--json")
    assert [r["name"] for r in json.loads(out)["runs"]] == ["third time"]
    code, out, _ = run_dt("run", old, "--json")
    assert json.loads(out)["created_at"].endswith("Z")  # ISO 8601, as dt status --json


def test_cancel_run_and_another_keys_run_is_refused(run_dt: DT, tmp_path: Path) -> None:
    run_dt.tc.call(run_dt.tc.c.add_worker(max_concurrent_tasks=1))
    mine = run_dt.key("submitter")
    code, out, err = run_dt("submit", task_file(tmp_path, [sleep("p1", 30), sleep("p2", 30)]), key=mine)
    assert code == 0, err
    rid = run_of(err)
    deadline = time.monotonic() + 20
    while run_dt.task("p1")["state"] != "running":  # p1 runs; p2 waits for the one slot
        assert time.monotonic() < deadline, run_dt.task("p1")
        time.sleep(0.05)
    other = run_dt.key("submitter")
    code, out, err = run_dt("cancel", "--run", rid, key=other)
    assert code == 2 and "another key" in err, err
    code, out, err = run_dt("rerun", rid, key=run_dt.key("viewer"))
    assert code == 2 and "lacks permission 'tasks:submit'" in err, err
    code, out, err = run_dt("cancel", "--run", rid, key=mine)
    assert code == 0 and out.split() == ["p1:", "cancelled", "p2:", "cancelled"], (out, err)
    assert "2 task(s) cancelled, 0 had already finished" in err
    assert run_dt.task("p1")["state"] == "cancelled" and run_dt.task("p1")["run_id"] == rid
    assert run_dt.task("p2")["state"] == "cancelled" and run_dt.task("p2")["worker_id"] is None
    code, out, err = run_dt("cancel")
    assert code == 2 and "--run RUN" in err


def test_dashboard_url_flag_links_the_run_page(run_dt: DT, tmp_path: Path) -> None:
    code, _, err = run_dt("--dashboard-url", "https://ci.example/dash/", "submit", task_file(tmp_path, [noop("d1")]))
    assert code == 0, err
    rid = run_of(err)
    assert f": https://ci.example/dash/runs/{rid}" in err
    code, _, err = run_dt("submit", task_file(tmp_path, [noop("d2")]))  # neither: the REST path
    assert code == 0 and f": {run_dt.url}/api/v1/runs/{run_of(err)}" in err, err


def test_cancel_filters_pick_the_unfinished_tasks_that_match_them_all(run_dt: DT, tmp_path: Path) -> None:
    # no worker: every task waits, pending
    nightly = {"requirements": {"tags": ["nightly"]}}
    doc = task_file(tmp_path, [sleep("n1", 30, **nightly), noop("n2", **nightly), sleep("s1", 30),
                               sleep("n3", 30, **nightly)])
    code, _out, err = run_dt("submit", doc)
    assert code == 0, err
    rid = run_of(err)
    code, out, err = run_dt("cancel", "--tag", "nightly", "--type", "custom", "--state", "pending", "--run", rid)
    assert code == 0 and out.splitlines() == ["n1: cancelled", "n2: cancelled", "n3: cancelled"], (out, err)
    assert "3 unfinished task(s) match the filters" in err
    assert run_dt.task("s1")["state"] == "pending"  # no tag: left alone
    code, out, err = run_dt("cancel", "--tag", "nightly")  # nothing unfinished matches any more
    assert code == 0 and out == "" and "0 unfinished task(s) match" in err, (out, err)
    code, out, err = run_dt("cancel", "--submitted-by", "nobody-such")
    assert code == 0 and out == "", (out, err)
    code, out, err = run_dt("cancel", "--state", "done")
    assert code == 2 and "invalid choice: 'done'" in err, err
    code, out, err = run_dt("cancel")
    assert code == 2 and "name the tasks (TASK_ID ...), a run (--run RUN) or filters" in err, err
    code, out, err = run_dt("cancel", "--worker", "w-none", "s1")  # ids and filters together
    assert code == 0 and out.splitlines() == ["s1: cancelled"], (out, err)
