"""The worker's training executor driven directly: real launches on loopback, hand-made gang
assignments (what the coordinator would send), a killed rank, a cancel, exclusivity.

Assertions wait on conditions (progress reported, processes gone), never on durations.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from distributed_testing.protocol.messages import GangAssignment
from distributed_testing.testing import free_port, wait_for
from distributed_testing.worker.executors import default_executors
from distributed_testing.worker.executors.base import ExecOutcome, TaskContext
from distributed_testing.worker.executors.benchmark import BenchmarkExecutor
from distributed_testing.worker.executors.training import TrainingExecutor, TrainingOptions

pytestmark = pytest.mark.asyncio
WORKER_MODULE = "distributed_testing.training.worker_main"
LONG_RUN = {"model": "mlp", "nodes": 2, "nproc_per_node": 1, "batch_size": 16,
            "steps": 1_000_000, "warmup_steps": 0}


def context(config: dict[str, Any], *, gang: GangAssignment | None = None, timeout_s: float | None = 120.0,
            progress: Any = None, task_id: str = "train-1") -> TaskContext:
    return TaskContext(task_id=task_id, attempt=1, type="training", config=config, timeout_s=timeout_s,
                       gang=gang, progress=progress)


def gang(node_rank: int, port: int, nnodes: int = 2) -> GangAssignment:
    return GangAssignment(node_rank=node_rank, nnodes=nnodes, master_addr="127.0.0.1", master_port=port,
                          all_cuda=False, members=[f"w{r}" for r in range(nnodes)])


def executor(tmp_path: Path, name: str) -> TrainingExecutor:
    return TrainingExecutor(TrainingOptions(run_dir=tmp_path / name, interface="lo"))


def training_processes(root: Path) -> list[psutil.Process]:
    """Every live process of a training launch whose files are under ``root`` (torch agents and
    ranks carry their result path on the command line), wherever it was reparented."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(root) in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def ranks_of(root: Path) -> list[psutil.Process]:
    return [p for p in training_processes(root) if WORKER_MODULE in " ".join(p.info["cmdline"] or [])
            and "torch.distributed.run" not in " ".join(p.info["cmdline"] or [])]


class Progress:
    def __init__(self) -> None:
        self.reports: list[tuple[float, str]] = []

    def __call__(self, fraction: float, message: str) -> None:
        self.reports.append((fraction, message))


@pytest.mark.timeout(90)
async def test_single_node_without_gang_runs_on_loopback_and_reports_progress(tmp_path: Path) -> None:
    progress = Progress()
    ex = executor(tmp_path, "w0")
    config = {"model": "mlp", "nodes": 1, "batch_size": 8, "steps": 4, "warmup_steps": 1}
    try:
        outcome = await ex.run(context(config, progress=progress))
    finally:
        await ex.close()
    assert outcome.status == "succeeded", outcome.error
    out = outcome.output
    assert (out["node_rank"], out["nnodes"], out["backend"]) == (0, 1, "gloo")
    assert out["master"].startswith("127.0.0.1:")
    assert out["metrics"]["world_size"] == 1 and out["metrics"]["global_samples_per_s"] > 0
    assert Path(out["log_path"]).is_relative_to(tmp_path / "w0" / "train-1-a1")
    assert progress.reports and progress.reports[-1][0] == 1.0
    assert not training_processes(tmp_path)


async def test_several_nodes_without_a_gang_is_a_clear_non_retryable_error(tmp_path: Path) -> None:
    outcome = await executor(tmp_path, "w0").run(context({**LONG_RUN, "steps": 2}))
    assert outcome.status == "error" and outcome.output["retryable"] is False
    assert "2 nodes need a gang assignment from the coordinator" in (outcome.error or "")
    assert not (tmp_path / "w0").exists(), "nothing is launched"


async def test_nodes_disagreeing_with_the_gang_is_a_config_error(tmp_path: Path) -> None:
    outcome = await executor(tmp_path, "w0").run(context({**LONG_RUN, "nodes": 3}, gang=gang(1, free_port())))
    assert outcome.status == "error" and outcome.output["retryable"] is False
    assert "config says 3 nodes, assignment 2" in (outcome.error or "")


