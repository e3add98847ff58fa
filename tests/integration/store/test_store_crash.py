"""Crash recovery: a real process appends, prints "acked" once the store acknowledged, and is
killed with SIGKILL at once (mid-append, often mid-checkpoint). Everything acknowledged must be
there on reopen."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from distributed_testing.coordinator.store.base import ResultQuery
from distributed_testing.coordinator.store.duckdb import DuckDBStore

pytestmark = pytest.mark.timeout(30)

REPO = Path(__file__).resolve().parents[3]
N = 300

CHILD = r"""
import asyncio, sys
from pathlib import Path
from distributed_testing.coordinator.core.rows import KeyRow, MetaRow, ResultRow, TaskRow, WorkerRow
from distributed_testing.coordinator.store.duckdb import DuckDBStore

def task(task_id, state):
    return TaskRow(task_id, "benchmark", state, 1, 0, 1.0, 2.0, "d", {"config": {"model": "bert"}})

async def main(path, n, interval):
    store = DuckDBStore(Path(path), checkpoint_interval_s=interval, checkpoint_max_records=50)
    await store.open()
    await store.append([WorkerRow("w1", "box", {}, [], [], 1.0, 1.0, "idle"), KeyRow("k1", "ci", "admin", "h", 1.0)])
    await asyncio.gather(*(store.append([task(f"t{i}", "queued")]) for i in range(n)))
    await asyncio.gather(*(store.append([task(f"t{i}", "completed"),
                                         ResultRow(f"t{i}", 1, "w1", "completed", 1.0, 2.0, float(i), {"i": i})])
                           for i in range(n)))
    await store.append([MetaRow("phase", "acked")])
    print("acked", flush=True)
    i = 0
    while True:  # unacknowledged traffic until the kill; checkpoints keep running
        store.append([task(f"x{i}", "queued")])
        i += 1
        if i % 20 == 0:
            await asyncio.sleep(0)

asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
"""


def _run_and_kill(path: Path, interval: float) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), str(N), str(interval)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=10)
    assert line == b"acked\n", err.decode()
    assert proc.returncode == -signal.SIGKILL


async def _check_everything_acked_is_there(path: Path) -> None:
    store = DuckDBStore(path)
    snap = await store.open()
    try:
        states = {t.task_id: t.state for t in snap.tasks}
        assert all(states[f"t{i}"] == "completed" for i in range(N))
        assert [w.worker_id for w in snap.workers] == ["w1"] and [k.key_id for k in snap.keys] == ["k1"]
        assert snap.meta["phase"] == "acked"
        rows = await store.query_results(ResultQuery(worker_id="w1", limit=10 * N))
        assert sorted(r.output["i"] for r in rows) == list(range(N))
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_sigkill_during_checkpoints_loses_nothing_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "c.duckdb"
    _run_and_kill(path, interval=0.005)
    await _check_everything_acked_is_there(path)


@pytest.mark.asyncio
async def test_sigkill_before_any_checkpoint_then_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "c.duckdb"
    _run_and_kill(path, interval=60.0)
    segments = sorted((tmp_path / "c.duckdb.journal").glob("*.log"))
    assert segments
    with segments[-1].open("ab") as f:  # a write the kill tore in half
        f.write(b"\x40\x00\x00\x00\x12\x34")
    await _check_everything_acked_is_there(path)
