"""What a shipped run leaves in its writable paths never turns the worker's own file work against
the host: the worker reads a task's report and launcher files without following a link or
opening a FIFO the task put there, and hands its writable paths to the task's user without
following a link a ``./dir`` package's build left in the scratch directory.

Each attack was seen to work before its fix (a root worker chmod'ed a directory of the host to
0777, read a root-only file back into the task's result, and blocked its event loop on a FIFO).
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import threading
from pathlib import Path

import pytest

from distributed_testing.bundles.upload import upload
from distributed_testing.testing import run_cluster
from distributed_testing.worker import sandbox as sb

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(240), pytest.mark.slow,
              pytest.mark.skipif(sb.available() is not None, reason=f"no sandbox here: {sb.available()}")]

# The shipped test swaps the report file the worker reads afterwards: a FIFO (the worker would
# block on it), or a link to a file only the worker may read (it would send it back as results).
SWAP = """import os, sys

def test_swaps_its_report():
    report = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--dt-report="))
    os.unlink(report)
    if {fifo!r}:
        os.mkfifo(report)
    else:
        os.symlink({secret!r}, report)
    os._exit(0)
"""
SECRET_LINE = {"kind": "collect", "outcome": "error", "nodeid": "worker-secret", "longrepr": "worker-secret"}


def _watch_fifo(state: Path, stop: threading.Event, opened: list[str]) -> None:
    """Whether the worker ever opens the task's FIFO for reading: a non-blocking open for writing
    succeeds only while a reader has it open (and lets that reader go on: it reads an end)."""
    while not stop.is_set():
        for fifo in state.glob(f"bundles-*/tasks/*/{sb.SCRATCH_NAME}/dt-pytest-*/report.jsonl"):
            try:
                if not stat.S_ISFIFO(os.lstat(fifo).st_mode):
                    continue
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                continue
            opened.append(str(fifo))
            os.close(fd)
        stop.wait(0.05)


async def test_a_swapped_report_is_neither_followed_nor_waited_on(tmp_path: Path) -> None:
    from distributed_testing.worker.executors import pytest_report

    assert pytest_report.REPORT_OPTION == "--dt-report"
    secret = tmp_path / "secret.jsonl"
    secret.write_text(json.dumps(SECRET_LINE) + "\n")
    secret.chmod(0o600)
    state = tmp_path / "state"
    opened: list[str] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_fifo, args=(state, stop, opened), daemon=True)
    watcher.start()
    try:
        async with run_cluster(tmp_path / "c", workers=0) as c:
            await c.add_worker(accept_bundles=True, db_path=state / "outbox.duckdb")
            code = await c.create_key("submitter", allow_code=True)
            done = {}
            for name, fifo in (("link", False), ("fifo", True)):
                bundle = tmp_path / name
                bundle.mkdir()
                (bundle / "test_swap.py").write_text(SWAP.format(fifo=fifo, secret=str(secret)))
                digest = await asyncio.to_thread(upload, c.base_url, code, bundle)
                [tid] = await c.submit({"type": "test", "config": {"test_file": "test_swap.py"}, "bundle": digest},
                                       key=code)
                done[name] = await c.wait(tid, timeout=90)
    finally:
        stop.set()
        watcher.join()
    assert not opened, f"the worker opened the task's FIFO {opened}"
    for name, d in done.items():
        assert d["state"] == "error", (name, d)  # the task's, and the worker went on
        assert "worker-secret" not in json.dumps(d), (name, d)
        assert "report" in str((d["outcome"] or {}).get("error")), (name, d)


BUILD_PLANTS_A_LINK = """import os
link = os.path.join(os.environ["HOME"], "victim")
if not os.path.lexists(link):  # setup.py runs once for the metadata, once for the wheel
    os.symlink({victim!r}, link)
from setuptools import setup
setup()
"""
PYPROJECT = """[project]
name = "mypkg"
version = "0.1"
"""
HANDLER = """def run(parameters, ctx):
    return {"ran": True}
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root worker hands its paths to another user")
async def test_a_link_left_in_the_scratch_directory_is_not_followed_when_it_is_handed_over(tmp_path: Path) -> None:
    """A ``./mypkg`` build (the submitter's code) runs before the task in the task's scratch
    directory; a link it leaves there to a host directory must not make that directory the task's."""
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    bundle = tmp_path / "b"
    (bundle / "mypkg" / "mypkg").mkdir(parents=True)
    (bundle / "mypkg" / "mypkg" / "__init__.py").write_text("")
    (bundle / "mypkg" / "pyproject.toml").write_text(PYPROJECT)
    (bundle / "mypkg" / "setup.py").write_text(BUILD_PLANTS_A_LINK.format(victim=str(victim)))
    (bundle / "requirements.txt").write_text("./mypkg\n")
    (bundle / "handler.py").write_text(HANDLER)
    async with run_cluster(tmp_path / "c", workers=0) as c:
        await c.add_worker(accept_bundles=True, task_network="none", db_path=tmp_path / "state" / "outbox.duckdb")
        code = await c.create_key("submitter", allow_code=True)
        digest = await asyncio.to_thread(upload, c.base_url, code, bundle)
        [tid] = await c.submit({"type": "custom", "config": {"name": "handler:run"}, "bundle": digest}, key=code)
        done = await c.wait(tid, timeout=180)
    assert (done["outcome"] or {}).get("status") == "succeeded", json.dumps(done)[-3000:]  # the link was there
    st = victim.stat()
    assert (st.st_mode & 0o7777, st.st_uid) == (0o700, 0), oct(st.st_mode)


# A bundle's model factory runs in the ranks, which own the run directory: it swaps the launcher
# log, which the worker reads back into the task's error when the ranks fail.
SWAPPING_FACTORY = """import os, sys

def factory():
    log = sys.argv[sys.argv.index("--result-path") + 1] + ".node0.log"
    os.unlink(log)
    os.symlink({secret!r}, log)
    raise RuntimeError("the ranks fail, so the worker reads the log")
"""


async def test_a_training_ranks_link_in_the_run_directory_is_not_followed(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from distributed_testing.worker.executors.base import TaskContext
    from distributed_testing.worker.executors.training import TrainingExecutor, TrainingOptions

    secret = tmp_path / "worker.key"
    secret.write_text("worker-secret\n")
    secret.chmod(0o600)
    bundle, scratch = tmp_path / "bundle", tmp_path / "scratch"
    bundle.mkdir()
    scratch.mkdir()
    (bundle / "shipped_model.py").write_text(SWAPPING_FACTORY.format(secret=str(secret)))
    config = {"model": "shipped_model:factory", "nodes": 1, "nproc_per_node": 1, "batch_size": 4, "steps": 2,
              "warmup_steps": 0}
    ex = TrainingExecutor(TrainingOptions(run_dir=tmp_path / "runs", interface="lo"))
    try:
        outcome = await ex.run(TaskContext("t", 1, "training", config, timeout_s=120, bundle_root=bundle,
                                           scratch_dir=scratch, sandbox=sb.Sandbox(network="loopback")))
    finally:
        await ex.close()
    assert outcome.status in ("failed", "error"), outcome
    assert "worker-secret" not in json.dumps([outcome.error, outcome.output]), outcome.error
    assert "launcher log cannot be read" in str(outcome.error), outcome.error
