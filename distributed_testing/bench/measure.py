"""Timing, statistics and peak-memory measurement for one batch size.

Method, per batch size:

1. ``warmup`` untimed rounds (>= 1). The first one is timed on its own and reported as
   ``first_call_ms``: for torch.compile it contains the (re)compilation for this shape.
2. Timed rounds until at least ``iterations`` rounds *and* ``min_duration_s`` of measured time,
   whichever takes longer. Python's garbage collector is off during the timed rounds (as in
   ``timeit`` and ``torch.utils.benchmark``) and the whole loop runs inside one
   ``torch.inference_mode()`` / autocast context, entered once, so no per-round setup is timed.
3. Every round is synchronised with its device before its time is taken: CUDA events on the
   round's stream (``elapsed_time``) for a single CUDA stream, ``torch.cuda.synchronize()`` plus
   the host clock for several streams, ``torch.mps.synchronize()`` on MPS, and the host clock
   (``perf_counter_ns``) on the CPU, where torch and OpenVINO's synchronous calls return when
   the work is done. A workload whose runtime times each round itself (``round_ms``: OpenVINO's
   ``InferRequest.latency``, what ``benchmark_app`` reports) is timed by that figure, so the
   Python call around the round (argument dispatch, the outputs' copy into numpy) stays out of
   it; the host clock still runs and its median is reported beside (``host_clock_median_ms``).
   ``timing`` names the source: ``host_clock``, ``cuda_events`` or ``openvino_request_latency``.

A *round* is one inference (or training step) in ``optimize_for: "latency"``. In
``optimize_for: "throughput"`` a round is ``concurrency`` requests in flight at once: one per CUDA
stream (``cuda_streams``, each with its own input), or one per OpenVINO infer request (the
plugin's ``OPTIMAL_NUMBER_OF_INFER_REQUESTS`` under ``PERFORMANCE_HINT=THROUGHPUT``). Throughput
mode also puts 4-D image inputs and the torch model into channels-last (NHWC) memory format, the
layout oneDNN and cuDNN convolutions run fastest in. A torch task for which throughput mode
would change none of these (a text model, one stream) is refused rather than run identically
to latency mode. ``latency_ms`` is always the time of a round;
``throughput_items_s = batch_size * concurrency * rounds / measured seconds`` (the sum of the
rounds' times, whichever ``timing`` gave them).

Every result keeps its per-iteration latencies as ``samples_ms`` (rounded to 0.1 µs) for
regression tests on the distribution (``cli/regress.py``): all of them up to ``MAX_SAMPLES``, beyond
that ``MAX_SAMPLES`` evenly spaced in time order, with ``samples_kept_every`` saying the stride.

Each entry says whether it can be trusted: ``verdict`` (``quiet``, ``noisy`` or ``disturbed``),
``verdict_reason`` and the figures behind them, ``disturbance`` (per-thread CPU waits and
preemptions, other processes' CPU and steal during the timed rounds; see ``disturbance.py``).

Peak memory is the high-water mark during the timed rounds (reset after warmup), from:

* ``torch.cuda.max_memory_allocated`` on CUDA/ROCm (tensors allocated by torch on the device);
* ``proc_status_vmhwm``: the process's peak resident set size (VmHWM) on Linux, reset through
  ``/proc/self/clear_refs`` so it covers only the timed rounds (still includes the model weights
  and everything else resident in the process);
* ``ru_maxrss_process_lifetime`` where that reset is impossible: the peak since process start;
* ``torch.mps.current_allocated_memory_sampled``: the largest value sampled after each round.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import resource
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from distributed_testing.bench import disturbance
from distributed_testing.errors import ExecutionError

logger = logging.getLogger(__name__)

_CLEAR_REFS = Path("/proc/self/clear_refs")
_PROC_STATUS = Path("/proc/self/status")
_MIB = 1024 * 1024
MAX_SAMPLES = 1000


def bounded_samples(samples: Sequence[float], limit: int = MAX_SAMPLES) -> tuple[list[float], int]:
    """At most ``limit`` of ``samples`` (every ``stride``-th, in order) and that stride."""
    stride = max(1, math.ceil(len(samples) / limit))
    return [round(x, 4) for x in samples[::stride]], stride


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Linear-interpolated percentile (numpy's default method) of already sorted values."""
    if not sorted_values:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= pct <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {pct}")
    position = (len(sorted_values) - 1) * pct / 100.0
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = position - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


