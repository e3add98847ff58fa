"""Resource limits: when a worker stops taking work and when it takes work again.

The decision is pure: :class:`ResourceMonitor` turns a :class:`Sample` and the time ``now`` into a
state (``ready`` or ``constrained``) and a reason, so it is tested with made-up samples and no
clock. Sampling is separate: :class:`Sampler` reads psutil (system-wide CPU since the previous
sample, virtual memory) and, when a GPU limit is set, NVML through ctypes; it blocks briefly, so
the agent calls it in a thread.

Rules (``--max-cpu-percent``, ``--max-memory-percent``, ``--max-gpu-percent``, ``--memory-buffer``,
``--limit-cooldown``):

* any limit exceeded -> ``constrained``, the reason names each breach
  (``"memory 91% > limit 75%"``); the coordinator places no new task on a constrained worker;
* all samples back within the limits -> still ``constrained`` ("cooling down") until they have
  stayed within them for ``cooldown_s``; one breach during the cool-down restarts it;
* ``memory_buffer`` (a fraction of total memory) is kept free: less free memory than that is a
  breach, and the memory offered to tasks (:func:`memory_for_tasks_mb`, sent in heartbeats) is
  the available memory minus the buffer;
* ``count_swap`` (``--enable-swap``): swap is memory too. Total memory is RAM + swap, available
  memory is available RAM + free swap, so the memory limit, the buffer and the memory offered to
  tasks all count swap as overflow space. Without it swap counts for nothing. Heartbeats report
  swap use either way (:func:`swap_percent`).

Profiles (``--profile``) are presets of concurrency, task timeout and limits; see
:data:`PROFILES`. Explicit flags always win over a profile.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from dataclasses import dataclass
from typing import Any, Literal

import psutil

log = logging.getLogger(__name__)

State = Literal["ready", "constrained"]
_MIB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """Thresholds in percent (None: no limit); ``memory_buffer`` is a fraction of total memory."""

    max_cpu_percent: float | None = None
    max_memory_percent: float | None = None
    max_gpu_percent: float | None = None
    memory_buffer: float | None = None
    cooldown_s: float = 10.0
    count_swap: bool = False  # --enable-swap: RAM + swap is the memory the limits and the offer see

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.max_cpu_percent, self.max_memory_percent,
                                           self.max_gpu_percent, self.memory_buffer))


@dataclass(frozen=True)
class Sample:
    """One reading. ``gpu_percent`` is the busiest GPU (None: not measured); ``gpu_error`` says
    why a GPU reading that was asked for could not be taken."""

    cpu_percent: float
    memory_percent: float
    available_mb: float
    total_mb: float
    gpu_percent: float | None = None
    gpu_error: str | None = None
    swap_total_mb: float = 0.0
    swap_free_mb: float = 0.0


def swap_percent(s: Sample) -> float | None:
    """Swap in use, in percent; None when the machine has no swap."""
    if s.swap_total_mb <= 0:
        return None
    return round(100.0 * (s.swap_total_mb - s.swap_free_mb) / s.swap_total_mb, 1)


def _memory(limits: Limits, s: Sample) -> tuple[str, float, float, float]:
    """(what it is called, used percent, available MB, total MB): RAM, or RAM + swap with
    ``count_swap``."""
    if not limits.count_swap:
        return "memory", s.memory_percent, s.available_mb, s.total_mb
    total = s.total_mb + s.swap_total_mb
    available = s.available_mb + s.swap_free_mb
    used = 100.0 * (total - available) / total if total > 0 else 0.0
    return "memory+swap", used, available, total


def breaches(limits: Limits, s: Sample) -> list[str]:
    """Each exceeded limit as a short human-readable phrase (empty: within every limit)."""
    out: list[str] = []
    if limits.max_cpu_percent is not None and s.cpu_percent > limits.max_cpu_percent:
        out.append(f"cpu {s.cpu_percent:.0f}% > limit {limits.max_cpu_percent:g}%")
    what, used, available, total = _memory(limits, s)
    if limits.max_memory_percent is not None and used > limits.max_memory_percent:
        out.append(f"{what} {used:.0f}% > limit {limits.max_memory_percent:g}%")
    if limits.max_gpu_percent is not None:
        if s.gpu_error is not None:
            out.append(f"gpu utilisation unreadable: {s.gpu_error}")  # fail safe: no new work
        elif s.gpu_percent is not None and s.gpu_percent > limits.max_gpu_percent:
            out.append(f"gpu {s.gpu_percent:.0f}% > limit {limits.max_gpu_percent:g}%")
    if limits.memory_buffer is not None and total > 0:
        free = available / total
        if free < limits.memory_buffer:
            out.append(f"free {what} {free:.0%} < buffer {limits.memory_buffer:.0%}")
    return out


def memory_for_tasks_mb(limits: Limits, s: Sample) -> float | None:
    """Memory a new task may use: available minus the buffer (both counting swap with
    ``count_swap``); None when no buffer is set."""
    if limits.memory_buffer is None:
        return None
    _, _, available, total = _memory(limits, s)
    return round(max(0.0, available - limits.memory_buffer * total), 1)


class ResourceMonitor:
    """The ready/constrained state machine. Pure: ``update(sample, now)`` is the only input."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.state: State = "ready"
        self.reason: str | None = None
        self._last_breach: str | None = None
        self._within_since: float | None = None

    def update(self, s: Sample, now: float) -> tuple[State, str | None]:
        found = breaches(self.limits, s)
        if found:
            self.state, self._within_since = "constrained", None
            self._last_breach = self.reason = "; ".join(found)
        elif self.state == "constrained":
            if self._within_since is None:
                self._within_since = now
            left = self.limits.cooldown_s - (now - self._within_since)
            if left <= 0:
                self.state, self.reason, self._within_since = "ready", None, None
            else:
                self.reason = f"cooling down for {left:.1f}s more after: {self._last_breach}"
        return self.state, self.reason


