"""Node launcher for one node of a multi-node DDP training task.

The coordinator reserves ``nnodes`` workers and sends each a :class:`NodeAssignment`. On each,
the worker executor calls :func:`launch` (blocking; run it in a thread), which:

1. validates and resolves the task config for this node (:mod:`.config`);
2. runs the pre-flight barrier (:mod:`.preflight`) on ``master_addr:master_port``, failing within
   ``preflight_timeout_s`` with both ends named if this node cannot reach node 0;
3. starts ``python -m torch.distributed.run`` (static rendezvous, no restarts) with
   ``nproc_per_node`` ranks of :mod:`.worker_main`, as a child in its own session whose output goes
   to ``<result_path>.node<r>.log``;
4. supervises it: when a rank dies the agent stops its other ranks and exits non-zero, and ranks
   on other nodes fail on the broken collective; on timeout or cancel every local process is
   stopped. Whatever happens, every process the launch started is gone when it returns.

Returns (every node)::

    {"node_rank": int, "nnodes": int, "nproc_per_node": int, "backend": "gloo"|"nccl",
     "local_address": str, "interface": str | None, "master": "addr:port", "wall_s": float, "log_path": str,
     "metrics": dict | None}   # node 0: the result document of .metrics; other nodes: None

Raises :class:`~.errors.InvalidTrainingConfig`, :class:`~.errors.PreflightError`,
:class:`~.errors.RankFailure`, :class:`~.errors.LaunchTimeout` or :class:`~.errors.LaunchCancelled`
(all :class:`~distributed_testing.errors.ExecutionError`).

CLI (prints the returned dict as JSON; see :mod:`distributed_testing.cli.train_node`)::

    python -m distributed_testing.cli.train_node --config '{"model": "mlp", ...}' \\
        --node-rank 0 --nnodes 2 --master-addr 10.0.0.1 --master-port 29500 \\
        --interface eth0 --result-path /tmp/run/result.json
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import distributed_testing
from distributed_testing.process.childenv import child_environ
from distributed_testing.process.netif import interface_address
from distributed_testing.process.taskfile import read_task_file
from distributed_testing.training.errors import (
    InvalidTrainingConfig,
    LaunchCancelled,
    LaunchTimeout,
    RankFailure,
)
from distributed_testing.training.preflight import (
    check_in,
    gather_check_ins,
    route_source_address,
)
from distributed_testing.training.proctree import ProcessTree
from distributed_testing.training.task_config import ResolvedTrainingConfig, parse_config, resolve

logger = logging.getLogger(__name__)

POLL_S = 0.1
STOP_GRACE_S = 8.0
AGENT_SHUTDOWN_S = 5
MAX_RENDEZVOUS_S = 120
LOG_TAIL_LINES = 40
# What is read of the files in the run directory, which a bundle's ranks own (sandbox.give): each
# through read_task_file, so a link or FIFO a rank put there is refused, not followed or waited on.
LOG_TAIL_BYTES = 64 * 1024
MAX_RESULT_BYTES = 4 * 1024 * 1024
MAX_PROGRESS_BYTES = 64 * 1024
Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class NodeAssignment:
    """What the coordinator tells one node: its rank and where the rendezvous is."""

    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    interface: str | None = None

    def validate(self) -> None:
        if not 0 <= self.node_rank < self.nnodes:
            raise InvalidTrainingConfig("node_rank", f"{self.node_rank} is outside 0..{self.nnodes - 1}")
        if not 0 < self.master_port < 65536:
            raise InvalidTrainingConfig("master_port", f"{self.master_port} is not a TCP port")
        if not self.master_addr:
            raise InvalidTrainingConfig("master_addr", "empty")


Confine = Callable[[list[str], dict[str, str]], tuple[list[str], dict[str, str], Path]]


def launch(
    task_config: Mapping[str, Any],
    assignment: NodeAssignment,
    result_path: Path,
    *,
    cuda_device_count: int = 0,
    all_cuda: bool = False,
    timeout_s: float = 600.0,
    preflight_timeout_s: float = 5.0,
    extra_env: Mapping[str, str] | None = None,
    cancel: threading.Event | None = None,
    progress: Progress | None = None,
    allow_model_modules: tuple[str, ...] = (),
    confine: Confine | None = None,
) -> dict[str, Any]:
    """Run this node's ranks of a training task; see the module doc for the contract.

    ``result_path`` is where global rank 0 writes the result (on node 0); its directory also gets
    this node's launcher log. ``cuda_device_count`` is this node's count, ``all_cuda`` whether
    every node of the job has CUDA. ``extra_env`` is added to the ranks' environment, which holds
    none of the worker's credentials. ``allow_model_modules`` (the worker's
    ``--allow-model-modules``) is handed to each rank, which refuses any other user model.
    ``confine(command, env)``, when given, returns the command, environment and working directory
    the launcher really runs with (a bundle task's sandbox, ``worker/executors/training.py``).
    """
    started = time.monotonic()
    config = resolve(parse_config(task_config), cuda_device_count=cuda_device_count, all_cuda=all_cuda)
    assignment.validate()
    if assignment.nnodes != config.nodes:
        raise InvalidTrainingConfig("nodes", f"config says {config.nodes} nodes, assignment {assignment.nnodes}")
    local_addr = _local_address(assignment)
    _preflight(assignment, local_addr, preflight_timeout_s)
    files = _LaunchFiles.for_node(Path(result_path), assignment.node_rank)
    command = build_command(config, assignment, files, timeout_s=timeout_s, allow_model_modules=allow_model_modules)
    env = _child_env(extra_env)
    cwd = None
    if confine is not None:
        command, env, cwd = confine(command, env)
    logger.info(
        "node %d/%d launching %d rank(s), master %s:%d, log %s",
        assignment.node_rank,
        assignment.nnodes,
        config.nproc_per_node,
        assignment.master_addr,
        assignment.master_port,
        files.log,
    )
    remaining = timeout_s - (time.monotonic() - started)
    _supervise(command, env, files, timeout_s=remaining, cancel=cancel, progress=progress, cwd=cwd)
    metrics = _read_result(files) if assignment.node_rank == 0 else None
    return {
        "node_rank": assignment.node_rank,
        "nnodes": assignment.nnodes,
        "nproc_per_node": config.nproc_per_node,
        "backend": config.backend,
        "local_address": local_addr,
        "interface": assignment.interface,  # the NIC gloo/NCCL were bound to (None: torch chose)
        "master": f"{assignment.master_addr}:{assignment.master_port}",
        "wall_s": time.monotonic() - started,
        "log_path": str(files.log),
        "metrics": metrics,
    }


@dataclass(frozen=True)
class _LaunchFiles:
    result: Path
    log: Path
    progress: Path | None
    agent_logs: Path

    @classmethod
    def for_node(cls, result: Path, node_rank: int) -> _LaunchFiles:
        result.parent.mkdir(parents=True, exist_ok=True)
        progress = None
        if node_rank == 0:
            progress = result.with_name(f"{result.name}.progress")
            for stale in (result, progress):
                stale.unlink(missing_ok=True)
        return cls(
            result=result,
            log=result.with_name(f"{result.name}.node{node_rank}.log"),
            progress=progress,
            agent_logs=result.with_name(f"{result.name}.node{node_rank}.torchelastic"),
        )


def build_command(
    config: ResolvedTrainingConfig, assignment: NodeAssignment, files: _LaunchFiles, *, timeout_s: float,
    allow_model_modules: tuple[str, ...] = (),
) -> list[str]:
    """The agent command: torch.distributed.run under the parent-death shim."""
    rendezvous_s = int(max(10, min(timeout_s, MAX_RENDEZVOUS_S)))
    worker_args = [
        "--config-json",
        json.dumps(config.to_dict()),
        "--result-path",
        str(files.result),
        "--collective-timeout-s",
        str(timeout_s),
        f"--allow-model-modules={','.join(allow_model_modules)}",
    ]
    if files.progress is not None:
        worker_args += ["--progress-path", str(files.progress)]
    if assignment.interface:
        worker_args += ["--interface", assignment.interface]
    return [
        sys.executable, "-m", "distributed_testing.training.deathsig", "SIGTERM", "--",
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(assignment.nnodes),
        "--node-rank", str(assignment.node_rank),
        "--nproc-per-node", str(config.nproc_per_node),
        "--rdzv-backend", "static",
        "--master-addr", assignment.master_addr,
        "--master-port", str(assignment.master_port),
        "--rdzv-conf", f"timeout={rendezvous_s}",
        "--max-restarts", "0",
        "--log-dir", str(files.agent_logs),
        "--module", "distributed_testing.training.worker_main",
        *worker_args,
    ]  # fmt: skip


def _local_address(assignment: NodeAssignment) -> str:
    if assignment.interface:
        return interface_address(assignment.interface)
    return route_source_address(assignment.master_addr, assignment.master_port)


def _preflight(assignment: NodeAssignment, local_addr: str, timeout_s: float) -> None:
    if assignment.node_rank == 0:
        gather_check_ins(assignment.master_port, nnodes=assignment.nnodes, local_addr=local_addr, timeout_s=timeout_s)
        return
    check_in(
        assignment.master_addr,
        assignment.master_port,
        node_rank=assignment.node_rank,
        nnodes=assignment.nnodes,
        local_addr=local_addr,
        timeout_s=timeout_s,
    )


def _child_env(extra_env: Mapping[str, str] | None) -> dict[str, str]:
    env = child_environ()  # the worker's environment without its credentials
    package_root = str(Path(distributed_testing.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    # the agent's grace between SIGTERM and SIGKILL for its ranks; set through the environment,
    # which every torch reads, not ``--shutdown-timeout``, which torch 2.11 refuses (seen on a GPU host)
    env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(AGENT_SHUTDOWN_S)
    env.update(extra_env or {})
    return env


def _supervise(
    command: list[str],
    env: dict[str, str],
    files: _LaunchFiles,
    *,
    timeout_s: float,
    cancel: threading.Event | None,
    progress: Progress | None,
    cwd: Path | None = None,
) -> None:
    """Run the agent to completion; stop the whole tree and raise on failure, timeout or cancel."""
    deadline = time.monotonic() + timeout_s
    reporter = _ProgressReader(files.progress, progress)
    with files.log.open("wb") as log:
        proc = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=cwd,
        )  # fmt: skip
    tree = ProcessTree(proc)
    outcome = "exited"
    try:
        while proc.poll() is None:
            tree.refresh()
            reporter.poll()
            if cancel is not None and cancel.is_set():
                outcome = "cancelled"
                break
            if time.monotonic() >= deadline:
                outcome = "timed out"
                break
            try:
                proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                continue
    finally:
        tree.stop(STOP_GRACE_S)
    reporter.poll()
    tail = _log_tail(files.log)
    if outcome == "cancelled":
        raise LaunchCancelled("training launch cancelled; every local rank was stopped", tail)
    if outcome == "timed out":
        raise LaunchTimeout(f"training launch ran past {timeout_s:.0f}s; every local rank was killed", tail)
    if proc.returncode != 0:
        raise RankFailure(
            f"a training rank or the torch agent failed (agent exit status {proc.returncode}); "
            "every local rank was stopped",
            tail,
        )


class _ProgressReader:
    """Turns rank 0's progress file into ``progress(fraction, message)`` calls."""

    def __init__(self, path: Path | None, callback: Progress | None) -> None:
        self.path = path if callback is not None else None
        self.callback = callback
        self._last_step = -1

    def poll(self) -> None:
        if self.path is None or self.callback is None:
            return
        try:
            text = read_task_file(self.path, under=self.path.parent, limit=MAX_PROGRESS_BYTES)
        except OSError:  # absent so far, or not a file the rank may hand us
            return
        state = json.loads(text)
        step, total = int(state["step"]), int(state["total"])
        if step != self._last_step:
            self._last_step = step
            self.callback(step / total, f"training step {step}/{total}")


def _read_result(files: _LaunchFiles) -> dict[str, Any]:
    try:
        text = read_task_file(files.result, under=files.result.parent, limit=MAX_RESULT_BYTES)
    except FileNotFoundError as exc:
        raise RankFailure(
            f"ranks exited cleanly but rank 0 wrote no result at {files.result}", _log_tail(files.log)
        ) from exc
    except OSError as exc:
        raise RankFailure(f"rank 0's result cannot be read: {exc}", _log_tail(files.log)) from exc
    document: dict[str, Any] = json.loads(text)
    return document


def _log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = read_task_file(path, under=path.parent, limit=LOG_TAIL_BYTES, tail=True).decode(errors="replace")
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return f"(the launcher log cannot be read: {exc})"
    return "\n".join(text.splitlines()[-lines:])

