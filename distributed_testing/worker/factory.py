"""Assemble a :class:`~.agent.WorkerAgent` from a :class:`~distributed_testing.config.WorkerConfig`:
real hardware detection (in a thread: it imports torch), credentials, executors, the result store and
the benchmark result cache (in the result store's DuckDB file with ``--db-path``, else in memory), and
the environment fingerprint on every result (``environment.py``).
Training nodes get the detected CUDA device count, ``--interface`` and ``<cache dir>/training``."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..config import WorkerConfig
from . import confine
from .agent import WorkerAgent
from .auth import Credentials
from .bench_cache import MemoryResultCache, ResultCache
from .environment import EnvironmentProbe, with_environment
from .executors import Executor, default_executors
from .executors.benchmark import BenchmarkExecutor, BenchmarkOptions
from .executors.training import TrainingExecutor, TrainingOptions
from .hardware import capabilities, detect_hardware
from .result_store import MemoryResultStore, ResultStore

log = logging.getLogger(__name__)


def cache_dir_for(config: WorkerConfig) -> Path:
    """The worker's cache directory: training runs under ``training``, the custom handlers' cache
    (what ``setup_environment``'s ``clear_cache`` empties) under ``handlers``."""
    if config.db_path is not None:
        return config.db_path.parent / f"{config.db_path.stem}-cache"
    return Path.home() / ".cache" / "distributed_testing" / config.worker_id


async def open_storage(config: WorkerConfig) -> tuple[ResultStore, ResultCache]:
    """The opened result store and the benchmark result cache: both in the ``--db-path`` DuckDB file
    (sharing its one connection), or both in memory."""
    if config.db_path is None:
        return MemoryResultStore(), MemoryResultCache()
    from .result_store_duckdb import DuckDBResultCache, DuckDBResultStore

    store = DuckDBResultStore(config.db_path)
    await store.open()
    return store, DuckDBResultCache(store)


def benchmark_options(config: WorkerConfig) -> BenchmarkOptions:
    return BenchmarkOptions(cache_models=config.cache_models, mixed_precision=config.mixed_precision,
                            optimize_for=config.optimize_for, cuda_streams=config.cuda_streams,
                            threads=config.bench_threads, allow_model_modules=config.allow_model_modules)


def training_options(config: WorkerConfig, hardware: dict[str, Any]) -> TrainingOptions:
    return TrainingOptions(run_dir=cache_dir_for(config) / "training", cuda_device_count=cuda_device_count(hardware),
                           interface=config.interface, allow_model_modules=config.allow_model_modules)


def cuda_device_count(hardware: dict[str, Any]) -> int:
    """CUDA devices in a detected-hardware dict (0 when CUDA is unavailable or not reported)."""
    cuda = (hardware.get("devices") or {}).get("cuda") or {}
    return int(cuda.get("count") or 0) if cuda.get("available") else 0


def with_benchmark_cache(executors: dict[str, Executor], config: WorkerConfig,
                         cache: ResultCache) -> dict[str, Executor]:
    """``executors`` with the benchmark executor replaced by one that uses ``cache`` and the
    worker's benchmark flags, and the training executor bound to ``config.interface`` and
    ``config.allow_model_modules``; the two keep sharing one lock and the training executor's
    confinement."""
    current = executors.get("training")
    if isinstance(current, TrainingExecutor):
        training = TrainingExecutor(replace(current.options, interface=config.interface,
                                            allow_model_modules=config.allow_model_modules), current.exclusive,
                                    current.confinement)
    else:
        training = TrainingExecutor(training_options(config, {}))
    benchmark = BenchmarkExecutor(benchmark_options(config), cache=cache, exclusive=training.exclusive,
                                  confinement=training.confinement)
    return {**executors, "benchmark": benchmark, "training": training}


async def build_agent(config: WorkerConfig) -> WorkerAgent:
    creds = Credentials(config.coordinator_url, api_key=config.api_key, token=config.token, token_file=config.token_file,
                        ca_file=config.ca_file, others=config.urls)
    info = await asyncio.to_thread(detect_hardware)
    hardware = info.to_dict()
    caps = sorted(capabilities(info))
    log.info("detected %s, %s cores, %.1f GB; capabilities %s; tags %s", hardware.get("cpu_model"),
             hardware.get("logical_cores"), hardware.get("memory_gb", 0.0), caps, list(config.tags))
    result_store, results = await open_storage(config)
    cache_dir = cache_dir_for(config)
    executors = default_executors(config.max_concurrent_tasks, cache_dir=cache_dir,
                                  benchmark=benchmark_options(config), training=training_options(config, hardware),
                                  result_cache=results, confinement=confine.for_worker(config, cache_dir))
    executors = with_environment(executors, EnvironmentProbe())
    return WorkerAgent(config, executors, result_store, hardware, caps, creds)
