"""Multi-node DDP training tasks: one node of a gang, run by :func:`~distributed_testing.training.launch.launch`.

A ``training`` task (``tasks.kinds``) is one node of a training job per worker.
The coordinator gives each member of the gang a :class:`~distributed_testing.protocol.messages.GangAssignment`
(node rank, world, rendezvous address and port, whether every node has CUDA). Without one the
config must say ``nodes: 1``: the task runs as a single node on ``127.0.0.1`` with a free port this
worker picks; ``nodes > 1`` without a gang is an ``error`` result.

``launch`` blocks (pre-flight barrier, ``torch.distributed.run``, supervision), so it runs in a
thread of this executor, never in the event loop. Its ``cancel`` event is set when the awaiting
asyncio task is cancelled (the agent's ``Cancel`` path, a drain hand-back, shutdown); ``run`` then
waits until launch has stopped every local rank before ``CancelledError`` propagates. Progress of
global rank 0 is forwarded through ``ctx.progress`` (at most every ``PROGRESS_EVERY_S``), and the
launcher log (every local rank's output) through ``ctx.output`` as it grows (``proc.FileFollower``).

**Exclusive with benchmarks.** A training node holds one worker slot like any task, and it shares
one lock with the benchmark executor: while a node runs, no benchmark measures on this worker
(and no second training node starts), and the other way round, so neither skews the other's
figures. A single-node task waits for the lock. A gang member that finds it held fails at once
with a retryable ``error`` instead of waiting: its peers' pre-flight would time out meanwhile,
and the coordinator retries the whole gang.

Outcomes (``output`` always holds ``node_rank``, ``nnodes``, ``master``; ``retryable`` on errors):

* succeeded: the launch dict (node 0's ``metrics`` is the result document of
  :mod:`distributed_testing.training.result`, other nodes' is ``None``);
* ``failed``: a rank raised (the model or its config failed at run time), or ran cleanly but wrote
  no result;
* ``error`` + ``retryable: true``: infrastructure: pre-flight (peer unreachable, port in use), a
  peer node died or the network broke mid-collective, a local rank killed by a signal, the
  worker busy with another exclusive task;
* ``error`` + ``retryable: false``: an invalid config, ``nodes > 1`` without a gang;
* ``timed_out``: the task's timeout passed (every local rank was killed).

A failed launch's ``error`` is the reason, the launcher's message and the tail of its log
(torchelastic's "Root Cause" block names the first failing rank); ``output["log_path"]`` is the
whole log on this worker.

A task with a bundle (``ctx.bundle_root``) runs its launcher and ranks inside the sandbox
(:mod:`distributed_testing.worker.sandbox`): the task's view of the bundle as the working directory and
first on the ranks' ``sys.path`` (its top-level modules are allowed models on top of
``--allow-model-modules``; the factory must be defined in one), the run directory and its scratch
directory writable, the GPU nodes bound in, a scrubbed environment (``CUDA_VISIBLE_DEVICES`` and
``NCCL_*``/``GLOO_*``/``TORCH_*`` carried). The pre-flight runs in the worker, as before. The
ranks need a network to meet: one node runs with ``--task-network loopback`` or ``host``, several
need ``host``; otherwise the task ends in ``error`` saying so.

A task without a bundle runs its launcher and ranks in the worker's deny-list confinement when it
has one (:mod:`distributed_testing.worker.confine`): the filesystem read-only, the worker's files
hidden, the run directory and a scratch directory of the task's writable, the host's network.

Result files (rank 0's result, the launcher log, torchelastic's per-rank logs) go to
``<run_dir>/<task id>-a<attempt>/``; only the newest ``KEEP_RUNS`` run directories are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distributed_testing.bundles.tree import top_level_modules
from distributed_testing.errors import ExecutionError
from distributed_testing.process.taskfile import read_task_file
from distributed_testing.protocol.messages import GangAssignment
from distributed_testing.training.errors import (
    InvalidTrainingConfig,
    LaunchCancelled,
    LaunchError,
    LaunchTimeout,
    PreflightError,
)
from distributed_testing.training.launch import NodeAssignment, launch
from distributed_testing.worker.confine import Confinement
from distributed_testing.worker.confine import remove as remove_scratch
from distributed_testing.worker.executors.base import (
    ExecOutcome,
    ExecutorSettings,
    OutcomeStatus,
    TaskContext,
)
from distributed_testing.worker.executors.proc import FileFollower, signal_name
from distributed_testing.worker.sandbox import GPU_VARIABLES, PACKAGE_PARENT, gpu_devices, task_environ

logger = logging.getLogger(__name__)

# A task with no timeout (and a worker without --task-timeout) still needs a finite bound for
# torch's collective timeout: a day.
NO_TIMEOUT_S = 86400.0
# How long node 0 waits for its peers to check in (and peers retry a refused connection). Longer
# than launch's default: gang members receive their assignments at slightly different moments.
PREFLIGHT_TIMEOUT_S = 10.0
PROGRESS_EVERY_S = 0.5
KEEP_RUNS = 20
LOG_SCAN_BYTES = 64 * 1024
_LOOPBACK = "127.0.0.1"

# Launcher-log lines that mean a peer node or the network failed, not this node's model.
_PEER_LOST = re.compile(
    r"gloo/transport|Connection reset by peer|Connection closed by peer|Broken pipe|DistNetworkError|"
    r"DistStoreError|RendezvousConnectionError|RendezvousTimeoutError|NCCL (?:error|communicator was aborted)|"
    r"remote process exited|Address already in use|EADDRINUSE",
    re.IGNORECASE,
)
# NCCL's refusal of two ranks on one GPU (seen on a one-GPU host running a 2-node nccl job on two of
# its workers): a setup error, not a lost peer; retrying on the same workers fails the same way.
_DUPLICATE_GPU = re.compile(r"Duplicate GPU detected : rank \d+ and rank \d+ both on CUDA device \w+")
# torchelastic's "Root Cause" block: "exitcode  : -9 (pid: 123)  (SIGKILL)".
_KILLED = re.compile(r"exitcode\s*:\s*-(\d+)\b[^\n]*")
# Signals that come from outside a rank (the OOM killer's SIGKILL, an operator's kill): the rank's
# own death (SIGABRT, SIGSEGV) is read from its traceback first.
_OUTSIDE_KILLS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})


# what a sandboxed rank keeps of the launcher's environment: its GPUs and the collectives' settings
_CARRIED_PREFIXES = ("NCCL_", "GLOO_", "TORCH_")
_CARRIED = (*GPU_VARIABLES, "PYTHONUNBUFFERED")


def shipped_refusal(ctx: TaskContext, nnodes: int) -> str | None:
    """Why this worker cannot run a training node with a bundle (None: it can): the ranks need the
    sandbox, and a network in it where they meet (a private loopback for one node, the host's for
    several)."""
    if ctx.sandbox is None or ctx.scratch_dir is None:
        return "a training task with a bundle needs the worker's sandbox and a scratch directory"
    network = ctx.sandbox.network
    if ctx.sandbox.mode != "none" and nnodes > 1 and network != "host":
        return (f"a training task with a bundle on {nnodes} nodes needs its ranks to reach each other: this worker "
                f"runs shipped code with --task-network {network}, and only host reaches other machines")
    if ctx.sandbox.mode != "none" and network == "none":
        return ("a training task with a bundle needs a network for its ranks' rendezvous: this worker runs shipped "
                "code with --task-network none (loopback serves one node, host several)")
    return None


def _confine(ctx: TaskContext, run_path: Path, command: list[str],
             env: dict[str, str]) -> tuple[list[str], dict[str, str], Path]:
    """The launcher's command inside the sandbox: the task's view of the bundle as its working directory and
    first on the ranks' path, the run directory (result, logs) and scratch writable, GPU nodes bound."""
    assert ctx.bundle_root is not None and ctx.scratch_dir is not None
    root = ctx.bundle_root.resolve()
    carried = {k: v for k, v in env.items() if k in _CARRIED or k.startswith(_CARRIED_PREFIXES)}
    confined = {**task_environ(carried, ctx.scratch_dir), "PYTHONPATH": f"{root}:{PACKAGE_PARENT}"}
    argv = ctx.sandbox.wrap(command, ro=[], rw=[root, ctx.scratch_dir, run_path], cwd=root, env=confined,
                            devices=gpu_devices(), shm_mb=ctx.max_memory_mb, scratch=ctx.scratch_dir)
    return argv, confined, root