def summarize(samples_ms: Sequence[float]) -> dict[str, float]:
    """mean, median, p90, p99, std (sample, n-1), cv (std/mean, a fraction), min, max."""
    if not samples_ms:
        raise ValueError("no samples to summarize")
    ordered = sorted(samples_ms)
    count = len(ordered)
    mean = math.fsum(ordered) / count
    variance = math.fsum((x - mean) ** 2 for x in ordered) / (count - 1) if count > 1 else 0.0
    std = math.sqrt(variance)
    return {
        "mean": mean,
        "median": percentile(ordered, 50),
        "p90": percentile(ordered, 90),
        "p99": percentile(ordered, 99),
        "std": std,
        "cv": std / mean if mean > 0 else 0.0,
        "min": ordered[0],
        "max": ordered[-1],
    }


class MemoryTracker(Protocol):
    source: str

    def reset(self) -> None: ...

    def sample(self) -> None: ...

    def peak_mb(self) -> float: ...


class CpuRssTracker:
    """Peak resident set size of this process (see the module docstring for the sources)."""

    def __init__(self) -> None:
        self.source = "proc_status_vmhwm" if self._can_reset() else "ru_maxrss_process_lifetime"

    @staticmethod
    def _can_reset() -> bool:
        if not (_CLEAR_REFS.exists() and _PROC_STATUS.exists()):
            return False
        try:
            _CLEAR_REFS.write_text("5")
        except OSError as exc:
            logger.info("cannot reset peak RSS through %s (%s); using ru_maxrss", _CLEAR_REFS, exc)
            return False
        return True

    def reset(self) -> None:
        if self.source == "proc_status_vmhwm":
            _CLEAR_REFS.write_text("5")

    def sample(self) -> None:
        return None

    def peak_mb(self) -> float:
        if self.source == "proc_status_vmhwm":
            for line in _PROC_STATUS.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
            raise ExecutionError("VmHWM missing from /proc/self/status")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / _MIB if sys.platform == "darwin" else peak / 1024.0


