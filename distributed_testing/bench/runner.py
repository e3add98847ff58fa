"""Entry points: run one benchmark task, or several that share a loaded model.

:func:`run_benchmark` validates a config, gets the prepared model (from ``model_cache`` when an
earlier task built the same one), measures every batch size and returns a JSON-able result::

    {name?, model, model_source, parameters, weights, backend, device, precision, autocast,
     autocast_source, mode, threads, optimizer?, optimize_for, cuda_streams, tiny, inputs: {...},
     batch_results: [{batch_size, iterations, warmup, first_call_ms, latency_ms: {mean, median,
                      p90, p99, std, cv, min, max}, timing, host_clock_median_ms?,
                      throughput_items_s, concurrency, measured_s,
                      peak_memory_mb, memory_source, verdict, verdict_reason,
                      disturbance: {...}, samples_ms: [...],
                      openvino_compiled?, static_input_shapes?, openvino_compile_s?}],
     compile_time_s, load_time_s, cached, model_load_count, model_info: {...}, environment,
     config_hash,
     load_average: {before, after}}

``samples_ms`` holds the per-iteration latencies (at most ``measure.MAX_SAMPLES``, see there);
``config_hash`` (``bench/env.py``) identifies the configuration for regression comparisons.
``load_time_s`` is the time this call spent building/loading the model (0.0 when it came from
the cache, ``cached: true``). ``compile_time_s`` is the compilation time spent in this call:
OpenVINO conversion + compile for the first batch size (0.0 when cached) plus the compilations
for other input shapes (each batch's ``openvino_compile_s``); for ``backend: compile`` the sum of the first
call at each batch size, which triggers torch.compile's (re)compilation and includes one
execution; ``None`` for eager. ``model_load_count`` counts how often this task's model
key was built in this process, whatever cache it went to (stays 1 while reuse works).

:func:`run_benchmark_batch` runs several configs in one process: configs that share the model
key (model, backend, precision, device, tiny, model_config, weights, mode, optimize_for, ...)
load the model once. A failing entry becomes ``{"index", "name", "error": {"type", "message"}}``
and the others still run; an out-of-memory error has type ``OutOfMemory``.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from distributed_testing.bench.backends import (
    PreparedModel,
    check_config_combination,
    prepare_torch,
    torch_device_for,
)
from distributed_testing.bench.env import collect_environment, config_hash
from distributed_testing.bench.measure import measure
from distributed_testing.bench.models import build_model, canonical_name
from distributed_testing.bench.models_base import ModelRequest
from distributed_testing.bench.task_config import BenchConfig, RunnerDefaults, parse_config
from distributed_testing.errors import DTError, ExecutionError

logger = logging.getLogger(__name__)

ModelCache = dict[tuple[Any, ...], PreparedModel]

_LOADS: Counter[tuple[Any, ...]] = Counter()
"""How often this process built each model key: the evidence that caching works."""


def _model_request(cfg: BenchConfig, defaults: RunnerDefaults) -> ModelRequest:
    return ModelRequest(
        name=cfg.model,
        tiny=cfg.tiny,
        model_config=cfg.model_config,
        weights=cfg.weights,
        seed=cfg.seed,
        sequence_length=cfg.sequence_length,
        image_size=cfg.image_size,
        input_shape=cfg.input_shape,
        hf_cache_dir=defaults.hf_cache_dir,
        allow_model_modules=defaults.allow_model_modules,
    )


def load_prepared(cfg: BenchConfig, defaults: RunnerDefaults) -> PreparedModel:
    """Check the device, build the model and put it on its backend (no caching)."""
    start = time.perf_counter()
    _LOADS[_cache_key(cfg, defaults)] += 1
    if cfg.backend == "openvino":
        from distributed_testing.bench.openvino_backend import openvino_target, prepare_openvino

        target = openvino_target(cfg)
        return prepare_openvino(build_model(_model_request(cfg, defaults)), cfg, target, start)
    device = torch_device_for(cfg)
    return prepare_torch(build_model(_model_request(cfg, defaults)), cfg, device, start)


def _get_prepared(cfg: BenchConfig, defaults: RunnerDefaults, cache: ModelCache | None) -> tuple[PreparedModel, bool]:
    if cache is None:
        return load_prepared(cfg, defaults), False
    key = _cache_key(cfg, defaults)
    if key in cache:
        logger.info("model %s (%s, %s) reused from the model cache", cfg.model, cfg.backend, cfg.precision)
        return cache[key], True
    prepared = load_prepared(cfg, defaults)
    cache[key] = prepared
    return prepared, False


def _cache_key(cfg: BenchConfig, defaults: RunnerDefaults) -> tuple[Any, ...]:
    return (*cfg.cache_key(), defaults.hf_cache_dir)


def apply_threads(threads: int) -> None:
    """Set torch's intra-op threads (before building a model: oneDNN primitives pick it up)."""
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def _inputs_summary(cfg: BenchConfig, input_kind: str) -> dict[str, Any]:
    summary: dict[str, Any] = {"seed": cfg.seed}
    if input_kind == "text":
        summary["sequence_length"] = cfg.sequence_length
    elif input_kind == "image":
        summary["image_size"] = cfg.image_size
    if cfg.input_shape is not None:
        summary["input_shape"] = list(cfg.input_shape)
    return summary


def _compile_time(
    cfg: BenchConfig, prepared: PreparedModel, cached: bool, batch_results: list[dict[str, Any]]
) -> float | None:
    if cfg.backend == "compile":
        return float(sum(r["first_call_ms"] for r in batch_results)) / 1000.0
    if cfg.backend == "openvino":
        compiled_now = math.fsum(r.get("openvino_compile_s", 0.0) for r in batch_results)
        return (0.0 if cached else prepared.convert_time_s or 0.0) + compiled_now
    return None


