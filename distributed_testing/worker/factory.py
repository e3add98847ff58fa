"""Assemble a :class:`~.agent.WorkerAgent` from a :class:`~distributed_testing.config.WorkerConfig`:
real hardware detection (in a thread: it imports torch), credentials, executors and the outbox."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from ..config import WorkerConfig
from .agent import WorkerAgent
from .auth import Credentials
from .executors import default_executors
from .executors.benchmark import BenchmarkOptions
from .hardware import capabilities, detect_hardware
from .outbox import MemoryOutbox, Outbox

log = logging.getLogger(__name__)


def cache_dir_for(config: WorkerConfig) -> Path:
    """The worker's cache directory (what ``setup_environment``'s ``clear_cache`` empties)."""
    if config.db_path is not None:
        return config.db_path.parent / f"{config.db_path.stem}-cache"
    return Path.home() / ".cache" / "distributed_testing" / config.worker_id


async def open_outbox(config: WorkerConfig) -> Outbox:
    if config.db_path is None:
        return MemoryOutbox()
    from .outbox_duckdb import DuckDBOutbox

    outbox = DuckDBOutbox(config.db_path)
    await outbox.open()
    return outbox


def benchmark_options(config: WorkerConfig) -> BenchmarkOptions:
    return BenchmarkOptions(cache_models=config.cache_models, mixed_precision=config.mixed_precision,
                            optimize_for=config.optimize_for, cuda_streams=config.cuda_streams,
                            threads=config.bench_threads)


async def build_agent(config: WorkerConfig) -> WorkerAgent:
    creds = Credentials(config.coordinator_url, api_key=config.api_key, token=config.token, token_file=config.token_file)
    info = await asyncio.to_thread(detect_hardware)
    hardware = info.to_dict()
    caps = sorted(capabilities(info))
    log.info("detected %s, %s cores, %.1f GB; capabilities %s; tags %s", hardware.get("cpu_model"),
             hardware.get("logical_cores"), hardware.get("memory_gb", 0.0), caps, list(config.tags))
    executors = default_executors(config.max_concurrent_tasks, cache_dir=cache_dir_for(config),
                                  benchmark=benchmark_options(config))
    return WorkerAgent(config, executors, await open_outbox(config), hardware, caps, creds)
