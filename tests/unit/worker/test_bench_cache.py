"""The benchmark result cache key and the in-memory cache (pure: no child, no socket)."""

from __future__ import annotations

import asyncio

import pytest

from distributed_testing.worker.bench_cache import CacheEntry, MemoryResultCache, cache_key

pytestmark = pytest.mark.timeout(30)

CFG = {"model": "mlp", "batch_sizes": [1, 4], "tiny": True, "optimize_for": "latency"}
RUNNER = {"mixed_precision": False}


def test_key_ignores_key_order_and_the_free_text_name() -> None:
    key = cache_key(CFG, "abc", RUNNER)
    assert key == cache_key(dict(reversed(list(CFG.items()))), "abc", RUNNER)
    assert key == cache_key({**CFG, "name": "a label"}, "abc", RUNNER)
    assert len(key) == 64 and int(key, 16) >= 0


@pytest.mark.parametrize(
    ("config", "fingerprint", "runner"),
    [
        ({**CFG, "batch_sizes": [2]}, "abc", RUNNER),
        ({**CFG, "optimize_for": "throughput"}, "abc", RUNNER),
        ({k: v for k, v in CFG.items() if k != "tiny"}, "abc", RUNNER),
        (CFG, "abd", RUNNER),
        (CFG, "abc", {"mixed_precision": True}),
    ],
)
def test_anything_that_changes_the_measurement_changes_the_key(config, fingerprint, runner) -> None:
    assert cache_key(config, fingerprint, runner) != cache_key(CFG, "abc", RUNNER)


def test_memory_cache_returns_stored_entries_and_newest_wins() -> None:
    async def scenario() -> tuple[dict[str, CacheEntry], dict[str, CacheEntry], int]:
        cache = MemoryResultCache()
        await cache.put([CacheEntry("k", "fp", CFG, {"v": 1}, "t1", 1.0)])
        first = await cache.get(["k", "other"])
        await cache.put([CacheEntry("k", "fp", CFG, {"v": 2}, "t2", 2.0)])
        return first, await cache.get(["k"]), len(cache)

    first, second, size = asyncio.run(scenario())
    assert list(first) == ["k"] and first["k"].result == {"v": 1} and first["k"].task_id == "t1"
    assert second["k"].result == {"v": 2} and second["k"].task_id == "t2" and size == 1
