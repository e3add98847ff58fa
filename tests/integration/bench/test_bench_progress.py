"""A running benchmark's progress (worker/executors/benchmark.py, bench/child.py): the child reports
each measured batch size before its reply, and the executor hands each report to the task it
belongs to, in a batch of tasks sharing one child as well, as ``TaskContext.progress``."""

from __future__ import annotations

import re

import pytest

from distributed_testing.worker.executors import TaskContext
from distributed_testing.worker.executors.benchmark import BenchmarkExecutor

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120), pytest.mark.slow]

FAST = {"model": "mlp", "tiny": True, "device": "cpu", "warmup": 1, "iterations": 2, "min_duration_s": 0.0}
LINE = re.compile(r"^mlp b(\d+) (fp32|int8): \d+\.\d+ ms \((\d) of (\d)\)$")


async def test_each_batch_size_is_reported_to_its_own_task_as_it_finishes() -> None:
    heard: dict[str, list[tuple[float, str]]] = {"a": [], "b": []}

    def ctx(task_id: str, **config: object) -> TaskContext:
        return TaskContext(task_id, 1, "benchmark", {**FAST, **config}, timeout_s=60,
                           progress=lambda fraction, line: heard[task_id].append((fraction, line)))

    ex = BenchmarkExecutor()
    try:
        outcomes = await ex.run_batch([ctx("a", batch_sizes=[1, 4, 8]), ctx("b", batch_sizes=[2], precision="int8")])
    finally:
        await ex.close()
    assert [o.status for o in outcomes] == ["succeeded", "succeeded"], [o.error for o in outcomes]
    assert [f for f, _ in heard["a"]] == pytest.approx([1 / 3, 2 / 3, 1.0]) and [f for f, _ in heard["b"]] == [1.0]
    parsed = {t: [LINE.match(line).groups() for _, line in lines] for t, lines in heard.items()}  # type: ignore[union-attr]
    assert parsed["a"] == [("1", "fp32", "1", "3"), ("4", "fp32", "2", "3"), ("8", "fp32", "3", "3")]
    assert parsed["b"] == [("2", "int8", "1", "1")]
    median = outcomes[0].output["batch_results"][1]["latency_ms"]["median"]
    figure = f"{median:.2f}" if median >= 1 else f"{median:.3f}"  # rounded as the line rounds it, not cut
    assert f": {figure} ms" in heard["a"][1][1]  # the line's figure is the batch size's median
