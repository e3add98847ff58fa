"""A confined pool child's scratch directory is removed off the event loop when the child is
replaced (pool.py ``_Child.reap``). It was removed on the loop: a task that left many files (a
source tree, a pip cache) and then timed out or was cancelled held the worker's whole event loop,
heartbeats and keepalive included, for as long as the removal took (seconds for a large tree,
longer than a worker's heartbeat TTL).

The check: while the tree is being removed, the loop goes on running (a coroutine here sees it
half removed). On the loop, it saw it only whole or gone."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import pytest
from probe_support import confined_pool

from distributed_testing.worker.executors import TaskContext
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

DIRS, FILES = 200, 100
HANDLER = '''
import pathlib, time

def run(parameters, ctx):
    work = pathlib.Path(ctx.work_dir)
    for i in range(parameters["dirs"]):
        d = work / f"d{i}"
        d.mkdir()
        for j in range(parameters["files"]):
            (d / f"f{j}").touch()
    (work / "done").touch()
    time.sleep(60)
    return {}
'''


async def test_a_replaced_childs_scratch_is_removed_while_the_loop_runs(tmp_path: Path) -> None:
    ex, confinement = await confined_pool(tmp_path, "tree", HANDLER)
    try:
        run = asyncio.create_task(ex.run(TaskContext("t1", 1, "custom", {
            "name": "tree", "parameters": {"dirs": DIRS, "files": FILES}}, timeout_s=100)))
        while not (done := list(confinement.scratch_root.glob("pool-*/work/done"))):
            assert not run.done(), run
            await asyncio.sleep(0.05)
        work = done[0].parent
        run.cancel()  # the child is killed and replaced; its scratch directory removed
        with contextlib.suppress(asyncio.CancelledError):
            await run
        seen: set[int] = set()
        while True:
            try:
                seen.add(os.stat(work).st_nlink - 2)  # its subdirectories left
            except FileNotFoundError:
                break
            await asyncio.sleep(0.002)
    finally:
        await ex.close()
    assert any(0 < n < DIRS for n in seen), sorted(seen)
