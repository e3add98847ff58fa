"""``/dev`` in a confined custom pool child (worker/confine.py, pool_child.py): the child serves
one task after another, and ``/dev/shm`` (and ``/dev`` itself, a tmpfs bwrap makes) would carry
files from one task to the next, as its scratch directory did before it was emptied after each
reply. ``/dev/shm`` is emptied too, the rest of ``/dev`` is read-only, and the device nodes still
work."""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_support import confined_pool, one_child_serves

from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

HANDLER = '''
import os

def run(parameters, ctx):
    found = sorted(os.listdir("/dev/shm"))
    with open(f"/dev/shm/{parameters['task']}", "w") as f:  # shared memory a task left behind
        f.write("for the next task")
    try:
        open("/dev/left-behind", "w").close()
        planted = "written"
    except OSError as exc:
        planted = exc.strerror
    with open("/dev/null", "w") as f:
        f.write("devices work")
    return {"found": found, "after": sorted(os.listdir("/dev/shm")), "planted": planted,
            "zero": open("/dev/zero", "rb").read(4).hex()}
'''


async def test_a_pool_childs_next_task_finds_nothing_in_dev(tmp_path: Path) -> None:
    ex, _ = await confined_pool(tmp_path, "shm", HANDLER)
    outputs = await one_child_serves(ex, "shm")
    for task, out in zip(("t1", "t2", "t3"), outputs, strict=True):
        assert out == {"found": [], "after": [task], "planted": "Read-only file system", "zero": "00000000"}
