"""Process helpers and limit supervision shared by the executors."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from distributed_testing.errors import ExecutionError
from distributed_testing.worker.executors.custom import parse_custom_config
from distributed_testing.worker.executors.proc import (
    OutputTail,
    describe_exit,
    kill_process_group,
    pid_alive,
    process_tree_rss,
)
from distributed_testing.worker.executors.supervise import MemoryWatch, run_limited
from distributed_testing.worker.executors.test import resolve_test_path

pytestmark = pytest.mark.timeout(30)


def test_output_tail_keeps_the_last_bytes() -> None:
    tail = OutputTail(limit=10)
    for chunk in (b"abc", b"defgh", b"ijklmnop", b"q"):
        tail.feed(chunk)
    assert tail.text() == "hijklmnopq"
    assert tail.total_bytes == 17
    tail.feed(b"\xff")
    assert tail.text().endswith("\ufffd")


def test_describe_exit() -> None:
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(-9) == "killed by SIGKILL (exit code -9)"


def test_kill_process_group_and_rss() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.run(['sleep', '60'])"],
        start_new_session=True,
    )
    try:
        assert process_tree_rss(proc.pid) > 0
        assert kill_process_group(proc.pid) is True
        assert proc.wait(timeout=10) == -9
    finally:
        kill_process_group(proc.pid)
    assert not pid_alive(proc.pid)
    # the killed ``sleep`` stays in the group as a zombie until init reaps it (a while on a loaded
    # machine), and a signal to a zombie succeeds: the group is gone once it is reaped
    deadline = time.monotonic() + 10
    while kill_process_group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kill_process_group(proc.pid) is False


def test_run_limited_verdicts() -> None:
    async def value() -> int:
        return 5

    async def scenario():
        done = await run_limited(value(), timeout_s=5)
        forever = asyncio.get_running_loop().create_future()
        timed_out = await run_limited(forever, timeout_s=0.01)
        return done, timed_out, forever.cancelled()

    done, timed_out, cancelled = asyncio.run(scenario())
    assert (done.verdict, done.value) == ("done", 5)
    assert timed_out.verdict == "timed_out" and cancelled


def test_run_limited_propagates_errors() -> None:
    async def broken() -> None:
        raise ValueError("inner")

    with pytest.raises(ValueError, match="inner"):
        asyncio.run(run_limited(broken(), timeout_s=None))


def test_memory_watch_fires_on_this_process_and_stops_on_exit() -> None:
    async def scenario():
        watch = MemoryWatch(os.getpid(), limit_mb=1, interval_s=0.01)
        forever = asyncio.get_running_loop().create_future()
        limited = await run_limited(forever, timeout_s=10, watch=watch)
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
        await proc.wait()
        gone = await MemoryWatch(proc.pid, limit_mb=1).wait_exceeded()
        return limited, watch, gone

    limited, watch, gone = asyncio.run(scenario())
    assert limited.verdict == "memory"
    assert watch.peak_mb > 1 and watch.describe_exceeded().startswith("memory limit of 1 MB exceeded")
    assert gone is False
    with pytest.raises(ValueError):
        MemoryWatch(1, limit_mb=0)


def test_test_path_resolution(tmp_path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "test_a.py").write_text("")
    assert resolve_test_path(tmp_path, "sub/test_a.py::test_x") == "sub/test_a.py::test_x"
    assert resolve_test_path(tmp_path, str(tmp_path / "sub" / "test_a.py")) == "sub/test_a.py"
    assert resolve_test_path(tmp_path, "sub") == "sub"


def test_custom_config_validation() -> None:
    assert parse_custom_config({"name": "noop"}) == ("noop", {})
    for bad, message in [({}, "name"), ({"name": "x", "parameters": []}, "must be an object")]:
        with pytest.raises(ExecutionError, match=message):
            parse_custom_config(bad)
