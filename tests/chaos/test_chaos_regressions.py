"""Focused tests for bugs the chaos scenarios exposed (each names the scenario that found it)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path

import pytest

from distributed_testing.config import WorkerConfig
from distributed_testing.coordinator.core.rows import Snapshot
from distributed_testing.coordinator.core.state import CoordinatorState
from distributed_testing.protocol import messages as m
from distributed_testing.tasks import spec as specs
from distributed_testing.testing import CPU_HARDWARE, refusing_port, wait_for
from distributed_testing.worker.agent import WorkerAgent
from distributed_testing.worker.auth import Credentials
from distributed_testing.worker.result_store import MemoryResultStore

pytestmark = pytest.mark.timeout(60)


def unreachable_agent(tmp: Path) -> WorkerAgent:
    url = f"http://127.0.0.1:{refusing_port()}"  # nothing listens: every connect is refused
    config = WorkerConfig(coordinator_url=url, api_key="dtk_a_b", worker_id="orphan", test_root=tmp,
                          reconnect_interval_s=30.0, reconnect_attempts=5)
    return WorkerAgent(config, {}, MemoryResultStore(), CPU_HARDWARE, ["cpu"], Credentials(url, api_key="dtk_a_b"))


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["stop", "drain"])
async def test_a_worker_in_reconnect_backoff_stops_at_once(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                           how: str) -> None:
    """Scenario b (coordinator kills): workers SIGTERMed while their coordinator was down sat out
    their reconnect backoff (up to 36 s) after "drain complete" before exiting, so a service
    manager's stop timeout killed them. ``stop()`` and ``drain()`` now end the backoff."""
    agent = unreachable_agent(tmp_path)
    caplog.set_level(logging.WARNING, logger="distributed_testing.retry")
    run = asyncio.create_task(agent.run())
    try:
        await wait_for(lambda: "retrying in" in caplog.text, timeout=20, what="the first failed connect")
        t0 = time.monotonic()
        if how == "drain":
            await asyncio.wait_for(agent.drain("SIGTERM"), 10)
        else:
            agent.stop()
        await asyncio.wait_for(run, 10)  # the backoff is 30 s: this fails without the fix
        assert time.monotonic() - t0 < 10
        assert caplog.text.count("retrying in") == 1, "a stopped worker tried to connect again"
    finally:
        run.cancel()


def test_an_assignment_lost_in_a_coordinator_crash_costs_no_retry() -> None:
    """Scenario b (coordinator kills): a task whose ``assign`` was durable but had not reached the
    worker when the coordinator was SIGKILLed ended as ``error`` ("worker restarted without this
    task") with max_retries 0, although it never ran. After a restart an attempt that was only
    ``assigned`` (never confirmed started) and that its worker does not have is requeued without
    using a retry; one the worker had started still costs one."""
    reg = m.Register(worker_id="w", name="w", protocol_version=m.PROTOCOL_VERSION, hardware={},
                     capabilities=["cpu"], tags=[], max_concurrent=2)
    before = CoordinatorState()
    before.register(reg, "s1", 100.0, key_id="k")
    docs = [{"task_id": tid, "type": "custom", "config": {"name": "noop"}} for tid in ("sent", "unsent")]
    before.submit(specs.parse_task_json(json.dumps(docs).encode()), 100.0)
    assert {t.state for t in before.tasks.values()} == {"assigned"}
    before.started("w", m.TaskStarted([m.TaskRef("sent", 1)], 100.1), 100.1)
    snap = Snapshot(tasks=[t.row() for t in before.tasks.values()], workers=[w.row() for w in before.workers.values()])

    after = CoordinatorState()  # the restarted coordinator; the worker comes back without either task
    after.restore(snap, 101.0)
    after.register(reg, "s2", 102.0, key_id="k")
    unsent, sent = after.tasks["unsent"], after.tasks["sent"]
    assert (unsent.retries_used, unsent.state, unsent.attempt) == (0, "assigned", 2)  # dispatched again
    assert any(h["cause"] == "assignment lost in a coordinator restart" for h in unsent.history)
    assert (sent.state, sent.outcome and sent.outcome["error"]) == ("error", "worker restarted without this task")
