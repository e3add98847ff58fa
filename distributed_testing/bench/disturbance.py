"""Was a measurement disturbed? What the kernel saw of this process while it timed its rounds.

Why this exists: on a machine with other work, torch's intra-op threads can turn a 0.03 ms call
into a 24 ms one without raising the spread. An OpenMP parallel region finishes only when every
one of its threads has run its share, and the waiting threads spin; when a third runnable process
shares the cores, one of the region's threads is off its CPU for a scheduler slice, the others
spin through theirs, and every round costs a slice. The latencies are then slow *and* steady (cv
0.1), so the spread alone cannot tell. The kernel can: per thread it counts the time spent
runnable but waiting for a CPU (``/proc/self/task/<tid>/schedstat``, second field) and the
involuntary context switches (``nonvoluntary_ctxt_switches`` in ``.../status``).

:func:`snapshot` is taken right before and right after the timed rounds; :func:`assess` turns
the two into ``(verdict, verdict_reason, disturbance)``:

* ``disturbed`` when the measuring threads (those that used CPU in between) waited for a CPU for
  at least ``WAIT_SHARE`` of the measured time *and* were preempted often enough to move the median
  (involuntary switches >= ``HIT_SHARE`` of the rounds; each switch delays at most one round), or
  when the hypervisor stole at least ``STEAL_SHARE`` of the machine's CPU time (``/proc/stat``);
* otherwise ``noisy`` when the latency cv exceeds ``NOISY_CV``;
* otherwise ``quiet``.

``disturbance`` keeps the figures: ``wall_s``, ``cpu_s`` (this process), ``threads`` (the measuring
ones), ``run_queue_wait_s`` (their sum) and ``wait_share`` (the largest single thread's wait over
``wall_s``), ``involuntary_switches``, ``rounds``, ``other_cpu_cores`` (CPU the rest of the machine
used, in cores), ``steal_share``. Where the kernel exposes none of this (not Linux) the figures
are None and only the cv decides.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WAIT_SHARE = 0.10  # a wait spread over every round moves the median by at most about this much
HIT_SHARE = 0.10
STEAL_SHARE = 0.05
NOISY_CV = 0.10
ACTIVE_CPU_S = 0.001  # a thread that used less CPU than this in the window did not measure

_TASKS = Path("/proc/self/task")
_STAT = Path("/proc/stat")
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


@dataclass(frozen=True)
class ThreadSample:
    cpu_ns: int
    wait_ns: int
    involuntary: int


@dataclass(frozen=True)
class Snapshot:
    """One reading of the process's threads and of the machine's CPU counters."""

    wall_ns: int
    process_cpu_s: float
    threads: dict[str, ThreadSample] = field(default_factory=dict)
    machine_busy_s: float | None = None
    machine_total_s: float | None = None
    machine_steal_s: float | None = None


def _thread(tid_dir: Path) -> ThreadSample | None:
    try:
        cpu, wait, _ = (int(x) for x in (tid_dir / "schedstat").read_text().split()[:3])
        status = (tid_dir / "status").read_text()
    except (OSError, ValueError):
        return None  # the thread ended, or the kernel has no schedstat
    involuntary = 0
    for line in status.splitlines():
        if line.startswith("nonvoluntary_ctxt_switches:"):
            involuntary = int(line.split()[1])
    return ThreadSample(cpu, wait, involuntary)


def _machine() -> tuple[float, float, float] | None:
    """(busy, total, steal) CPU seconds of the whole machine since boot, or None."""
    try:
        first = _STAT.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if first[0] != "cpu":
        return None
    ticks = [int(x) for x in first[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    steal = ticks[7] if len(ticks) > 7 else 0
    total = sum(ticks[:8])
    return (total - idle - steal) * _TICK_S, total * _TICK_S, steal * _TICK_S


def snapshot() -> Snapshot:
    """Read every thread of this process and the machine counters (cheap: a few /proc reads)."""
    threads: dict[str, ThreadSample] = {}
    if _TASKS.is_dir():
        for tid_dir in _TASKS.iterdir():
            sample = _thread(tid_dir)
            if sample is not None:
                threads[tid_dir.name] = sample
    machine = _machine()
    return Snapshot(
        wall_ns=time.perf_counter_ns(),
        process_cpu_s=time.process_time(),
        threads=threads,
        machine_busy_s=machine[0] if machine else None,
        machine_total_s=machine[1] if machine else None,
        machine_steal_s=machine[2] if machine else None,
    )


def _machine_figures(before: Snapshot, after: Snapshot, wall_s: float, cpu_s: float) -> dict[str, Any]:
    if before.machine_busy_s is None or after.machine_busy_s is None:
        return {"other_cpu_cores": None, "steal_share": None}
    assert before.machine_total_s is not None and after.machine_total_s is not None
    assert before.machine_steal_s is not None and after.machine_steal_s is not None
    busy = after.machine_busy_s - before.machine_busy_s
    total = after.machine_total_s - before.machine_total_s
    steal = after.machine_steal_s - before.machine_steal_s
    return {
        "other_cpu_cores": round(max(0.0, busy - cpu_s) / wall_s, 2) if wall_s > 0 else None,
        "steal_share": round(steal / total, 3) if total > 0 else None,
    }


def figures(before: Snapshot, after: Snapshot, rounds: int) -> dict[str, Any]:
    """The ``disturbance`` record between two snapshots (see the module docstring)."""
    wall_s = (after.wall_ns - before.wall_ns) / 1e9
    cpu_s = after.process_cpu_s - before.process_cpu_s
    active = []
    for tid, end in after.threads.items():
        start = before.threads.get(tid)
        if start is not None and (end.cpu_ns - start.cpu_ns) / 1e9 >= ACTIVE_CPU_S:
            active.append((end.wait_ns - start.wait_ns, end.involuntary - start.involuntary))
    out: dict[str, Any] = {"wall_s": round(wall_s, 4), "cpu_s": round(cpu_s, 4), "rounds": rounds,
                           "threads": len(active) if after.threads else None}
    if active:
        out["run_queue_wait_s"] = round(sum(w for w, _ in active) / 1e9, 4)
        out["wait_share"] = round(max(w for w, _ in active) / 1e9 / wall_s, 3) if wall_s > 0 else 0.0
        out["involuntary_switches"] = sum(s for _, s in active)
    else:
        out.update(run_queue_wait_s=None, wait_share=None, involuntary_switches=None)
    out.update(_machine_figures(before, after, wall_s, cpu_s))
    return out


def verdict(disturbance: dict[str, Any], cv: float) -> tuple[str, str]:
    """``(verdict, reason)`` from a :func:`figures` record and the latency cv."""
    wait, switches, rounds = disturbance.get("wait_share"), disturbance.get("involuntary_switches"), disturbance["rounds"]
    others = disturbance.get("other_cpu_cores")
    if wait is not None and switches is not None and wait >= WAIT_SHARE and switches >= HIT_SHARE * rounds:
        reason = (f"the measuring threads waited for a CPU {wait:.0%} of the measured time and were preempted "
                  f"{switches} times in {rounds} rounds")
        if others is not None:
            reason += f"; other processes used {others:.1f} of {os.cpu_count()} cores"
        return "disturbed", reason
    steal = disturbance.get("steal_share")
    if steal is not None and steal >= STEAL_SHARE:
        return "disturbed", f"the hypervisor stole {steal:.0%} of the CPU time"
    if wait is not None and switches is not None and wait >= WAIT_SHARE:
        held = (f"the measuring threads waited for a CPU {wait:.0%} of the measured time, but were preempted "
                f"in at most {switches} of {rounds} rounds, too few to move the median")
    else:
        held = "the measuring threads kept their CPU"
    if cv > NOISY_CV:
        return "noisy", f"cv {cv:.2f} (over {NOISY_CV:.2f}); {held}"
    return "quiet", f"cv {cv:.2f}; {held}"
