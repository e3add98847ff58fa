"""A training task with a bundle: its launcher and ranks run in the sandbox, the model factory
imported from the bundle (allowed without ``--allow-model-modules``), the worker's files out of
reach; ``--task-network none`` leaves the ranks no rendezvous, so the task errors saying so."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from distributed_testing.bundles.upload import upload
from distributed_testing.testing import run_cluster
from distributed_testing.worker.executors.base import TaskContext
from distributed_testing.worker.executors.training import TrainingExecutor, TrainingOptions
from distributed_testing.worker.sandbox import Sandbox, available

pytest.importorskip("torch")
pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(240), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

FACTORY = """
from distributed_testing.training.models import mlp


def factory():
    try:
        open({secret!r}).read()
    except OSError:
        return mlp(in_features=8, hidden=8, depth=1)
    raise RuntimeError("the factory read the worker's secret")
"""
CONFIG = {"model": "shipped_model:factory", "nodes": 1, "nproc_per_node": 1, "batch_size": 4, "steps": 2,
          "warmup_steps": 0}


def shipped(tmp_path: Path, name: str, sandbox: Sandbox) -> TaskContext:
    bundle, scratch = tmp_path / name / "bundle", tmp_path / name / "scratch"
    bundle.mkdir(parents=True)
    scratch.mkdir()
    (bundle / "shipped_model.py").write_text(FACTORY.format(secret=str(tmp_path / "worker.key")))
    return TaskContext(name, 1, "training", CONFIG, timeout_s=120, bundle_root=bundle, scratch_dir=scratch,
                       sandbox=sandbox)


@pytest.mark.parametrize("mode", ["bwrap", "none"])
async def test_a_bundle_model_trains_in_the_sandbox(tmp_path: Path, mode: str) -> None:
    (tmp_path / "worker.key").write_text("secret")
    ex = TrainingExecutor(TrainingOptions(run_dir=tmp_path / "runs", interface="lo"))
    try:
        outcome = await ex.run(shipped(tmp_path, "t", Sandbox(mode=mode, network="loopback")))
    finally:
        await ex.close()
    if mode == "bwrap":
        assert outcome.status == "succeeded", (outcome.error, Path(outcome.output["log_path"]).read_text()[-3000:])
        assert outcome.output["metrics"]
    else:  # unconfined, the same factory reads the file: the check is not vacuous
        assert outcome.status == "failed", outcome
        assert "the factory read the worker's secret" in Path(outcome.output["log_path"]).read_text()


async def test_no_network_leaves_the_ranks_no_rendezvous(tmp_path: Path) -> None:
    ex = TrainingExecutor(TrainingOptions(run_dir=tmp_path / "runs", interface="lo"))
    try:
        outcome = await ex.run(shipped(tmp_path, "n", Sandbox(network="none")))
    finally:
        await ex.close()
    assert outcome.status == "error" and "--task-network none" in str(outcome.error), outcome


async def test_a_two_node_gang_trains_a_bundle_model_across_sandboxes(tmp_path: Path) -> None:
    """Two --accept-bundles workers with --task-network host each fetch the bundle and run their
    node in bwrap; the ranks meet across the two sandboxes."""
    (tmp_path / "worker.key").write_text("secret")
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "shipped_model.py").write_text(FACTORY.format(secret=str(tmp_path / "worker.key")))
    overrides = {"interface": "lo", "accept_bundles": True, "sandbox": "bwrap", "task_network": "host"}
    async with run_cluster(tmp_path / "c", workers=2, worker_overrides=overrides) as c:
        code = await c.create_key("submitter", allow_code=True)
        digest = await asyncio.to_thread(upload, c.base_url, code, bundle)
        [tid] = await c.submit({"type": "training", "timeout_s": 150, "bundle": digest,
                                "config": {**CONFIG, "nodes": 2, "load_balance": "none"}}, key=code)
        done = await c.wait(tid, timeout=170)
    assert done["state"] == "succeeded", done["outcome"]
    metrics = done["result"]["output"]["metrics"]
    assert (metrics["nnodes"], metrics["world_size"]) == (2, 2)
