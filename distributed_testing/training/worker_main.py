"""Entry point of one training rank, started by ``torch.distributed.run`` (see ``launch.py``).

    python -m torch.distributed.run ... -m distributed_testing.training.worker_main \\
        --config-json '<resolved config>' --result-path out.json [--interface eth0] \\
        [--progress-path p.json] [--collective-timeout-s 600]

Reads the rendezvous environment torch's agent sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), binds gloo/NCCL sockets to
``--interface`` (``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``, overriding inherited values),
trains with the weighted-loss DDP step of :mod:`.loop`, and has global rank 0 write the result
document of :mod:`.metrics` to ``--result-path`` (atomically). Rank 0 also keeps
``--progress-path`` up to date with ``{"step": done, "total": total}`` for the launcher.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import signal
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from distributed_testing.errors import ExecutionError
from distributed_testing.training.balance import Balancer
from distributed_testing.training.deathsig import set_parent_death_signal
from distributed_testing.training.exchange import all_gather_summaries
from distributed_testing.training.loop import LoopResult, StepRunner, build_runner, run_loop
from distributed_testing.training.models import build_model, check_model_allowed
from distributed_testing.training.result import build_result
from distributed_testing.training.task_config import ResolvedTrainingConfig

logger = logging.getLogger(__name__)

MODEL_SEED = 1234
DATA_SEED = 4321
PROGRESS_INTERVAL_S = 0.25


@dataclass(frozen=True)
class RankEnv:
    """The rendezvous environment of one rank."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> RankEnv:
        try:
            return cls(
                rank=int(environ["RANK"]),
                world_size=int(environ["WORLD_SIZE"]),
                local_rank=int(environ["LOCAL_RANK"]),
                local_world_size=int(environ.get("LOCAL_WORLD_SIZE", "1")),
                node_rank=int(environ.get("GROUP_RANK", "0")),
                master_addr=environ["MASTER_ADDR"],
                master_port=int(environ["MASTER_PORT"]),
            )
        except (KeyError, ValueError) as exc:
            raise ExecutionError(f"rank environment incomplete or invalid ({exc}); run under torchrun") from exc


def bind_interface(interface: str | None, environ: dict[str, str] | os._Environ[str]) -> None:
    """Point gloo and NCCL at ``interface`` (no-op for None)."""
    if interface:
        environ["GLOO_SOCKET_IFNAME"] = interface
        environ["NCCL_SOCKET_IFNAME"] = interface


def select_device(local_rank: int, backend: str) -> torch.device:
    """CUDA device ``local_rank`` on a CUDA node, else the CPU; nccl without CUDA raises."""
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise ExecutionError(f"local rank {local_rank} has no CUDA device (this node has {count})")
        return torch.device("cuda", local_rank)
    if backend == "nccl":
        raise ExecutionError("backend nccl but this node has no CUDA device")
    return torch.device("cpu")


class ProgressWriter:
    """Rank 0's progress file: ``{"step": done, "total": total}``, rewritten at most every 0.25 s."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._last = 0.0

    def __call__(self, step: int, total: int) -> None:
        now = time.monotonic()
        if step + 1 < total and now - self._last < PROGRESS_INTERVAL_S:
            return
        self._last = now
        write_json_atomic(self.path, {"step": step + 1, "total": total})


def write_json_atomic(path: Path, document: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(document, indent=1))
    os.replace(tmp, path)


def rank_summary(env: RankEnv, device: torch.device, result: LoopResult, runner: StepRunner) -> dict[str, Any]:
    """This rank's metrics for the result document (see :mod:`.metrics`)."""
    totals = result.totals
    steps = max(totals.steps, 1)
    if device.type == "cuda":
        peak, kind = torch.cuda.max_memory_allocated(device), "cuda_max_allocated"
    else:
        peak, kind = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process_max_rss"
    last_loss = float(runner.last_loss.item()) if runner.last_loss is not None else float("nan")
    return {
        "rank": env.rank,
        "node_rank": env.node_rank,
        "local_rank": env.local_rank,
        "hostname": socket.gethostname(),
        "device": str(device),
        "samples": totals.samples,
        "steps": totals.steps,
        "measured_s": result.measured_s,
        "samples_per_s": totals.samples / result.measured_s if result.measured_s > 0 else 0.0,
        "compute_samples_per_s": totals.samples / totals.compute_s if totals.compute_s > 0 else 0.0,
        "mean_step_s": totals.step_s / steps,
        "mean_compute_s": totals.compute_s / steps,
        "allreduce_wait_s": totals.allreduce_wait_s,
        "mean_allreduce_wait_s": totals.allreduce_wait_s / steps,
        "rebalance_gather_s": result.gather_s,
        "peak_memory_bytes": int(peak),
        "peak_memory_kind": kind,
        "last_loss": last_loss,
        "last_local_batch": result.last_local_batch,
    }


