"""Benchmark tasks with ``"cache": true`` through a real cluster: an identical config on the same
environment fingerprint is answered from the worker's result cache (in memory, or in its DuckDB
file with a db path, where it survives a restart) without measuring again."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from distributed_testing.errors import StoreError
from distributed_testing.testing import Cluster, run_cluster, wait_for
from distributed_testing.worker.bench_cache import CacheEntry
from distributed_testing.worker.executors.base import TaskContext
from distributed_testing.worker.executors.benchmark import BenchmarkExecutor, BenchmarkOptions

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(180)]

FAST = {"model": "mlp", "tiny": True, "iterations": 3, "warmup": 1, "min_duration_s": 0.01}


def bench(task_id: str, cache: bool = True, **cfg: Any) -> dict[str, Any]:
    return {"task_id": task_id, "type": "benchmark", "cache": cache, "config": {"batch_sizes": [1, 2], **FAST, **cfg}}


async def run(c: Cluster, *docs: dict[str, Any]) -> list[dict[str, Any]]:
    ids = await c.submit(list(docs))
    done = [await c.wait(i, timeout=120) for i in ids]
    assert [t["state"] for t in done] == ["succeeded"] * len(done), [t["outcome"] for t in done]
    return [t["result"]["output"] for t in done]


async def test_identical_config_comes_from_the_cache_and_others_are_measured(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=1, batch_wait_s=0.5) as c:
        (first,) = await run(c, bench("first", name="run one"))
        (again,) = await run(c, bench("again", name="run two"))
        assert first["from_cache"] is False and "cached_from_task" not in first
        assert again["from_cache"] is True and again["cached_from_task"] == "first"
        assert again["cached_at"] >= 0 and again["name"] == "run two"
        assert again["batch_results"] == first["batch_results"]
        assert again["environment"]["fingerprint_hash"] == first["environment"]["fingerprint_hash"]

        (other_size,) = await run(c, bench("other-size", batch_sizes=[4]))
        (uncached,) = await run(c, bench("uncached", cache=False))
        assert other_size["from_cache"] is False and [b["batch_size"] for b in other_size["batch_results"]] == [4]
        assert uncached["from_cache"] is False and uncached["batch_results"] != first["batch_results"]

        # one batch (same model): the stored config is answered from the cache, the new one measured
        hit, miss = await run(c, bench("hit-in-batch"), bench("miss-in-batch", batch_sizes=[3]))
        assert hit["from_cache"] is True and hit["cached_from_task"] == "uncached"  # the newest measurement
        assert hit["batch_results"] == uncached["batch_results"]
        assert miss["from_cache"] is False and [b["batch_size"] for b in miss["batch_results"]] == [3]
        status, task = await c.request("GET", "/api/v1/tasks/miss-in-batch")
        assert status == 200 and "in batch-" in task["history"][1]["cause"]


async def test_cache_in_the_worker_db_survives_a_worker_restart(tmp_path: Path) -> None:
    db_path = tmp_path / "worker" / "w0.duckdb"
    async with run_cluster(tmp_path, workers=0, batch_wait_s=0.0) as c:
        await c.add_worker(worker_id="w0", name="w0", db_path=db_path)
        (first,) = await run(c, bench("before-restart"))
        c.agents[0].stop()
        await c.agent_tasks[0]
        await wait_for(lambda: "w0" not in c.runtime.sessions, what="w0 to disconnect")

        await c.add_worker(worker_id="w0", name="w0", db_path=db_path)
        (after,) = await run(c, bench("after-restart"))
        assert after["from_cache"] is True and after["cached_from_task"] == "before-restart"
        assert after["batch_results"] == first["batch_results"]


class BrokenCache:
    async def get(self, keys: Sequence[str]) -> dict[str, CacheEntry]:
        raise StoreError("cache disk gone")

    async def put(self, entries: Sequence[CacheEntry]) -> None:
        raise StoreError("cache disk gone")


async def test_a_failing_cache_is_logged_and_the_task_is_measured(caplog: pytest.LogCaptureFixture) -> None:
    executor = BenchmarkExecutor(BenchmarkOptions(cache_models=True), cache=BrokenCache())
    ctx = TaskContext("t1", 1, "benchmark", {"batch_sizes": [1], **FAST}, timeout_s=60, cache=True)
    with caplog.at_level(logging.ERROR, logger="distributed_testing.worker.executors.benchmark"):
        try:
            outcome = await executor.run(ctx)
        finally:
            await executor.close()
    assert outcome.status == "succeeded" and outcome.output["from_cache"] is False, outcome.error
    assert "lookup failed" in caplog.text and "storing 1 benchmark result(s) in the cache failed" in caplog.text
