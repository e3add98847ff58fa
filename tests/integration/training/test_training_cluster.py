"""Multi-node training end to end: a real coordinator and two in-process workers over loopback
sockets, the coordinator's gang reservation and rendezvous, real gloo ranks in child processes.

Assertions read task state and results, and wait on conditions, never on durations.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import psutil
import pytest

from distributed_testing.cli.report import training_fields
from distributed_testing.testing import Cluster, run_cluster, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]
WORKER_MODULE = "distributed_testing.training.worker_main"


def training(nodes: int, **extra: Any) -> dict[str, Any]:
    config = {"model": "mlp", "nodes": nodes, "nproc_per_node": 1, "batch_size": 16,
              "steps": 4, "warmup_steps": 1, "load_balance": "none", **extra}
    return {"type": "training", "timeout_s": 120, "config": config}


def training_processes(root: Path) -> list[psutil.Process]:
    """Live launcher/rank processes whose command line names a path under ``root`` (the workers'
    warm custom-handler children name it too, in their sandbox's binds: they are not training's)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if str(root) in cmd and "pool_child" not in cmd and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def ranks(root: Path) -> list[psutil.Process]:
    return [p for p in training_processes(root)
            if WORKER_MODULE in (cmd := " ".join(p.info["cmdline"] or [])) and "torch.distributed.run" not in cmd]


async def running(c: Cluster, task_id: str, root: Path, world: int) -> None:
    """Wait until the task runs on its gang and all ``world`` ranks exist."""
    async def state() -> str:
        status, body = await c.request("GET", f"/api/v1/tasks/{task_id}")
        assert status == 200, body
        return str(body["state"])

    for _ in range(6000):
        if await state() in ("succeeded", "failed", "error", "cancelled", "timed_out"):
            pytest.fail(f"task {task_id} ended before all its ranks ran: {await c.wait(task_id, 1)}")
        if len(ranks(root)) == world:
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"task {task_id} never had {world} ranks running")


@pytest.mark.timeout(150)
async def test_two_node_gloo_training_succeeds_with_scaling_efficiency(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="distributed_testing.coordinator.ws")  # it logs progress messages
    async with run_cluster(tmp_path, workers=2, worker_overrides={"interface": "lo"}) as c:
        [single] = await c.submit(training(1))
        one = await c.wait(single, timeout=120)
        assert one["state"] == "succeeded", one["outcome"]
        assert one["result"]["output"]["metrics"]["nnodes"] == 1

        [multi] = await c.submit(training(2))
        two = await c.wait(multi, timeout=120)
    assert two["state"] == "succeeded", two["outcome"]
    output = two["result"]["output"]
    metrics = output["metrics"]
    assert (metrics["nnodes"], metrics["world_size"], metrics["backend"]) == (2, 2, "gloo")
    assert [r["node_rank"] for r in metrics["ranks"]] == [0, 1]
    assert output["global_samples_per_s"] == metrics["global_samples_per_s"] > 0
    assert sorted(n["worker_id"] for n in output["nodes"]) == ["w0", "w1"]
    assert all(n["status"] == "succeeded" for n in output["nodes"])
    expected = (metrics["global_samples_per_s"] / 2) / one["result"]["output"]["metrics"]["global_samples_per_s"]
    assert output["scaling_efficiency"] == pytest.approx(expected, rel=1e-4)
    assert output["scaling_baseline"]["task_id"] == single
    assert not training_processes(tmp_path)
    # rank 0's progress reached the coordinator as progress messages
    assert any(r.getMessage().startswith(f"progress {multi} 100%") for r in caplog.records)
    # and dt results reads the combined row
    assert training_fields(output) == {
        "model": "mlp", "nodes": 2, "world_size": 2, "backend": "gloo", "load_balance": "none",
        "global_samples_per_s": metrics["global_samples_per_s"], "scaling_efficiency": output["scaling_efficiency"]}


@pytest.mark.timeout(150)
async def test_cancelling_a_running_gang_stops_every_rank_on_both_workers(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=2, worker_overrides={"interface": "lo"}) as c:
        [tid] = await c.submit(training(2, steps=1_000_000, warmup_steps=0))
        await running(c, tid, tmp_path, world=2)
        status, _ = await c.request("POST", f"/api/v1/tasks/{tid}/cancel")
        assert status == 200
        task = await c.wait(tid, timeout=30)
        assert task["state"] == "cancelled"
        await wait_for(lambda: not training_processes(tmp_path), timeout=30, what="every training process to exit")
        await wait_for(lambda: all(not a.running for a in c.agents), timeout=30, what="both workers to be idle")


@pytest.mark.timeout(150)
async def test_a_killed_rank_ends_the_gang_and_leaves_no_training_process(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=2, worker_overrides={"interface": "lo"}) as c:
        [tid] = await c.submit(training(2, steps=1_000_000, warmup_steps=0))
        await running(c, tid, tmp_path, world=2)
        victim = ranks(tmp_path)[0]
        victim.kill()
        task = await c.wait(tid, timeout=60)
        # both nodes report a retryable error (max_retries 0: the task ends), with the reason
        assert task["state"] == "error", task["outcome"]
        error = task["outcome"]["error"]
        assert "a local rank was killed by signal 9" in error or "a peer node or the network failed" in error
        await wait_for(lambda: not training_processes(tmp_path), timeout=30, what="every training process to exit")
