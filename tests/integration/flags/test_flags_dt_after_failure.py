"""What a CI user does after a red build, with ``dt`` against a real coordinator (issue 38): read
the wait's summary (a result for every kind, the failing test by name), the JUnit traceback with
file and line, ``dt status`` in a person's format on a terminal (JSON elsewhere and with
``--json``), cancel several tasks at once, and stop a wait with Ctrl-C (a real ``dt`` process
sent SIGINT) knowing what keeps running and how to cancel it."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shlex
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from flags_support import DT_VARS, ROOT, refusing_port, worker_config
from test_flags_dt_cli import DT, noop, run_dt, sleep, summary_rows, task_file, unrunnable

from distributed_testing.cli import dt, submit
from distributed_testing.cli import worker as worker_cli

__all__ = ["run_dt"]  # the fixture, re-exported for this module's tests
pytestmark = pytest.mark.timeout(90)

RED = '''import pytest

def test_a():
    assert True

def test_b():
    assert 1 == 2, "one is not two"

def test_c():
    pytest.skip("not today")
'''


def dt_process(url: str, key: str, *argv: str, **popen: object) -> subprocess.Popen[str]:
    """``dt`` as its own process (``python -m``), with none of the developer's DT_* variables."""
    env = {k: v for k, v in os.environ.items() if k not in DT_VARS}
    return subprocess.Popen([sys.executable, "-m", "distributed_testing.cli.dt", "--coordinator", url, "--api-key", key,
                             *argv], env=env, cwd=ROOT, text=True, **popen)  # type: ignore[call-overload]


def on_a_terminal(url: str, key: str, *argv: str) -> str:
    """What ``dt ARGV`` prints with its stdout on a terminal (a pseudo-terminal read to its end)."""
    leader, follower = pty.openpty()
    proc = dt_process(url, key, *argv, stdout=follower, stderr=subprocess.PIPE)
    os.close(follower)
    chunks = []
    try:
        while select.select([leader], [], [], 60)[0]:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the process closed the terminal's last writer
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stderr:
            proc.stderr.close()
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_cancel_takes_several_ids_reports_each_and_exits_2_for_an_unknown_one_after_the_rest(
        run_dt: DT, tmp_path: Path) -> None:
    assert run_dt("submit", task_file(tmp_path, [unrunnable(f"x-{i}") for i in range(4)]))[0] == 0
    assert run_dt("cancel", "x-0")[:2] == (0, "x-0: cancelled\n")

    code, out, err = run_dt("cancel", "x-1", "x-2")
    assert (code, out) == (0, "x-1: cancelled\nx-2: cancelled\n"), err

    code, out, err = run_dt("cancel", "x-0", "no-such-task", "x-3")  # the unknown id does not stop the rest
    assert code == 2, err
    assert out == "x-0: cancelled\nx-3: cancelled\n"
    assert "dt: nothing cancelled: task x-0 had already finished (cancelled)" in err
    assert "dt: no-such-task: HTTP 404" in err
    assert [run_dt.task(f"x-{i}")["state"] for i in range(4)] == ["cancelled"] * 4


