"""Real torch.distributed launches on loopback: two nodes, a killed rank, a timeout."""

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest

from distributed_testing.training.errors import LaunchCancelled, LaunchTimeout, RankFailure
from distributed_testing.training.launch import NodeAssignment, launch

REPO_ROOT = Path(__file__).resolve().parents[3]
WORKER_MODULE = "distributed_testing.training.worker_main"


def node_command(config: dict[str, Any], node_rank: int, port: int, result: Path) -> list[str]:
    return [
        sys.executable, "-m", "distributed_testing.cli.train_node",
        "--config", json.dumps(config), "--node-rank", str(node_rank), "--nnodes", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(port), "--interface", "lo",
        "--result-path", str(result), "--cuda-device-count", "0", "--timeout-s", "150",
    ]  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_two_nodes_on_loopback_produce_metrics(tmp_path: Path, free_port: int) -> None:
    config = {"model": "mlp", "nodes": 2, "nproc_per_node": 1, "batch_size": 32, "steps": 6, "warmup_steps": 2,
              "load_balance": "hybrid", "rebalance_interval": 2}  # fmt: skip
    procs = [
        subprocess.Popen(
            node_command(config, rank, free_port, tmp_path / f"node{rank}" / "result.json"),
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for rank in (1, 0)
    ]
    outputs = [p.communicate(timeout=170) for p in procs]  # generous: a loaded CI box is slow to import torch
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-3000:]
    node1, node0 = (json.loads(out) for out, _ in outputs)

    assert node1["metrics"] is None and node1["node_rank"] == 1
    metrics = node0["metrics"]
    assert (metrics["world_size"], metrics["nnodes"], metrics["steps"]) == (2, 2, 6)
    assert metrics["global_samples_per_s"] > 0
    assert sum(metrics["shares"]["final"]) == 32
    assert [r["node_rank"] for r in metrics["ranks"]] == [0, 1]
    for rank in metrics["ranks"]:
        assert rank["steps"] == 6
        assert rank["samples_per_s"] > 0 and rank["mean_step_s"] > 0
        assert rank["allreduce_wait_s"] >= 0 and rank["mean_compute_s"] > 0
        assert rank["peak_memory_bytes"] > 0
    assert sum(r["samples"] for r in metrics["ranks"]) == 32 * 6


def descendants() -> list[psutil.Process]:
    return psutil.Process().children(recursive=True)


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def is_rank(proc: psutil.Process) -> bool:
    try:
        return WORKER_MODULE in proc.cmdline() and "RANK" in proc.environ()
    except psutil.NoSuchProcess:
        return False


def rank_process(rank: int) -> psutil.Process | None:
    for proc in descendants():
        try:
            if is_rank(proc) and proc.environ().get("RANK") == str(rank):
                return proc
        except psutil.NoSuchProcess:
            continue
    return None


def all_gone(processes: list[psutil.Process]) -> bool:
    for proc in processes:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


LONG_RUN = {"model": "mlp", "nodes": 2, "nproc_per_node": 1, "batch_size": 16, "steps": 1_000_000, "warmup_steps": 0}


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_killed_rank_stops_every_rank_without_orphans(tmp_path: Path, free_port: int) -> None:
    started, cancel = threading.Event(), threading.Event()

    def progress(fraction: float, message: str) -> None:
        started.set()

    with ThreadPoolExecutor(2) as pool:
        try:
            nodes = [
                pool.submit(
                    launch,
                    LONG_RUN,
                    NodeAssignment(rank, 2, "127.0.0.1", free_port, "lo"),
                    tmp_path / f"node{rank}" / "result.json",
                    timeout_s=150,
                    cancel=cancel,
                    progress=progress if rank == 0 else None,
                )
                for rank in (0, 1)
            ]
            assert started.wait(120), "training never reported progress"
            victim = rank_process(1)
            assert victim is not None
            tree = descendants()
            assert sum(is_rank(p) for p in tree) == 2
            victim.send_signal(signal.SIGKILL)
            for node in nodes:
                with pytest.raises(RankFailure, match="every local rank was stopped"):
                    node.result(timeout=60)
        finally:
            cancel.set()
    wait_for(lambda: all_gone(tree), 30, f"every training process to exit: {[p.pid for p in tree if p.is_running()]}")
    # node 0 failed because its peer vanished mid all-reduce, not through a timeout
    assert "gloo/transport/tcp" in (tmp_path / "node0" / "result.json.node0.log").read_text()


SINGLE = {"model": "mlp", "nodes": 1, "batch_size": 4, "steps": 1_000_000}


def stop_early(tmp_path: Path, port: int, **kwargs: Any) -> tuple[BaseException | None, list[psutil.Process]]:
    """Launch one node; return how it ended and every process it started, seen while it ran."""
    seen: dict[int, psutil.Process] = {}
    with ThreadPoolExecutor(1) as pool:
        node = pool.submit(launch, SINGLE, NodeAssignment(0, 1, "127.0.0.1", port), tmp_path / "r.json", **kwargs)
        while not node.done():
            seen.update({p.pid: p for p in descendants()})
            time.sleep(0.05)
        return node.exception(), list(seen.values())


@pytest.mark.timeout(120)
def test_timeout_kills_every_local_process(tmp_path: Path, free_port: int) -> None:
    error, processes = stop_early(tmp_path, free_port, timeout_s=2.0)
    assert isinstance(error, LaunchTimeout) and "ran past 2s" in str(error)
    assert processes
    wait_for(lambda: all_gone(processes), 30, "every local process to exit")


@pytest.mark.timeout(120)
def test_cancel_kills_every_local_process(tmp_path: Path, free_port: int) -> None:
    cancel = threading.Event()
    timer = threading.Timer(1.5, cancel.set)
    timer.start()
    error, processes = stop_early(tmp_path, free_port, cancel=cancel)
    timer.join()
    assert isinstance(error, LaunchCancelled)
    assert processes
    wait_for(lambda: all_gone(processes), 30, "every local process to exit")
