"""A confined pool child empties its scratch directory and ``/dev/shm`` after each task
(pool_child.ScratchWatch), also where a task left a directory it cannot write to: a read-only
tree is an ordinary thing to leave (Go's module cache is 0555, an unpacked archive keeps its
modes), or made its own ``work_dir`` read-only. ``shutil.rmtree(ignore_errors=True)`` could not remove the files in it and said nothing,
so the next task, of another submitter, found them in its ``work_dir`` and ``/dev/shm``."""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_support import confined_pool, one_child_serves

from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

HANDLER = '''
import os, pathlib

def run(parameters, ctx):
    task = parameters["task"]
    tops = {"work": pathlib.Path(ctx.work_dir), "shm": pathlib.Path("/dev/shm")}
    found = {name: sorted(os.listdir(top)) for name, top in tops.items()}
    for top in tops.values():
        cache = top / f"modcache-{task}" / "pkg"  # read-only, as Go leaves its module cache
        cache.mkdir(parents=True)
        (cache / "secret.txt").write_text(task)
        cache.chmod(0o555)
        cache.parent.chmod(0o555)
        locked = top / f"locked-{task}"  # not even listable
        locked.mkdir()
        (locked / "secret.txt").write_text(task)
        locked.chmod(0)
        top.chmod(0o555)  # and the directories the next task is given
    tops["work"].parent.chmod(0o555)
    return found
'''


async def test_a_read_only_tree_a_task_left_is_gone_for_the_next(tmp_path: Path) -> None:
    ex, _ = await confined_pool(tmp_path, "ro", HANDLER)
    outputs = await one_child_serves(ex, "ro")
    assert outputs == [{"work": [], "shm": []}] * 3