# ------------------------------------------------------------------------------------ profiles

ProfileName = Literal["benchmark", "test", "light"]


def profile_settings(name: str, cores: int) -> dict[str, Any]:
    """The WorkerConfig values a ``--profile`` presets (explicit flags override each one).

    ========== ============== ============ ==========================================
    profile    max concurrent task timeout limits
    ========== ============== ============ ==========================================
    benchmark  1              3600 s       memory buffer 0.2 (measurements get the machine)
    test       cores          1800 s       max memory 90 %
    light      4 x cores      300 s        max CPU 95 %, max memory 90 %
    ========== ============== ============ ==========================================
    """
    cores = max(1, cores)
    table: dict[str, dict[str, Any]] = {
        "benchmark": {"max_concurrent_tasks": 1, "task_timeout_s": 3600.0, "memory_buffer": 0.2},
        "test": {"max_concurrent_tasks": cores, "task_timeout_s": 1800.0, "max_memory_percent": 90.0},
        "light": {"max_concurrent_tasks": 4 * cores, "task_timeout_s": 300.0, "max_cpu_percent": 95.0,
                  "max_memory_percent": 90.0},
    }
    return dict(table[name])


PROFILES = ("benchmark", "test", "light")


# ------------------------------------------------------------------------------------ sampling


def swap_unavailable_reason() -> str | None:
    """Why ``--enable-swap`` would change nothing here (None: the machine has swap space)."""
    if psutil.swap_memory().total <= 0:
        return "this machine has no swap space (swap total is 0 bytes)"
    return None


class GpuUnavailable(Exception):
    """No NVIDIA GPU can be read through NVML; the message says why."""


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class NvmlUtilisation:
    """GPU utilisation (percent, busiest device) from libnvidia-ml through ctypes, like
    :func:`~.hardware.nvidia_driver_version`. ``open()`` raises :class:`GpuUnavailable`."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: list[ctypes.c_void_p] = []

    def open(self) -> None:
        libname = "nvml.dll" if sys.platform == "win32" else "libnvidia-ml.so.1"
        try:
            nvml = ctypes.CDLL(libname)
        except OSError as exc:
            raise GpuUnavailable(f"no NVIDIA driver ({libname} not found)") from exc
        rc = nvml.nvmlInit_v2()
        if rc != 0:
            raise GpuUnavailable(f"NVML failed to initialise (NVML error {rc})")
        count = ctypes.c_uint(0)
        rc = nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
        if rc != 0 or count.value == 0:
            nvml.nvmlShutdown()
            raise GpuUnavailable("no NVIDIA GPU visible" if rc == 0 else f"NVML cannot count GPUs (NVML error {rc})")
        handles = []
        for i in range(count.value):
            h = ctypes.c_void_p()
            rc = nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(i), ctypes.byref(h))
            if rc != 0:
                nvml.nvmlShutdown()
                raise GpuUnavailable(f"NVML cannot open GPU {i} (NVML error {rc})")
            handles.append(h)
        self._nvml, self._handles = nvml, handles

    def read(self) -> float:
        """Busiest GPU's utilisation over NVML's last sample period; RuntimeError on failure."""
        if self._nvml is None:
            self.open()
        out = 0.0
        for i, h in enumerate(self._handles):
            u = _Utilization()
            rc = self._nvml.nvmlDeviceGetUtilizationRates(h, ctypes.byref(u))
            if rc != 0:
                raise RuntimeError(f"NVML cannot read the utilisation of GPU {i} (NVML error {rc})")
            out = max(out, float(u.gpu))
        return out

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
            self._nvml, self._handles = None, []


def gpu_unavailable_reason() -> str | None:
    """Why ``--max-gpu-percent`` cannot work here (None: an NVIDIA GPU is readable)."""
    probe = NvmlUtilisation()
    try:
        probe.open()
    except GpuUnavailable as exc:
        return str(exc)
    probe.close()
    return None


class Sampler:
    """Takes :class:`Sample` readings. Blocking (NVML, /proc): call it in a thread."""

    def __init__(self, gpu: bool) -> None:
        self._gpu = NvmlUtilisation() if gpu else None
        self._gpu_error: str | None = None
        psutil.cpu_percent(None)  # primes the system-wide counter: the next call measures from here

    def sample(self) -> Sample:
        vm = psutil.virtual_memory()
        swap = psutil.swap_memory()
        gpu: float | None = None
        gpu_error: str | None = None
        if self._gpu is not None:
            try:
                gpu = self._gpu.read()
            except (GpuUnavailable, RuntimeError) as exc:
                gpu_error = str(exc)
                if gpu_error != self._gpu_error:  # once per distinct failure, not every second
                    log.error("reading GPU utilisation failed: %s", exc)
            self._gpu_error = gpu_error
        return Sample(cpu_percent=psutil.cpu_percent(None), memory_percent=vm.percent,
                      available_mb=vm.available / _MIB, total_mb=vm.total / _MIB,
                      gpu_percent=gpu, gpu_error=gpu_error, swap_total_mb=swap.total / _MIB,
                      swap_free_mb=swap.free / _MIB)

    def close(self) -> None:
        if self._gpu is not None:
            self._gpu.close()
