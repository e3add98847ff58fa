"""A task's output is readable while it runs and kept, bounded, with its result: a real
coordinator and worker run a custom handler that prints a line, waits for a file, prints another;
``GET /api/v1/tasks/{id}/logs?follow=1`` and ``dt logs -f`` show the first line before the task
ends. A hand-driven worker's output for a task it does not hold is refused; a worker key may not
read logs."""

from __future__ import annotations

import asyncio
import functools
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import distributed_testing.testing as testing
from distributed_testing.protocol import messages as m
from distributed_testing.tasks.log import HEAD_BYTES, TAIL_BYTES
from distributed_testing.testing import next_message, raw_worker, run_cluster
from distributed_testing.worker.core.output import MAX_OUTPUT_BYTES

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90)]

HANDLERS = '''
import pathlib, sys, time

def print_wait(parameters, ctx):
    print("first line")
    go = pathlib.Path(parameters["go"])
    while not go.exists():
        time.sleep(0.02)
    print("second line", file=sys.stderr)
    return {}

def spew(parameters, ctx):
    for i in range(parameters["lines"]):
        print(f"line {i:07d} " + "x" * 90)
    return {"blob": "y" * parameters.get("blob", 0)}
'''


@pytest.fixture
def handlers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster's workers run ``print_wait`` and ``spew`` (in their pool children)."""
    (tmp_path / "dt_log_handlers.py").write_text(HANDLERS)
    monkeypatch.setattr(testing, "default_executors", functools.partial(
        testing.default_executors, custom_handlers={"print_wait": "dt_log_handlers:print_wait",
                                                    "spew": "dt_log_handlers:spew"},
        custom_pythonpath=[tmp_path]))


async def _follow_until(c: Any, task_id: str, needle: str) -> dict[str, Any]:
    """Follow the task's log from offset 0 until ``needle`` is in what was read; the last page,
    its ``text`` everything read."""
    offset, text = 0, ""
    while True:
        status, page = await c.request("GET", f"/api/v1/tasks/{task_id}/logs",
                                       params={"offset": str(offset), "follow": "1", "wait": "10"})
        assert status == 200, page
        text += page["text"]
        offset = page["next_offset"]
        if needle in text or page["complete"]:
            return {**page, "text": text}