async def test_unreachable_master_fails_the_preflight_as_retryable(tmp_path: Path) -> None:
    ex = TrainingExecutor(TrainingOptions(run_dir=tmp_path / "w1", interface="lo", preflight_timeout_s=0.5))
    outcome = await ex.run(context(LONG_RUN, gang=gang(1, free_port())))
    assert outcome.status == "error" and outcome.output["retryable"] is True
    assert "node 1 (127.0.0.1) cannot reach master 127.0.0.1:" in (outcome.error or "")
    assert outcome.output["error_type"] == "PreflightError"


async def test_a_gang_member_on_a_worker_busy_with_a_benchmark_fails_at_once_as_retryable(tmp_path: Path) -> None:
    executors = default_executors(cache_dir=tmp_path)
    bench, training = executors["benchmark"], executors["training"]
    assert isinstance(bench, BenchmarkExecutor) and isinstance(training, TrainingExecutor)
    assert bench.exclusive is training.exclusive  # one measurement at a time on a worker
    async with bench.exclusive:  # what a running benchmark holds
        outcome = await training.run(context(LONG_RUN, gang=gang(0, free_port())))
    assert outcome.status == "error" and outcome.output["retryable"] is True
    assert "busy with another benchmark or training task" in (outcome.error or "")


@contextlib.asynccontextmanager
async def running_gang(tmp_path: Path, config: dict[str, Any]) -> AsyncIterator[list[asyncio.Task[ExecOutcome]]]:
    """Both nodes of a 2-node job, each its own executor (as on two workers); yields the node
    tasks once rank 0 reported progress, i.e. both nodes' ranks are training. On exit the tasks
    are cancelled and the executors closed."""
    port, progress = free_port(), Progress()
    executors = [executor(tmp_path, f"w{rank}") for rank in (0, 1)]
    tasks = [asyncio.create_task(ex.run(context(config, gang=gang(rank, port), progress=progress if rank == 0 else None)))
             for rank, ex in enumerate(executors)]
    try:
        await wait_for(lambda: bool(progress.reports) or any(t.done() for t in tasks), timeout=60,
                       what="training progress")
        assert not any(t.done() for t in tasks), [t.result() for t in tasks if t.done()]
        yield tasks
    finally:
        for t in tasks:
            t.cancel()
        for ex in executors:
            await ex.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_killed_rank_fails_both_nodes_with_reasons_and_leaves_no_training_process(tmp_path: Path) -> None:
    async with running_gang(tmp_path, LONG_RUN) as tasks:
        assert len(ranks_of(tmp_path / "w0")) == 1 and len(ranks_of(tmp_path / "w1")) == 1
        ranks_of(tmp_path / "w1")[0].send_signal(signal.SIGKILL)
        node0, node1 = await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert node1.status == "error" and node1.output["retryable"] is True
    assert "a local rank was killed by signal 9" in (node1.error or "")
    assert node0.status == "error" and node0.output["retryable"] is True
    assert "a peer node or the network failed during training" in (node0.error or "")
    for outcome, rank in ((node0, 0), (node1, 1)):
        assert outcome.output["node_rank"] == rank and outcome.output["metrics"] is None
        assert "--- launcher log (tail) ---" in (outcome.error or "")
    await wait_for(lambda: not training_processes(tmp_path), timeout=30, what="every training process to exit")


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_cancel_stops_this_nodes_ranks_before_returning_and_the_peer_fails(tmp_path: Path) -> None:
    async with running_gang(tmp_path, LONG_RUN) as tasks:
        tasks[1].cancel()  # what the agent does on the coordinator's Cancel
        with pytest.raises(asyncio.CancelledError):
            await tasks[1]
        assert not training_processes(tmp_path / "w1"), "cancel returned before node 1's ranks were stopped"
        node0 = await asyncio.wait_for(tasks[0], 60)
    assert node0.status == "error" and node0.output["retryable"] is True
    await wait_for(lambda: not training_processes(tmp_path), timeout=30, what="every training process to exit")


async def test_a_multi_node_config_without_a_gang_assignment_is_refused(tmp_path: Path) -> None:
    train = await executor(tmp_path, "w0").run(context({**LONG_RUN, "steps": 2}, task_id="ddp-1"))
    assert train.status == "error" and "need a gang assignment" in (train.error or "")