Progress = Callable[[int, int, str], None]
"""Called after each measured batch size with (done, total, line), the line as
:func:`progress_line` words it."""


def progress_line(model: str, batch_size: int, precision: str, median_ms: float, done: int, total: int) -> str:
    """One finished configuration for a person: ``cnn b8 fp32: 1.23 ms (3 of 6)`` (the median)."""
    figure = f"{median_ms:.2f}" if median_ms >= 1 else f"{median_ms:.3f}"
    return f"{model} b{batch_size} {precision}: {figure} ms ({done} of {total})"


def run_benchmark(
    config: dict[str, Any], *, defaults: RunnerDefaults | None = None, model_cache: ModelCache | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run one benchmark task; raises ExecutionError for bad config or unsupported setups.
    ``progress`` hears of each batch size as it finishes."""
    defaults = defaults or RunnerDefaults()
    cfg = parse_config(config, defaults)
    canonical = canonical_name(cfg.model)
    check_config_combination(cfg)
    apply_threads(cfg.threads)
    prepared, cached = _get_prepared(cfg, defaults, model_cache)
    load_before = load_average()
    batch_results = []
    for batch_size in cfg.batch_sizes:
        work = prepared.engine.workload(cfg, batch_size)
        result = measure(work, cfg.warmup, cfg.iterations, cfg.min_duration_s)
        logger.info(
            "%s bs=%d median %.3f ms, %.1f items/s",
            canonical,
            batch_size,
            result["latency_ms"]["median"],
            result["throughput_items_s"] or 0.0,
        )
        batch_results.append(result)
        if progress is not None:
            done, total = len(batch_results), len(cfg.batch_sizes)
            progress(done, total, progress_line(canonical, batch_size, cfg.precision,
                                                result["latency_ms"]["median"], done, total))
    result = _result(cfg, canonical, prepared, cached, batch_results)
    result["config_hash"] = config_hash({**dataclasses.asdict(cfg), "model": canonical})
    result["model_load_count"] = _LOADS[_cache_key(cfg, defaults)]
    result["load_average"] = {"before": load_before, "after": load_average()}
    return result


def load_average() -> list[float] | None:
    """The host's 1/5/15-minute load averages (None where the OS has none): a busy machine
    shows up here before it shows up as noise in the latencies."""
    getloadavg = getattr(os, "getloadavg", None)
    return [round(x, 2) for x in getloadavg()] if getloadavg is not None else None


def _result(
    cfg: BenchConfig, canonical: str, prepared: PreparedModel, cached: bool, batch_results: list[dict[str, Any]]
) -> dict[str, Any]:
    built = prepared.built
    result: dict[str, Any] = {} if cfg.name is None else {"name": cfg.name}
    result.update(
        {
            "model": canonical,
            "model_source": built.source,
            "parameters": built.parameters,
            "weights": built.weights,
            "backend": cfg.backend,
            "device": prepared.device_label,
            "precision": cfg.precision,
            "autocast": cfg.autocast,
            "autocast_source": cfg.autocast_source,
            "mode": cfg.mode,
            "threads": cfg.threads,
        }
    )
    if cfg.mode == "training":
        result["optimizer"] = cfg.optimizer
        result["learning_rate"] = cfg.learning_rate
    result.update(
        {
            "optimize_for": cfg.optimize_for,
            "cuda_streams": cfg.cuda_streams,
            "tiny": cfg.tiny,
            "inputs": _inputs_summary(cfg, built.input_kind),
            "batch_results": batch_results,
            "compile_time_s": _compile_time(cfg, prepared, cached, batch_results),
            "load_time_s": 0.0 if cached else prepared.load_time_s,
            "cached": cached,
            "model_info": {**built.info, **prepared.info},
            "environment": collect_environment(
                prepared.torch_device,
                prepared.engine.device_name(),
                None if prepared.torch_device is not None else prepared.device_label,
            ),
        }
    )
    return result


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError))


def error_entry(index: int, config: Any, exc: BaseException) -> dict[str, Any]:
    """The per-task error record of :func:`run_benchmark_batch`."""
    kind = "OutOfMemory" if _is_oom(exc) else type(exc).__name__
    name = config.get("name") if isinstance(config, dict) else None
    return {"index": index, "name": name, "error": {"type": kind, "message": str(exc)}}


def _release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_benchmark_batch(
    configs: list[dict[str, Any]], *, defaults: RunnerDefaults | None = None, model_cache: ModelCache | None = None,
    progress: Callable[[int, int, int, str], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every config in order, sharing loaded models; one failure does not stop the rest.
    ``progress`` hears (config index, done, total, line) as each batch size finishes."""
    if not isinstance(configs, list):
        raise ExecutionError(f"configs must be a list, got {type(configs).__name__}")
    cache: ModelCache = {} if model_cache is None else model_cache
    results: list[dict[str, Any]] = []
    for index, config in enumerate(configs):
        try:
            each = None if progress is None else functools.partial(progress, index)
            results.append(run_benchmark(config, defaults=defaults, model_cache=cache, progress=each))
        except DTError as exc:
            logger.warning("benchmark task %d rejected: %s", index, exc)
            results.append(error_entry(index, config, exc))
        except Exception as exc:  # a user's model or a library failing is a task result
            logger.exception("benchmark task %d failed", index)
            if _is_oom(exc):
                _release_memory()
            results.append(error_entry(index, config, exc))
    return results
