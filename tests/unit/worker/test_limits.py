"""Resource limits: the pure ready/constrained decisions, the memory offered to tasks, profiles."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from distributed_testing.worker.limits import (
    Limits,
    NvmlUtilisation,
    ResourceMonitor,
    Sample,
    Sampler,
    breaches,
    gpu_unavailable_reason,
    memory_for_tasks_mb,
    profile_settings,
)


def sample(cpu: float = 10.0, mem: float = 40.0, *, available_mb: float = 6000.0, total_mb: float = 10000.0,
           gpu: float | None = None, gpu_error: str | None = None) -> Sample:
    return Sample(cpu_percent=cpu, memory_percent=mem, available_mb=available_mb, total_mb=total_mb,
                  gpu_percent=gpu, gpu_error=gpu_error)


def test_no_limits_is_always_ready_and_inactive() -> None:
    mon = ResourceMonitor(Limits())
    assert not mon.limits.active
    assert mon.update(sample(cpu=100, mem=100, available_mb=0), 0.0) == ("ready", None)


def test_each_breach_is_named_with_value_and_limit() -> None:
    limits = Limits(max_cpu_percent=80, max_memory_percent=75, max_gpu_percent=90, memory_buffer=0.2)
    assert breaches(limits, sample(cpu=80, mem=75, gpu=90, available_mb=2000)) == []  # at the limit is within it
    assert breaches(limits, sample(cpu=93.4, mem=91, gpu=95, available_mb=1000)) == [
        "cpu 93% > limit 80%", "memory 91% > limit 75%", "gpu 95% > limit 90%", "free memory 10% < buffer 20%"]


def test_unreadable_gpu_counts_as_a_breach() -> None:
    assert breaches(Limits(max_gpu_percent=90), sample(gpu_error="NVML error 15")) == [
        "gpu utilisation unreadable: NVML error 15"]
    assert breaches(Limits(), sample(gpu_error="NVML error 15")) == []  # not asked for: ignored


def test_constrained_then_cool_down_then_ready() -> None:
    mon = ResourceMonitor(Limits(max_memory_percent=75, cooldown_s=10))
    assert mon.update(sample(mem=50), 0.0) == ("ready", None)
    assert mon.update(sample(mem=91), 1.0) == ("constrained", "memory 91% > limit 75%")
    state, reason = mon.update(sample(mem=50), 2.0)  # back under: cool-down starts
    assert state == "constrained" and reason == "cooling down for 10.0s more after: memory 91% > limit 75%"
    assert mon.update(sample(mem=50), 11.9)[0] == "constrained"
    assert mon.update(sample(mem=50), 12.0) == ("ready", None)


def test_a_breach_during_the_cool_down_restarts_it() -> None:
    mon = ResourceMonitor(Limits(max_cpu_percent=80, cooldown_s=5))
    mon.update(sample(cpu=99), 0.0)
    mon.update(sample(cpu=10), 1.0)
    assert mon.update(sample(cpu=85), 5.0) == ("constrained", "cpu 85% > limit 80%")
    assert mon.update(sample(cpu=10), 6.0)[0] == "constrained"
    assert mon.update(sample(cpu=10), 10.9)[0] == "constrained"
    assert mon.update(sample(cpu=10), 11.0) == ("ready", None)


def test_zero_cool_down_is_ready_on_the_first_sample_under_the_limits() -> None:
    mon = ResourceMonitor(Limits(max_cpu_percent=50, cooldown_s=0))
    assert mon.update(sample(cpu=60), 0.0)[0] == "constrained"
    assert mon.update(sample(cpu=40), 0.5) == ("ready", None)


@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 5)), max_size=40))
def test_ready_only_after_a_full_cool_down_within_limits(steps: list[tuple[float, float]]) -> None:
    mon = ResourceMonitor(Limits(max_cpu_percent=50, cooldown_s=3))
    now, last_breach, within_since = 0.0, None, None
    for cpu, dt in steps:
        now += dt
        state, reason = mon.update(sample(cpu=cpu), now)
        if cpu > 50:
            last_breach, within_since = now, None
        elif within_since is None:
            within_since = now
        if last_breach is None:
            assert state == "ready"
        elif cpu > 50:
            assert state == "constrained" and reason and reason.startswith("cpu ")
        elif state == "ready":
            assert within_since is not None and now - within_since >= 3
            last_breach = None  # a fresh breach starts a fresh episode
        else:
            assert within_since is not None and now - within_since < 3


def test_memory_for_tasks_is_available_minus_the_buffer() -> None:
    assert memory_for_tasks_mb(Limits(), sample()) is None  # no buffer: nothing reported
    assert memory_for_tasks_mb(Limits(memory_buffer=0.2), sample(available_mb=6000, total_mb=10000)) == 4000
    assert memory_for_tasks_mb(Limits(memory_buffer=0.0), sample(available_mb=6000)) == 6000
    assert memory_for_tasks_mb(Limits(memory_buffer=0.9), sample(available_mb=6000, total_mb=10000)) == 0


@pytest.mark.parametrize(("name", "concurrent", "timeout"), [("benchmark", 1, 3600), ("test", 6, 1800), ("light", 24, 300)])
def test_profiles_preset_concurrency_and_timeout(name: str, concurrent: int, timeout: float) -> None:
    s = profile_settings(name, cores=6)
    assert (s["max_concurrent_tasks"], s["task_timeout_s"]) == (concurrent, timeout)


def test_profile_limits() -> None:
    assert profile_settings("benchmark", 4)["memory_buffer"] == 0.2
    assert profile_settings("test", 4)["max_memory_percent"] == 90
    light = profile_settings("light", 0)  # cores unknown: counted as one
    assert (light["max_concurrent_tasks"], light["max_cpu_percent"], light["max_memory_percent"]) == (4, 95, 90)


def test_sampler_reads_this_machine_without_gpu() -> None:
    s = Sampler(gpu=False).sample()
    assert 0 <= s.cpu_percent <= 100 and 0 < s.memory_percent <= 100
    assert 0 < s.available_mb <= s.total_mb and s.gpu_percent is None and s.gpu_error is None


class FakeNvml:
    """Stands in for libnvidia-ml: per-device utilisation, or an NVML error code."""

    def __init__(self, rates: list[int | None]) -> None:
        self.rates = rates

    def nvmlDeviceGetUtilizationRates(self, handle: ctypes.c_void_p, ref: Any) -> int:  # noqa: N802 (NVML's name)
        rate = self.rates[handle.value or 0]
        if rate is None:
            return 3
        ref._obj.gpu = rate
        return 0


def test_nvml_reading_is_the_busiest_gpu_and_errors_name_the_device() -> None:
    nv = NvmlUtilisation()
    nv._nvml, nv._handles = FakeNvml([20, 85, 40]), [ctypes.c_void_p(i) for i in range(3)]
    assert nv.read() == 85
    nv._nvml = FakeNvml([20, None, 40])
    with pytest.raises(RuntimeError, match=r"GPU 1 \(NVML error 3\)"):
        nv.read()


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="an NVIDIA GPU is visible here")
def test_sampler_asked_for_a_gpu_without_one_reports_why_and_the_limit_counts_it_as_a_breach() -> None:
    s = Sampler(gpu=True).sample()
    assert s.gpu_percent is None and s.gpu_error
    assert breaches(Limits(max_gpu_percent=90), s) == [f"gpu utilisation unreadable: {s.gpu_error}"]