def _confine_operator(confinement: Confinement, scratch: Path, run_path: Path, command: list[str],
                      env: dict[str, str]) -> tuple[list[str], dict[str, str], Path]:
    """The launcher's command in the worker's deny-list confinement: the run directory (result,
    logs) and its scratch directory writable, the GPU nodes bound, the host's network."""
    cwd = Path.cwd()
    argv = confinement.wrap(command, rw=[scratch, run_path], cwd=cwd, devices=gpu_devices())
    return argv, confinement.environ(env, scratch), cwd


@dataclass(frozen=True)
class TrainingOptions:
    """Worker-wide settings of training nodes (from the worker's flags and detected hardware)."""

    run_dir: Path
    cuda_device_count: int = 0
    interface: str | None = None  # --interface: NIC for the pre-flight, gloo and NCCL
    preflight_timeout_s: float = PREFLIGHT_TIMEOUT_S
    allow_model_modules: tuple[str, ...] = ()  # --allow-model-modules, checked again inside each rank


class TrainingExecutor:
    """Runs one node of a training task per call; see the module doc for the contract."""

    task_type = "training"

    def __init__(self, options: TrainingOptions, exclusive: asyncio.Lock | None = None,
                 confinement: Confinement | None = None) -> None:
        self.options = options
        self.confinement = confinement  # the launcher and ranks of tasks without a bundle run in it
        # Shared with the benchmark executor (ExecutorSettings.exclusive): one measurement at a time.
        self.exclusive = exclusive or asyncio.Lock()
        self._threads: ThreadPoolExecutor | None = None

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=False)  # a running launch is stopped by its task's cancel
            self._threads = None

    async def run(self, ctx: TaskContext) -> ExecOutcome:
        started = time.time()
        try:
            assignment, all_cuda = self._assignment(ctx)
        except ExecutionError as exc:
            return _error(exc, started, retryable=False)
        if ctx.bundle_root is not None and (refused := shipped_refusal(ctx, assignment.nnodes)) is not None:
            return _error(ExecutionError(refused), started, retryable=False, assignment=assignment)
        if assignment.nnodes > 1 and self.exclusive.locked():
            return _error(ExecutionError(
                f"node {assignment.node_rank}: this worker is busy with another benchmark or training task "
                "(they are exclusive); the gang is retried"), started, retryable=True, assignment=assignment)
        async with self.exclusive:
            return await self._run_node(ctx, assignment, all_cuda, started)

    def _assignment(self, ctx: TaskContext) -> tuple[NodeAssignment, bool]:
        """This node's rendezvous, from the gang or (single node) from this worker."""
        gang: GangAssignment | None = ctx.gang
        if gang is not None:
            return NodeAssignment(gang.node_rank, gang.nnodes, gang.master_addr, gang.master_port,
                                  ctx.interface or self.options.interface), gang.all_cuda
        nodes = ctx.config.get("nodes", 1)
        if nodes != 1:
            raise InvalidTrainingConfig("nodes", f"{nodes} nodes need a gang assignment from the coordinator, "
                                                 "and this task came without one; a worker alone runs nodes=1 only")
        return NodeAssignment(0, 1, _LOOPBACK, free_port(), ctx.interface or self.options.interface), \
            self.options.cuda_device_count > 0

    async def _run_node(self, ctx: TaskContext, assignment: NodeAssignment, all_cuda: bool,
                        started: float) -> ExecOutcome:
        run_path = await asyncio.to_thread(self._run_path, ctx)
        allowed, confine, scratch = self.options.allow_model_modules, None, None
        if ctx.bundle_root is not None:  # shipped code: its ranks run in the sandbox (module docstring)
            allowed = (*allowed, *top_level_modules(ctx.bundle_root))
            confine = functools.partial(_confine, ctx, run_path)
        elif self.confinement is not None:  # the operator's training: the deny-list (worker/confine.py)
            scratch = await asyncio.to_thread(self.confinement.scratch, ctx.task_id)
            confine = functools.partial(_confine_operator, self.confinement, scratch, run_path)
        log = run_path / f"result.json.node{assignment.node_rank}.log"  # launch's name for it
        follow = FileFollower(log, ctx.output) if ctx.output is not None else None  # the task's output stream
        try:
            return await self._launch(ctx, assignment, all_cuda, started, run_path, allowed, confine)
        finally:
            if follow is not None:
                await follow.stop()
            await asyncio.to_thread(remove_scratch, scratch)

    async def _launch(self, ctx: TaskContext, assignment: NodeAssignment, all_cuda: bool, started: float,
                      run_path: Path, allowed: tuple[str, ...], confine: Any) -> ExecOutcome:
        log = run_path / f"result.json.node{assignment.node_rank}.log"  # launch's name for it
        cancel = threading.Event()
        call = functools.partial(
            launch, ctx.config, assignment, run_path / "result.json",
            cuda_device_count=self.options.cuda_device_count, all_cuda=all_cuda,
            timeout_s=ctx.timeout_s or NO_TIMEOUT_S, preflight_timeout_s=self.options.preflight_timeout_s,
            cancel=cancel, progress=_Forward.wrap(ctx.progress), allow_model_modules=allowed, confine=confine)
        logger.info("training task %s attempt %d: node %d/%d, master %s:%d, files in %s", ctx.task_id, ctx.attempt,
                    assignment.node_rank, assignment.nnodes, assignment.master_addr, assignment.master_port, run_path)
        if self._threads is None:
            self._threads = ThreadPoolExecutor(thread_name_prefix="dt-training")
        future = asyncio.get_running_loop().run_in_executor(self._threads, call)
        try:
            result: dict[str, Any] = await asyncio.shield(future)
        except asyncio.CancelledError:
            cancel.set()
            await _settle(future)
            raise
        except LaunchTimeout as exc:
            return _outcome("timed_out", exc, started, assignment, retryable=False, log_path=log)
        except LaunchCancelled as exc:  # cancelled without the task being cancelled: still a cancel
            return _outcome("cancelled", exc, started, assignment, retryable=False, log_path=log)
        except InvalidTrainingConfig as exc:
            return _error(exc, started, retryable=False, assignment=assignment)
        except PreflightError as exc:
            return _error(exc, started, retryable=True, assignment=assignment)
        except LaunchError as exc:
            status, reason = classify_failure(await asyncio.to_thread(_log_text, log) or exc.log_tail)
            return _outcome(status, exc, started, assignment, retryable=status == "error", reason=reason, log_path=log)
        except ExecutionError as exc:
            return _error(exc, started, retryable=False, assignment=assignment)
        except OSError as exc:  # could not start the launcher (fork, disk): this worker's trouble
            return _error(ExecutionError(f"could not run the training launcher: {exc}"), started, retryable=True,
                          assignment=assignment)
        return ExecOutcome("succeeded", output=result, started_at=started, finished_at=time.time())

    def _run_path(self, ctx: TaskContext) -> Path:
        run_dir = self.options.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        _prune(run_dir, KEEP_RUNS - 1)
        path = run_dir / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', ctx.task_id)}-a{ctx.attempt}"
        if path.exists():
            shutil.rmtree(path)
        path.mkdir()
        return path


