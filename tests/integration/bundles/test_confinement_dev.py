"""``/dev`` in a confined custom pool child (worker/confine.py, pool_child.py): the child serves
one task after another, and ``/dev/shm`` (and ``/dev`` itself, a tmpfs bwrap makes) would carry
files from one task to the next, as its scratch directory did before it was emptied after each
reply. ``/dev/shm`` is emptied too, the rest of ``/dev`` is read-only, and the device nodes still
work."""

from __future__ import annotations

from pathlib import Path

import pytest

from distributed_testing.config import WorkerConfig
from distributed_testing.worker import confine
from distributed_testing.worker.executors import CustomExecutor, TaskContext
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
    handlers = tmp_path / "handlers"
    handlers.mkdir()
    (handlers / "op_shm.py").write_text(HANDLER)
    (tmp_path / "root").mkdir()
    config = WorkerConfig(worker_id="w0", db_path=tmp_path / "state" / "outbox.duckdb", test_root=tmp_path / "root")
    (tmp_path / "state").mkdir()
    ex = CustomExecutor(1, handlers={"shm": "op_shm:run"}, pythonpath=[handlers], use_entry_points=False,
                        confinement=confine.for_worker(config, tmp_path / "state" / "cache"))
    await ex.start()
    outputs = []
    try:
        [pid] = ex.pool.pids
        for task in ("t1", "t2", "t3"):
            outcome = await ex.run(TaskContext(task, 1, "custom", {"name": "shm", "parameters": {"task": task}},
                                               timeout_s=60))
            assert outcome.status == "succeeded", outcome
            outputs.append(outcome.output)
        assert ex.pool.pids == [pid]  # one child served them all
    finally:
        await ex.close()
    for task, out in zip(("t1", "t2", "t3"), outputs, strict=True):
        assert out == {"found": [], "after": [task], "planted": "Read-only file system", "zero": "00000000"}
