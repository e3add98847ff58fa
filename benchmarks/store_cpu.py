"""CPU a DuckDB store spends per task on its write path: appends (journal form and encoding) and
checkpoints (Arrow conversion, upserts, updates), in one process, no sockets (issue 30 §5).

Each task of ``N`` takes the core's four rows (pending, assigned, running, succeeded, each a
new row sharing the spec and the earlier history entries, as ``Task.row`` makes them) and one
result. ``split=False``: one checkpoint after everything (a task's rows fold into one); ``split=True``:
a checkpoint after the submissions, then one after the rest (a task's later rows reach a stored
row: the cluster's shape when tasks queue across checkpoints). Reports the median of 3 runs of
``time.process_time`` per task for appends and for checkpoints. Run it from each checkout to
compare (``cd <checkout> && .venv/bin/python benchmarks/store_cpu.py``).
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from distributed_testing.coordinator.core.rows import ResultRow, TaskRow
from distributed_testing.coordinator.store.duckdb import DuckDBStore

SPEC = {"type": "custom", "config": {"name": "noop"}, "priority": 0, "max_retries": 0, "timeout_s": 3600.0}
N = 5000
STEPS = (("assigned", "dispatched to w1"), ("running", "started on w1"), ("succeeded", "result from w1"))
OUTCOME = {"status": "succeeded", "attempt": 1, "worker_id": "w1", "error": None, "duration_s": 0.0}


def row(i: int, state: str, history: list[dict[str, Any]], **kw: Any) -> TaskRow:
    return TaskRow(f"t{i}", "custom", state, kw.pop("attempt", 0), 0, 1.0, 2.0, "sha256:x", SPEC,
                   history=list(history), seq=i, **kw)


async def one(split: bool) -> tuple[float, float]:
    """(append, checkpoint) CPU µs per task."""
    tmp = Path(tempfile.mkdtemp(prefix="dt-store-cpu-"))
    store = DuckDBStore(tmp / "c.duckdb", checkpoint_interval_s=600, checkpoint_max_records=10**9)
    await store.open()
    appending = checkpointing = 0.0
    try:
        hists = [[{"at": 1.0, "from": None, "to": "pending", "cause": "submitted", "attempt": 0}] for _ in range(N)]
        rows = [row(i, "pending", h) for i, h in enumerate(hists)]
        c = time.process_time()
        for k in range(0, N, 500):
            store.append(rows[k : k + 500])
        appending += time.process_time() - c
        if split:
            c = time.process_time()
            await store.checkpoint()
            checkpointing += time.process_time() - c
        for state, cause in STEPS:
            recs: list[Any] = []
            for i, h in enumerate(hists):
                h.append({"at": 2.0, "from": h[-1]["to"], "to": state, "cause": cause, "attempt": 1, "worker_id": "w1"})
                if state == "succeeded":
                    recs.append(ResultRow(f"t{i}", 1, "w1", "succeeded", 1.0, 2.0, 3.0, {"x": 1}))
                recs.append(row(i, state, h, attempt=1, worker_id="w1",
                                outcome=OUTCOME if state == "succeeded" else None))
            c = time.process_time()
            for r in recs:
                store.append([r])
            appending += time.process_time() - c
        c = time.process_time()
        await store.checkpoint()
        checkpointing += time.process_time() - c
    finally:
        await store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return appending / N * 1e6, checkpointing / N * 1e6


async def main() -> None:
    for split in (False, True):
        runs = [await one(split) for _ in range(3)]
        print(f"split={split}: append {statistics.median(r[0] for r in runs):.1f} us/task, "
              f"checkpoint {statistics.median(r[1] for r in runs):.1f} us/task")


if __name__ == "__main__":
    asyncio.run(main())
