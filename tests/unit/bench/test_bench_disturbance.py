"""Verdicts from what the kernel saw during the timed rounds (bench/disturbance.py)."""

from __future__ import annotations

import os
import threading

from distributed_testing.bench import disturbance
from distributed_testing.bench.disturbance import Snapshot, ThreadSample, figures, snapshot, verdict


def _figures(wait_share: float | None, switches: int | None, rounds: int, steal: float | None = 0.0) -> dict:
    return {"wall_s": 1.0, "cpu_s": 1.0, "rounds": rounds, "threads": 2, "run_queue_wait_s": wait_share,
            "wait_share": wait_share, "involuntary_switches": switches, "other_cpu_cores": 1.0, "steal_share": steal}


def test_every_round_waiting_for_a_cpu_is_disturbed_whatever_the_cv() -> None:
    kind, reason = verdict(_figures(0.9, 60, 30), cv=0.1)
    assert kind == "disturbed"
    assert "waited for a CPU 90% of the measured time" in reason and "preempted 60 times in 30 rounds" in reason
    assert f"other processes used 1.0 of {os.cpu_count()} cores" in reason


def test_few_preempted_rounds_leave_the_median_and_say_why() -> None:
    kind, reason = verdict(_figures(0.8, 20, 1000), cv=5.0)
    assert kind == "noisy" and "cv 5.00" in reason and "too few to move the median" in reason


def test_steal_is_disturbance() -> None:
    assert verdict(_figures(0.0, 0, 100, steal=0.2), cv=0.01) == ("disturbed", "the hypervisor stole 20% of the CPU time")


def test_quiet_and_noisy_by_cv_alone() -> None:
    assert verdict(_figures(0.0, 0, 100), cv=0.02)[0] == "quiet"
    assert verdict(_figures(None, None, 100, steal=None), cv=0.5)[0] == "noisy"
    assert disturbance.NOISY_CV == 0.10


def test_figures_count_only_threads_that_worked() -> None:
    before = Snapshot(wall_ns=0, process_cpu_s=0.0, threads={"1": ThreadSample(0, 0, 0), "2": ThreadSample(0, 0, 0)},
                      machine_busy_s=10.0, machine_total_s=20.0, machine_steal_s=0.0)
    after = Snapshot(wall_ns=10**9, process_cpu_s=0.5,
                     threads={"1": ThreadSample(5 * 10**8, 4 * 10**8, 7), "2": ThreadSample(10, 9 * 10**8, 50)},
                     machine_busy_s=11.5, machine_total_s=22.0, machine_steal_s=0.1)
    out = figures(before, after, rounds=10)
    assert out["threads"] == 1 and out["involuntary_switches"] == 7 and out["wait_share"] == 0.4
    assert out["other_cpu_cores"] == 1.0 and out["steal_share"] == 0.05


def test_a_real_snapshot_sees_this_thread_working() -> None:
    before = snapshot()
    stop = threading.Event()
    total = 0
    while not stop.is_set() and total < 3_000_000:
        total += 1
    out = figures(before, snapshot(), rounds=1)
    if before.threads:  # Linux with schedstat
        assert out["threads"] >= 1 and out["wait_share"] is not None
    assert out["wall_s"] > 0 and out["cpu_s"] > 0
