"""Percentiles as the dispatch benchmarks print them; no dependencies, so ``ray_baseline.py`` can
import it from Ray's own environment."""

from __future__ import annotations

import statistics


def pct(xs: list[float], p: float) -> float:
    """The ``p``-th percentile of ``xs`` (nearest rank)."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def summary_ms(xs: list[float]) -> str:
    """``p50 … p90 … p99 … mean …`` of ``xs`` (seconds) in milliseconds."""
    return (f"p50 {pct(xs, 50) * 1e3:.2f} ms  p90 {pct(xs, 90) * 1e3:.2f} ms  p99 {pct(xs, 99) * 1e3:.2f} ms  "
            f"mean {statistics.mean(xs) * 1e3:.2f} ms")
