"""The operator's own tasks (no bundle) in the worker's deny-list confinement (worker/confine.py):
a test under ``--test-root`` run by a real worker, and a custom handler from an allowed module in
the worker's warm pool, try to read the worker's key file, outbox and ``/proc/<worker pid>/environ``,
another task's scratch directory, and to write the worker's state directory. Every attempt fails,
while they read their test root and write their scratch directory; with ``--sandbox none`` the same
reads succeed (the probes are not vacuous)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from probe_support import PRELUDE

from distributed_testing.config import WorkerConfig
from distributed_testing.testing import run_cluster, wait_for
from distributed_testing.worker import confine
from distributed_testing.worker.executors import CustomExecutor, TaskContext
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

TEST_PROBE = '''
import os, pathlib, tempfile
''' + PRELUDE + '''
def test_reaches_nothing_of_the_worker():
    assert pathlib.Path("fixture.txt").read_text() == "operator data"  # its test root
    scratch = pathlib.Path(tempfile.gettempdir())
    (scratch / "written.txt").write_text("ok")
    assert (scratch / "written.txt").read_text() == "ok"
    assert blocked(lambda: open(KEY).read()), "read the worker's key file"
    assert blocked(lambda: open(OUTBOX, "rb").read()), "read the worker's outbox"
    assert blocked(lambda: open(OTHER).read()), "read another running task's file"
    assert blocked(lambda: open(f"/proc/{{PID}}/environ", "rb").read()), "read the worker's environment"
    assert blocked(lambda: open(os.path.join(STATE, "planted"), "w").write("x")), "wrote the worker's state dir"
    assert blocked(lambda: pathlib.Path("planted.txt").write_text("x")), "wrote its test root"
'''
HOLDER = '''
import pathlib, tempfile, time

def test_hold():
    (pathlib.Path(tempfile.gettempdir()) / "mine.txt").write_text("secret")
    time.sleep(60)
'''

HANDLER = '''
import os, pathlib
''' + PRELUDE + '''
def run(parameters, ctx):
    """The test probe's attempts from the operator's handler in the worker's pool."""
    work = ctx.work_dir or pathlib.Path(parameters["work"])  # unconfined handlers get none
    seen = sorted(str(p.relative_to(work.parent)) for p in work.parent.rglob("*") if p.is_file())
    (work / "written.txt").write_text("ok")
    (work.parent / "left-behind.txt").write_text("for the next task")
    attempts = {{
        "read the worker's key file": lambda: open(KEY).read(),
        "read the worker's outbox": lambda: open(OUTBOX, "rb").read(),
        "read another running task's file": lambda: open(OTHER).read(),
        "read the worker's environment": lambda: open(f"/proc/{{PID}}/environ", "rb").read(),
        "wrote the worker's state dir": lambda: open(os.path.join(STATE, "planted"), "w").write("x"),
        "wrote its handler's directory": lambda: open(os.path.join(parameters["root"], "planted"), "w").write("x"),
    }}
    reached = [what for what, attempt in attempts.items() if not blocked(attempt)]
    return {{"root": pathlib.Path(parameters["root"], "fixture.txt").read_text(),
            "scratch": (work / "written.txt").read_text(), "seen": seen, "reached": reached}}
