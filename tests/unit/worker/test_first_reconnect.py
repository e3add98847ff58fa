"""The first reconnect after an established session ended is jittered (uniform over at most a
second, never more than --reconnect-interval), so a restarted coordinator's fleet does not come
back in one millisecond; the very first connect waits for nothing."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from distributed_testing.config import WorkerConfig
from distributed_testing.testing import CPU_HARDWARE
from distributed_testing.worker.agent import WorkerAgent
from distributed_testing.worker.auth import Credentials
from distributed_testing.worker.result_store import MemoryResultStore
from distributed_testing.worker.session import FIRST_RECONNECT_SPREAD_S

pytestmark = pytest.mark.timeout(30)
URL = "http://127.0.0.1:9"


def agent(tmp: Path, interval: float) -> WorkerAgent:
    config = WorkerConfig(coordinator_url=URL, api_key="dtk_a_b", worker_id="w", test_root=tmp,
                          reconnect_interval_s=interval)
    return WorkerAgent(config, {}, MemoryResultStore(), CPU_HARDWARE, ["cpu"], Credentials(URL, api_key="dtk_a_b"))


async def sessions_and_waits(a: WorkerAgent, sessions: int) -> list[tuple[str, float]]:
    """Run ``a`` with every connect serving a session that ends at once; the log of connects and
    of the waits between them, until ``sessions`` sessions were served."""
    log: list[tuple[str, float]] = []

    async def connect_once() -> None:
        log.append(("connect", 0.0))
        if sum(1 for what, _ in log if what == "connect") >= sessions:
            a.stop()

    async def wait(delay: float) -> None:
        log.append(("wait", delay))

    a._connect_once = connect_once  # type: ignore[method-assign]
    a._backoff_sleep = wait  # type: ignore[method-assign]
    await asyncio.wait_for(a.run(), 10)
    return log


@pytest.mark.parametrize("interval", [5.0, 0.25])
def test_each_reconnect_after_a_served_session_waits_a_uniform_part_of_the_spread(tmp_path: Path,
                                                                                 interval: float) -> None:
    a = agent(tmp_path, interval)
    a.rng = random.Random(7)
    log = asyncio.run(sessions_and_waits(a, 200))
    assert log[0] == ("connect", 0.0)  # the first connect of a start is not delayed
    assert [what for what, _ in log] == ["connect"] + ["wait", "connect"] * 199
    waits = [d for what, d in log if what == "wait"]
    spread = min(FIRST_RECONNECT_SPREAD_S, interval)
    expect = random.Random(7)
    assert waits == [expect.uniform(0.0, spread) for _ in waits]  # the agent's own rng, drawn once per reconnect
    assert all(0.0 <= d <= spread for d in waits)
    assert min(waits) < spread * 0.1 and max(waits) > spread * 0.9  # spread over the whole range