class CudaMemoryTracker:
    source = "torch.cuda.max_memory_allocated"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def reset(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def sample(self) -> None:
        return None

    def peak_mb(self) -> float:
        return torch.cuda.max_memory_allocated(self.device) / _MIB


class MpsMemoryTracker:
    source = "torch.mps.current_allocated_memory_sampled"

    def __init__(self) -> None:
        self._peak = 0

    def reset(self) -> None:
        self._peak = torch.mps.current_allocated_memory()

    def sample(self) -> None:
        self._peak = max(self._peak, torch.mps.current_allocated_memory())

    def peak_mb(self) -> float:
        return self._peak / _MIB


def memory_tracker(device: torch.device | None) -> MemoryTracker:
    """The tracker for a torch device; None (OpenVINO) means host memory."""
    if device is not None and device.type == "cuda":
        return CudaMemoryTracker(device)
    if device is not None and device.type == "mps":
        return MpsMemoryTracker()
    return CpuRssTracker()


@dataclass
class Workload:
    """One round of work for one batch size, ready to time.

    ``step`` enqueues or runs one round; ``sync`` waits until the device finished it (None when
    ``step`` is synchronous). ``cuda_events_on`` selects CUDA-event timing on that stream.
    ``context`` is entered once around warmup and timed rounds.
    """

    step: Callable[[], Any]
    batch_size: int
    memory: MemoryTracker
    sync: Callable[[], None] | None = None
    concurrency: int = 1
    cuda_events_on: torch.cuda.Stream | None = None
    context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    extra: dict[str, Any] = field(default_factory=dict)
    round_ms: Callable[[], float] | None = None
    """The runtime's own time of the round just run (ms), used instead of the host clock."""
    timing: str = "host_clock"
    """What the samples are: ``host_clock``, ``cuda_events`` or the name of ``round_ms``'s source."""


def _host_round(step: Callable[[], Any], sync: Callable[[], None] | None) -> float:
    start = time.perf_counter_ns()
    step()
    if sync is not None:
        sync()
    return (time.perf_counter_ns() - start) / 1e6


def _self_timed_rounds(
    work: Workload, round_ms: Callable[[], float], iterations: int, min_duration_s: float
) -> tuple[list[float], list[float]]:
    """Rounds timed by ``work.round_ms`` (the loop runs until those add up to ``min_duration_s``),
    with the host clock's time of each round beside them."""
    step, memory = work.step, work.memory
    samples: list[float] = []
    host: list[float] = []
    measured_ms = 0.0
    min_ms = min_duration_s * 1000.0
    while len(samples) < iterations or measured_ms < min_ms:
        start = time.perf_counter_ns()
        step()
        host.append((time.perf_counter_ns() - start) / 1e6)
        sample = round_ms()
        samples.append(sample)
        measured_ms += sample
        memory.sample()
    return samples, host


def _timed_rounds(work: Workload, iterations: int, min_duration_s: float) -> list[float]:
    step, sync, memory = work.step, work.sync, work.memory
    samples: list[float] = []
    measured_ms = 0.0
    min_ms = min_duration_s * 1000.0
    if work.cuda_events_on is not None:
        stream = work.cuda_events_on
        begin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        while len(samples) < iterations or measured_ms < min_ms:
            begin.record(stream)
            step()
            end.record(stream)
            end.synchronize()
            sample = begin.elapsed_time(end)
            samples.append(sample)
            measured_ms += sample
        return samples
    while len(samples) < iterations or measured_ms < min_ms:
        start = time.perf_counter_ns()
        step()
        if sync is not None:
            sync()
        sample = (time.perf_counter_ns() - start) / 1e6
        samples.append(sample)
        measured_ms += sample
        memory.sample()
    return samples


def measure(work: Workload, warmup: int, iterations: int, min_duration_s: float) -> dict[str, Any]:
    """Warm up, time the rounds and return one ``batch_results`` entry (JSON-able)."""
    if warmup < 1:
        raise ExecutionError("warmup must be >= 1 (the first call is reported separately)")
    with work.context():
        first_call_ms = _host_round(work.step, work.sync)
        for _ in range(warmup - 1):
            _host_round(work.step, work.sync)
        work.memory.reset()
        gc.collect()
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            host: list[float] | None = None
            before = disturbance.snapshot()
            if work.round_ms is not None:
                samples, host = _self_timed_rounds(work, work.round_ms, iterations, min_duration_s)
            else:
                samples = _timed_rounds(work, iterations, min_duration_s)
            after = disturbance.snapshot()
        finally:
            if gc_was_enabled:
                gc.enable()
        peak_mb = work.memory.peak_mb()
    watched = disturbance.figures(before, after, len(samples))
    latency = summarize(samples)
    verdict, reason = disturbance.verdict(watched, latency["cv"])
    measured_s = math.fsum(samples) / 1000.0
    items = work.batch_size * work.concurrency * len(samples)
    result: dict[str, Any] = {
        "batch_size": work.batch_size,
        "iterations": len(samples),
        "warmup": warmup,
        "first_call_ms": first_call_ms,
        "latency_ms": latency,
        "timing": "cuda_events" if work.cuda_events_on is not None else work.timing,
        "throughput_items_s": items / measured_s if measured_s > 0 else None,
        "concurrency": work.concurrency,
        "measured_s": measured_s,
        "peak_memory_mb": peak_mb,
        "memory_source": work.memory.source,
        "verdict": verdict,
        "verdict_reason": reason,
        "disturbance": watched,
    }
    if host is not None:
        result["host_clock_median_ms"] = percentile(sorted(host), 50)
    result["samples_ms"], result["samples_kept_every"] = bounded_samples(samples)
    result.update(work.extra)
    return result