'''


def _key_file(tmp_path: Path, key: str) -> Path:
    keys = tmp_path / "keys"
    keys.mkdir(exist_ok=True)
    (keys / "worker.key").write_text(key)
    return keys / "worker.key"


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
async def test_an_operator_test_reaches_nothing_of_the_worker(tmp_path: Path, sandbox: str) -> None:
    state = tmp_path / "state"
    state.mkdir()
    async with run_cluster(tmp_path / "c", workers=0) as c:
        root = tmp_path / "c"  # the workers' --test-root
        (root / "fixture.txt").write_text("operator data")
        (root / "test_holder_op.py").write_text(HOLDER)
        key = await c.create_key("worker")
        key_file = _key_file(tmp_path, key)
        await c.add_worker(api_key=key, api_key_file=key_file, sandbox=sandbox, max_concurrent_tasks=2,
                           db_path=state / "outbox.duckdb")
        other = str(key_file)  # unconfined, the probe stops at the key file before it needs another task
        holder = None
        if sandbox == "bwrap":
            [holder] = await c.submit({"type": "test", "config": {"test_file": "test_holder_op.py"}})
            await wait_for(lambda: any(state.glob("scratch-w0/*/tmp/mine.txt")), timeout=60,
                           what="the holder to start")
            other = str(next(state.glob("scratch-w0/*/tmp/mine.txt")))
        values = {"key": str(key_file), "outbox": str(state / "outbox.duckdb"), "state": str(state),
                  "other": other, "pid": os.getpid(), "port": 0}
        (root / "test_probe_op.py").write_text(textwrap.dedent(TEST_PROBE.format(**values)))
        [tid] = await c.submit({"type": "test", "config": {"test_file": "test_probe_op.py"}})
        done = await c.wait(tid, timeout=60)
        if holder is not None:
            await c.request("POST", f"/api/v1/tasks/{holder}/cancel")
    outcome = done["outcome"] or {}
    if sandbox == "bwrap":
        assert outcome.get("status") == "succeeded", (done.get("result") or {}).get("output", {}).get("stdout_tail")
        assert not (state / "planted").exists() and not (root / "planted.txt").exists()
    else:  # unconfined: the first forbidden read succeeds, so the probe fails there
        assert outcome.get("status") == "failed", done
        assert "read the worker's key file" in str(done.get("result") or done)


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
async def test_an_operator_custom_handler_reaches_nothing_of_the_worker(tmp_path: Path, sandbox: str) -> None:
    """The warm pool's child is started in the confinement once and serves one task after another,
    each in a fresh scratch directory that holds nothing of the task before."""
    state, handlers = tmp_path / "state", tmp_path / "handlers"
    state.mkdir()
    handlers.mkdir()
    (handlers / "fixture.txt").write_text("operator data")
    (state / "outbox.duckdb").write_bytes(b"the worker's results")
    key_file = _key_file(tmp_path, "dtk_secret")
    config = WorkerConfig(worker_id="w0", db_path=state / "outbox.duckdb", api_key_file=key_file,
                          test_root=tmp_path, sandbox=sandbox)
    confinement = confine.for_worker(config, state / "outbox-cache")
    assert (confinement is None) == (sandbox == "none")
    other = tmp_path / "other"
    if confinement is not None:
        other = confinement.scratch("other-task")
    (other.mkdir(exist_ok=True), (other / "mine.txt").write_text("secret"))
    values = {"key": str(key_file), "outbox": str(state / "outbox.duckdb"), "state": str(state),
              "other": str(other / "mine.txt"), "pid": os.getpid(), "port": 0}
    (handlers / "op_probe.py").write_text(HANDLER.format(**values))
    ex = CustomExecutor(1, cache_dir=state / "outbox-cache", handlers={"probe": "op_probe:run"},
                        pythonpath=[handlers], use_entry_points=False, confinement=confinement)
    await ex.start()
    try:
        (tmp_path / "unconfined" / "work").mkdir(parents=True)
        parameters = {"root": str(handlers), "work": str(tmp_path / "unconfined" / "work")}
        ctx = TaskContext("t1", 1, "custom", {"name": "probe", "parameters": parameters}, timeout_s=60)
        first = await ex.run(ctx)
        second = await ex.run(ctx)  # the child emptied its directory after the first reply...
        third = await ex.run(ctx)  # ... and, having watched it since, after the second
        [pid] = ex.pool.pids
    finally:
        await ex.close()
    assert first.status == second.status == third.status == "succeeded", (first, second, third)
    for out in (first.output, second.output, third.output):
        assert (out["root"], out["scratch"]) == ("operator data", "ok")
    if sandbox == "bwrap":
        assert first.output["reached"] == second.output["reached"] == []
        assert second.output["seen"] == third.output["seen"] == []  # the task before left nothing
        assert not (state / "planted").exists() and not (handlers / "planted").exists()
        assert list((state / "scratch-w0").iterdir()) == [other]  # the pool child's directory went with it
    else:
        assert "read the worker's key file" in first.output["reached"]
        assert "read the worker's environment" in first.output["reached"]
    assert pid > 0