def classify_failure(log: str) -> tuple[OutcomeStatus, str]:
    """``(status, reason)`` of a failed launch from its launcher log: ``error`` (retryable) when a
    local rank was killed by a signal or a peer/the network failed, else ``failed``."""
    duplicate = _DUPLICATE_GPU.search(log)
    if duplicate:
        return "failed", (f"two ranks of the job share a GPU ({duplicate.group(0)}): NCCL needs a GPU of its own per "
                          "rank, so the gang's workers must not share one (give each worker its own GPUs with "
                          "CUDA_VISIBLE_DEVICES) or use backend gloo")
    root_cause = log.rfind("Root Cause")  # torchelastic names the first failure after it
    killed = _KILLED.search(log, max(0, root_cause))
    signum = int(killed.group(1)) if killed else None
    if signum in _OUTSIDE_KILLS:
        return "error", f"a local rank was killed by signal {signum} (out-of-memory killer or an outside kill)"
    # before a rank's own signal: a rank whose collective failed on a lost peer can end in SIGABRT
    # (gloo's error raised in a DDP hook's callback), with the peer's loss in its traceback
    peer = _PEER_LOST.search(log)
    if peer:
        return "error", f"a peer node or the network failed during training ({peer.group(0)})"
    if signum is not None:
        return "error", f"a local rank died of signal {signum} ({signal_name(signum) or 'unknown signal'})"
    return "failed", "a training rank failed"


