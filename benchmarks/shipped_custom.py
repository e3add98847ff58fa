"""What a custom task with a bundle pays for its own sandboxed child (issue 26 §2): the same tiny
``module:function`` handler run through ``CustomExecutor`` in a fresh child per task, inside bwrap
and with ``--sandbox none``, against a built-in ``noop`` answered by the worker's warm shared pool.
Each figure is the median (and minimum) of ``--repeat`` tasks, run in turn.

    python benchmarks/shipped_custom.py [--repeat 9]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from distributed_testing.worker.executors.base import TaskContext
from distributed_testing.worker.executors.custom import CustomExecutor
from distributed_testing.worker.sandbox import Sandbox, available


async def _timed(ex: CustomExecutor, ctxs: list[TaskContext]) -> list[float]:
    times = []
    for ctx in ctxs:
        start = time.perf_counter()
        outcome = await ex.run(ctx)
        times.append(time.perf_counter() - start)
        if outcome.status != "succeeded":
            raise SystemExit(f"task {ctx.task_id}: {outcome.status}: {outcome.error}")
    return times


async def main(repeat: int) -> None:
    ex = CustomExecutor(1, use_entry_points=False)
    await ex.start()
    modes = ["none"] + (["bwrap"] if available() is None else [])
    with tempfile.TemporaryDirectory() as tmp:
        bundle, scratch = Path(tmp) / "bundle", Path(tmp) / "scratch"
        bundle.mkdir()
        scratch.mkdir()
        (bundle / "h.py").write_text("def run(parameters, ctx):\n    return {'ok': True}\n")
        rows = []
        for mode in modes:
            ctxs = [TaskContext(task_id=f"{mode}{i}", attempt=1, type="custom", config={"name": "h:run"},
                                bundle_root=bundle, scratch_dir=scratch, sandbox=Sandbox(mode=mode))
                    for i in range(repeat)]
            rows.append((f"bundle handler, own child, --sandbox {mode}", await _timed(ex, ctxs)))
        pooled = [TaskContext(task_id=f"p{i}", attempt=1, type="custom", config={"name": "noop"}) for i in range(repeat)]
        rows.append(("built-in noop, warm shared pool", await _timed(ex, pooled)))
    await ex.close()
    print("| custom task | median s | min s |\n|---|---|---|")
    for name, times in rows:
        print(f"| {name} | {statistics.median(times):.4f} | {min(times):.4f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    asyncio.run(main(parser.parse_args().repeat))
