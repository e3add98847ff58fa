"""A workload that times its own rounds (OpenVINO's request latency) is measured by that figure."""

from __future__ import annotations

import itertools

from distributed_testing.bench.measure import CpuRssTracker, Workload, measure


def test_round_ms_replaces_the_host_clock_and_the_host_median_is_reported_beside() -> None:
    calls: list[int] = []
    reported = itertools.cycle([2.0, 4.0, 3.0])
    work = Workload(
        step=lambda: calls.append(1),
        batch_size=2,
        memory=CpuRssTracker(),
        round_ms=lambda: next(reported),
        timing="openvino_request_latency",
    )
    result = measure(work, warmup=2, iterations=6, min_duration_s=0.0)
    assert len(calls) == 2 + 6  # warm-up rounds run the step but are not sampled
    assert result["timing"] == "openvino_request_latency"
    assert result["samples_ms"] == [2.0, 4.0, 3.0, 2.0, 4.0, 3.0]
    assert result["latency_ms"]["median"] == 3.0
    assert result["measured_s"] == 0.018
    assert result["throughput_items_s"] == 2 * 6 / 0.018
    assert result["host_clock_median_ms"] > 0.0


def test_self_timed_rounds_run_until_their_own_time_reaches_min_duration() -> None:
    work = Workload(step=lambda: None, batch_size=1, memory=CpuRssTracker(), round_ms=lambda: 100.0, timing="t")
    result = measure(work, warmup=1, iterations=1, min_duration_s=0.5)
    assert result["iterations"] == 5  # 5 x 100 ms of the runtime's time, however fast the host loop was


def test_a_host_timed_workload_says_so_and_has_no_host_median() -> None:
    result = measure(Workload(step=lambda: None, batch_size=1, memory=CpuRssTracker()), 1, 3, 0.0)
    assert result["timing"] == "host_clock"
    assert "host_clock_median_ms" not in result