def free_port() -> int:
    """A TCP port free on every local address now (the pre-flight listener binds it on all)."""
    with socket.create_server(("", 0)) as sock:
        return int(sock.getsockname()[1])


class _Forward:
    """Calls ``progress`` on the event loop from launch's thread, at most every PROGRESS_EVERY_S."""

    def __init__(self, progress: Callable[[float, str], None], loop: asyncio.AbstractEventLoop) -> None:
        self.progress, self.loop = progress, loop
        self._last = float("-inf")

    @classmethod
    def wrap(cls, progress: Callable[[float, str], None] | None) -> Callable[[float, str], None] | None:
        return None if progress is None else cls(progress, asyncio.get_running_loop())

    def __call__(self, fraction: float, message: str) -> None:
        now = time.monotonic()
        if fraction < 1.0 and now - self._last < PROGRESS_EVERY_S:
            return
        self._last = now
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody to tell
            self.loop.call_soon_threadsafe(self.progress, fraction, message)


async def _settle(future: asyncio.Future[Any]) -> None:
    """Wait until launch's thread has returned (it stops every local rank first), whatever
    cancellations arrive meanwhile; its exception (LaunchCancelled) is expected and dropped."""
    while not future.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({future})
    if not future.cancelled() and future.exception() is not None:
        logger.info("training launch stopped after cancel: %s", str(future.exception()).splitlines()[0])


