"""``dt-worker --enable-swap``: free swap is memory overflow. With it the memory a worker offers to
tasks (``--memory-buffer``) and its ``--max-memory-percent`` count RAM + swap, so a task whose
``max_memory_mb`` only fits with swap goes to that worker; without it swap counts for nothing.
Where it would change nothing (no memory limit, no swap) it is refused at start.

The machine's swap is replaced by a made-up reading (``psutil.swap_memory``), so the test does not
depend on the swap this machine has; RAM readings and everything else are real.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil
import pytest
from flags_support import StartWorker, worker_config

from distributed_testing.errors import ConfigError
from distributed_testing.testing import Cluster, run_cluster, wait_for

pytestmark = [pytest.mark.timeout(60)]
MIB = 1024 * 1024
SWAP_MB = 64 * 1024


@pytest.fixture
def swap(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``psutil.swap_memory()`` reports ``[total, used]`` bytes (64 GiB, none used, unless changed)."""
    reading = [SWAP_MB * MIB, 0]
    kind = type(psutil.swap_memory())

    def fake() -> Any:
        total, used = reading
        return kind(total=total, used=used, free=total - used, percent=100.0 * used / total if total else 0.0,
                    sin=0, sout=0)

    monkeypatch.setattr(psutil, "swap_memory", fake)
    return reading


async def cli(c: Cluster, *argv: str) -> list[str]:
    return ["--coordinator", c.base_url, "--api-key", await c.create_key("worker"), "--heartbeat-interval", "0.2",
            *argv]


@pytest.mark.asyncio
async def test_enable_swap_offers_free_swap_to_tasks_and_heartbeats_report_swap_use(
        tmp_path: Path, start_cli_worker: StartWorker, swap: list[int]) -> None:
    swap[1] = 16 * 1024 * MIB  # 25 % of the swap in use
    async with run_cluster(tmp_path, workers=0) as c:
        await start_cli_worker(c, await cli(c, "--worker-id", "ram", "--memory-buffer", "0.1"))
        await start_cli_worker(c, await cli(c, "--worker-id", "swap", "--memory-buffer", "0.1", "--enable-swap"))
        workers = c.runtime.state.workers
        await wait_for(lambda: all("available_memory_mb" in workers[w].load for w in ("ram", "swap")),
                       what="both workers' memory offers")
        ram, with_swap = (workers[w].load for w in ("ram", "swap"))
        assert ram["swap_percent"] == with_swap["swap_percent"] == 25.0  # reported either way
        extra = with_swap["available_memory_mb"] - ram["available_memory_mb"]
        free_swap = SWAP_MB - 16 * 1024
        assert abs(extra - (free_swap - 0.1 * SWAP_MB)) < 1024, extra  # free swap minus its share of the buffer

        needs = int(ram["available_memory_mb"] + 20 * 1024)  # fits only where swap counts
        [tid] = await c.submit({"type": "custom", "config": {"name": "noop"}, "max_memory_mb": needs})
        task = await c.wait(tid, timeout=30)
        assert (task["state"], task["outcome"]["worker_id"]) == ("succeeded", "swap"), task


def test_enable_swap_is_refused_where_it_would_change_nothing(swap: list[int]) -> None:
    with pytest.raises(ConfigError, match="^--enable-swap: counts swap in --memory-buffer and --max-memory-percent"):
        worker_config(["--enable-swap"])
    assert worker_config(["--enable-swap", "--max-memory-percent", "90"]).enable_swap
    assert worker_config(["--enable-swap", "--profile", "benchmark"]).enable_swap  # the profile's memory buffer
    assert not worker_config(["--memory-buffer", "0.2"]).enable_swap
    swap[0] = swap[1] = 0
    with pytest.raises(ConfigError, match=r"^--enable-swap: this machine has no swap space \(swap total is 0 bytes\)"):
        worker_config(["--memory-buffer", "0.2", "--enable-swap", "--cache-models"])  # the worker guide's line