def test_the_wait_summary_junit_and_status_say_what_ran_and_what_failed_where(run_dt: DT, tmp_path: Path) -> None:
    run_dt.tc.call(run_dt.tc.c.add_worker())
    (tmp_path / "test_red.py").write_text(RED)
    junit = tmp_path / "report.xml"
    tasks = [{"task_id": "red", "type": "test", "config": {"test_file": "test_red.py"}},
             sleep("slept", 0.05), noop("quiet")]
    code, _, err = run_dt("submit", task_file(tmp_path, tasks), "--junit", str(junit), "--progress", "off")
    assert code == 1, err
    run_line, err = err.split("\n", 1)  # the run it made (test_flags_dt_runs.py), then the summary
    assert run_line.startswith("run run-"), run_line

    # RESULT for every kind, as dt results words it; ERROR names the failing test
    header = err.splitlines()[0]
    rows = summary_rows(err)
    result = {task: line[header.index("RESULT"):header.index("ERROR")].strip()
              for task, line in ((r.split()[0], r) for r in err.splitlines()[1:] if r.split())}
    assert result["red"] == "1 passed, 1 failed, 1 skipped", err
    assert re.fullmatch(r"slept_s=0\.\d+", result["slept"]), err
    assert result["quiet"] == "ok", err
    assert " ".join(rows["red"]).endswith("1 of 3 tests failed: test_red.py::test_b"), err
    assert rows["slept"][-1] == rows["quiet"][-1] == "-"

    # the JUnit failure carries the traceback with the file and line, as pytest's --junitxml does
    [failure] = ET.parse(junit).getroot().iter("failure")
    assert failure.get("message") == "AssertionError: one is not two"
    assert '>       assert 1 == 2, "one is not two"' in (failure.text or "")
    assert "test_red.py:7: AssertionError" in (failure.text or ""), failure.text

    # dt status: JSON where stdout is no terminal (scripts), the person's format on one
    code, out, _ = run_dt("status", "red")
    assert code == 0 and json.loads(out)["result"]["output"]["tests"][1]["nodeid"] == "test_red.py::test_b"
    shown = on_a_terminal(run_dt.url, run_dt.admin, "status", "red")
    lines = shown.splitlines()
    assert lines[:2] == ["task       red (test)", "state      failed, attempt 1"], shown
    assert "result     1 passed, 1 failed, 1 skipped" in lines and "error      1 of 3 tests failed" in lines, shown
    assert "  test_red.py::test_b: AssertionError: one is not two [test_red.py:7]" in lines, shown
    assert "keywords" not in shown and len(lines) < 20, shown
    assert json.loads(on_a_terminal(run_dt.url, run_dt.admin, "status", "red", "--json"))["task_id"] == "red"
    code, out, _ = run_dt("status", "quiet", "--text")
    assert code == 0 and "result     ok" in out.splitlines() and "failed tests" not in out, out


def test_ctrl_c_during_the_wait_says_what_keeps_running_and_how_to_cancel_it(run_dt: DT, tmp_path: Path) -> None:
    doc = task_file(tmp_path, [unrunnable("wait-1"), unrunnable("ci/wait-2")])
    proc = dt_process(run_dt.url, run_dt.admin, "submit", doc, "--wait", "--progress", "plain",
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        announced = proc.stderr.readline()
        assert announced.startswith("run run-")  # the run it made
        run_id = announced.split()[1]
        seen = [proc.stderr.readline() for _ in range(2)]  # the wait's first poll: it is waiting now
        assert all("no connected worker can run it" in line for line in seen), seen
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err  # 128 + SIGINT, as a shell reports it (was -2 with a traceback)
    assert dt.EXIT_INTERRUPTED == 130
    assert out.split("\n") == ["wait-1", "ci/wait-2", ""]
    [line] = err.splitlines()  # one line, no traceback
    assert line.startswith("dt: interrupted; 2 task(s) keep running (or waiting) on the coordinator; "), line
    command = line.split("cancel them with: ", 1)[1]
    assert command == f"dt cancel --run {run_id}"  # the run holds them all
    assert [run_dt.task(t)["state"] for t in ("wait-1", "ci/wait-2")] == ["pending", "pending"]  # still queued
    code, out, err = run_dt(*shlex.split(command)[1:])  # the command it printed does cancel them
    assert code == 0 and sorted(out.splitlines()) == ["ci/wait-2: cancelled", "wait-1: cancelled"], err
    # without a run (or for tasks that stayed in an earlier run) the line names the ids
    assert submit.interrupted_line(["a", "b c"]).endswith("cancel them with: dt cancel a 'b c'")
    assert submit.interrupted_line(["a", "b"], run_id, ["b"]).endswith(f"dt cancel --run {run_id} and dt cancel b")
    assert submit.interrupted_line(["b"], run_id, ["b"]).endswith("cancel them with: dt cancel b")


def test_a_worker_that_never_reached_a_coordinator_exits_1_with_one_line_saying_so(
        fast_hardware: None, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{refusing_port()}"  # nothing listens there
    argv = ["--coordinator", url, "--api-key", "dtk_a_b", "--reconnect-attempts", "2", "--reconnect-interval", "0.05"]
    worker_config(argv)  # a valid configuration: what follows is the connects running out
    assert worker_cli.main(argv) == 1
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("dt-worker: ")]
    assert len(said) == 1, said
    assert said[0].startswith(f"dt-worker: gave up after 2 attempts (--reconnect-attempts): no coordinator was ever "
                              f"reached at {url} (last error: Cannot connect to host"), said
    assert said[0].endswith("check --coordinator (DT_COORDINATOR_URL) and that the coordinator runs")
    help_text = worker_cli.build_parser().format_help()
    assert "exit status:" in help_text and "1  gave up connecting" in help_text and "2  could not start" in help_text