def _base_output(assignment: NodeAssignment | None) -> dict[str, Any]:
    if assignment is None:
        return {}
    return {"node_rank": assignment.node_rank, "nnodes": assignment.nnodes,
            "master": f"{assignment.master_addr}:{assignment.master_port}"}


def _error(exc: ExecutionError, started: float, *, retryable: bool,
           assignment: NodeAssignment | None = None) -> ExecOutcome:
    return _outcome("error", exc, started, assignment, retryable=retryable)


def _outcome(status: OutcomeStatus, exc: ExecutionError, started: float, assignment: NodeAssignment | None, *,
             retryable: bool, reason: str | None = None, log_path: Path | None = None) -> ExecOutcome:
    """A failure's outcome; ``error`` holds the message and, for a launch, the launcher log's tail."""
    output: dict[str, Any] = {**_base_output(assignment), "error_type": type(exc).__name__, "metrics": None}
    if status == "error":
        output["retryable"] = retryable
    if log_path is not None:
        output["log_path"] = str(log_path)
    if isinstance(exc, InvalidTrainingConfig):
        output["errors"] = exc.errors
    message = str(exc) if reason is None else f"{reason}: {exc}"
    return ExecOutcome(status, output=output, error=message, started_at=started, finished_at=time.time())


def _log_text(path: Path) -> str:
    """The end of this node's launcher log (more than the error's tail) for classification."""
    try:  # the ranks own the run directory: read as their file (no link, no FIFO)
        return read_task_file(path, under=path.parent, limit=LOG_SCAN_BYTES, tail=True).decode(errors="replace")
    except OSError:
        return ""


def _prune(run_dir: Path, keep: int) -> None:
    runs = sorted((p for p in run_dir.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in runs[keep:]:
        shutil.rmtree(old, ignore_errors=True)


def build(settings: ExecutorSettings) -> TrainingExecutor:
    """The ``training`` kind's executor (``tasks.kinds``); files under ``settings.training.run_dir``
    (default ``<cache_dir>/training``)."""
    options = settings.training or TrainingOptions(run_dir=settings.cache_dir / "training")
    return TrainingExecutor(options, settings.exclusive, settings.confinement)