def train(
    config: ResolvedTrainingConfig,
    env: RankEnv,
    device: torch.device,
    progress_path: Path | None,
    allow_model_modules: tuple[str, ...] = (),
) -> tuple[dict[str, Any], Balancer]:
    """Build the model and data, train, and return this rank's summary and the balancer.
    ``allow_model_modules``: where a ``module:factory`` model may be defined (``--allow-model-modules``)."""
    world = env.world_size
    if config.batch_size < world:
        raise ExecutionError(f"global batch {config.batch_size} is smaller than the world size {world}")
    torch.manual_seed(MODEL_SEED)
    model, make_batch = build_model(config.model, allow_model_modules)
    model.to(device)
    torch.manual_seed(DATA_SEED + env.rank)
    inputs, targets = make_batch(config.batch_size - world + 1)
    runner = build_runner(model, device, global_batch=config.batch_size, world_size=world, precision=config.precision)
    balancer = Balancer(
        config.load_balance,
        config.batch_size,
        world,
        warmup_steps=config.warmup_steps,
        rebalance_interval=config.rebalance_interval,
    )
    on_step = ProgressWriter(progress_path) if env.rank == 0 and progress_path else None
    result = run_loop(
        runner,
        (inputs.to(device), targets.to(device)),
        balancer,
        rank=env.rank,
        warmup_steps=config.warmup_steps,
        steps=config.steps,
        on_step=on_step,
    )
    return rank_summary(env, device, result, runner), balancer


def run_rank(
    config: ResolvedTrainingConfig,
    env: RankEnv,
    *,
    result_path: Path,
    progress_path: Path | None,
    collective_timeout_s: float,
    allow_model_modules: tuple[str, ...] = (),
) -> None:
    """Join the process group, train, gather metrics; rank 0 writes the result."""
    device = select_device(env.local_rank, config.backend)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(config.backend, timeout=timedelta(seconds=collective_timeout_s))
    try:
        logger.info("rank %d/%d (node %d) on %s joined", env.rank, env.world_size, env.node_rank, device)
        summary, balancer = train(config, env, device, progress_path, allow_model_modules)
        gathered = all_gather_summaries(summary, env.world_size, device)  # plain data, never pickle
        if env.rank == 0:
            document = build_result(config.to_dict(), gathered, balancer.history)
            write_json_atomic(result_path, document)
            logger.info("global samples/s %.1f -> %s", document["global_samples_per_s"], result_path)
        # Tear down together: a rank that destroys its group and exits while a peer still works
        # (rank 0 writing the result) can make that peer's gloo threads abort it at exit
        # ("terminate called without an active exception", SIGABRT) after a successful run.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="distributed_testing.training.worker_main")
    parser.add_argument("--config-json", required=True, help="resolved training config as JSON")
    parser.add_argument("--result-path", required=True, type=Path, help="rank 0 writes the result here")
    parser.add_argument("--progress-path", type=Path, default=None, help="rank 0 writes progress here")
    parser.add_argument("--interface", default=None, help="network interface for gloo/NCCL sockets")
    parser.add_argument("--collective-timeout-s", type=float, default=600.0)
    parser.add_argument("--allow-model-modules", default="",
                        help="comma-separated module prefixes a 'module:callable' model may come from (default: none)")
    return parser.parse_args(argv)


@record
def main(argv: Sequence[str] | None = None) -> None:
    parent = os.getppid()
    set_parent_death_signal(signal.SIGKILL, expected_parent=parent)
    args = parse_args(argv)
    env = RankEnv.from_environ(os.environ)
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s rank{env.rank} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    bind_interface(args.interface, os.environ)
    config = ResolvedTrainingConfig.from_dict(json.loads(args.config_json))
    allowed = tuple(p for p in args.allow_model_modules.split(",") if p)
    check_model_allowed(config.model, allowed)
    run_rank(
        config,
        env,
        result_path=args.result_path,
        progress_path=args.progress_path,
        collective_timeout_s=args.collective_timeout_s,
        allow_model_modules=allowed,
    )


if __name__ == "__main__":
    main()
    # Leave without the interpreter's teardown: gloo's threads can still be winding down when the
    # C++ static destructors run, and a joinable std::thread destroyed then aborts the process
    # ("terminate called without an active exception", SIGABRT), failing a run that succeeded.
    # Seen once in CI after the barrier above was added (tests/integration/flags/
    # test_flags_worker_interface.py). A failed run raises out of main() and exits as usual.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