def _dt(url: str, key: str, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "distributed_testing.cli.dt", "--coordinator", url, "--api-key",
                             key, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def test_a_running_tasks_output_is_followed_before_it_ends_and_kept_with_its_result(tmp_path, handlers):
    go = tmp_path / "go"
    async with run_cluster(tmp_path, workers=1) as c:
        [tid] = await c.submit({"type": "custom", "config": {"name": "print_wait", "parameters": {"go": str(go)}}})
        page = await _follow_until(c, tid, "first line")
        assert "first line" in page["text"] and not page["complete"], page  # it waits for go: still running
        assert page["source"] == "live" and page["state"] in ("assigned", "running") and page["elapsed_s"] >= 0

        follower = _dt(c.base_url, c.admin_key, "logs", "-f", tid)
        try:
            assert follower.stdout is not None
            first = await asyncio.to_thread(follower.stdout.readline)
            assert first == "first line\n"
            status, task = await c.request("GET", f"/api/v1/tasks/{tid}")
            assert task["state"] in ("assigned", "running")  # it waits for go: the line came while it runs
        except AssertionError:
            follower.kill()
            raise
        go.touch()
        out, err = await asyncio.to_thread(follower.communicate, timeout=60)
        assert follower.returncode == 0, err
        assert out == "second line\n", out

        status, final = await c.request("GET", f"/api/v1/tasks/{tid}/logs")
        assert status == 200 and final["complete"] and final["source"] == "result", final
        assert final["text"] == "first line\nsecond line\n" and final["state"] == "succeeded"
        task = await c.wait(tid)
        assert task["result"]["output"]["log"]["bytes"] == len("first line\nsecond line\n")
        assert len(c.runtime.logs) == 0  # the running copy went when the result was stored


async def test_a_long_output_is_kept_as_its_head_and_tail(tmp_path, handlers):
    async with run_cluster(tmp_path, workers=1) as c:
        [tid] = await c.submit({"type": "custom", "config": {"name": "spew", "parameters": {"lines": 20_000}}})
        task = await c.wait(tid, timeout=60)
        assert task["state"] == "succeeded", task
        status, page = await c.request("GET", f"/api/v1/tasks/{tid}/logs")
        assert status == 200
        written = 20_000 * 104
        assert page["bytes"] == written and page["next_offset"] == written
        assert page["text"].startswith("line 0000000 ") and page["text"].endswith(f"line {19_999:07d} {'x' * 90}\n")
        assert f"[... {written - HEAD_BYTES - TAIL_BYTES:,} bytes left out ...]" in page["text"]
        assert len(page["text"]) < HEAD_BYTES + TAIL_BYTES + 100
        status, tail = await c.request("GET", f"/api/v1/tasks/{tid}/logs", params={"offset": str(written - 104)})
        assert tail["text"] == f"line {19_999:07d} {'x' * 90}\n"


async def test_a_result_too_large_with_its_kept_output_is_stored_without_it(tmp_path, handlers):
    blob = MAX_OUTPUT_BYTES - 100_000  # fits alone; not with the 256 KiB kept of what it printed
    async with run_cluster(tmp_path, workers=1) as c:
        [tid] = await c.submit({"type": "custom", "config": {"name": "spew",
                                                             "parameters": {"lines": 5_000, "blob": blob}}})
        task = await c.wait(tid, timeout=60)
        assert task["state"] == "succeeded", task["outcome"]
        assert len(task["result"]["output"]["blob"]) == blob and "log" not in task["result"]["output"]


async def test_output_for_a_task_another_worker_holds_or_an_old_attempt_is_refused(tmp_path):
    async with run_cluster(tmp_path, workers=0) as c:
        key_a, key_b = await c.create_key("worker"), await c.create_key("worker")
        async with raw_worker(c.base_url, key_a, "wa", autoping=False) as (a, _), \
                raw_worker(c.base_url, key_b, "wb", autoping=False) as (b, _):
            [tid] = await c.submit({"type": "custom", "config": {"name": "noop"}})
            assign = await next_message(a, m.AssignTasks) if c.runtime.state.tasks[tid].worker_id == "wa" else \
                await next_message(b, m.AssignTasks)
            holder, other = (a, b) if c.runtime.state.tasks[tid].worker_id == "wa" else (b, a)
            ref = m.TaskRef(tid, assign.tasks[0].attempt)

            async def send(ws: Any, msg: m.Message) -> None:
                await ws.send_bytes(ws._dt_channel.seal(msg, time.time()))

            await send(other, m.TaskOutput([m.OutputChunk(ref, 0, b"not mine\n")]))
            refused = await next_message(other, m.ErrorMsg)
            assert refused.code == "output_refused" and "another worker" in refused.detail
            await send(holder, m.TaskOutput([m.OutputChunk(m.TaskRef(tid, ref.attempt + 1), 0, b"future\n")]))
            assert (await next_message(holder, m.ErrorMsg)).code == "output_refused"
            await send(holder, m.TaskOutput([m.OutputChunk(ref, 0, b"mine\n")]))
            page: dict[str, Any] = {}
            for _ in range(100):  # the frame is read in its own time: wait for it
                status, page = await c.request("GET", f"/api/v1/tasks/{tid}/logs")
                if page.get("text"):
                    break
                await asyncio.sleep(0.05)
            assert page["text"] == "mine\n" and page["source"] == "live", page
            assert c.runtime.stats["refused_output"] == 2

            status, body = await c.request("GET", f"/api/v1/tasks/{tid}/logs", key=key_a)  # a worker's key
            assert status == 403, body
            status, body = await c.request("GET", f"/api/v1/tasks/{tid}/logs", params={"offset": "-1"})
            assert status == 400 and body["errors"][0]["field"] == "offset"
            status, body = await c.request("GET", "/api/v1/tasks/nope/logs")
            assert status == 404
