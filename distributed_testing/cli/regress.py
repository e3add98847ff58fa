"""Regression verdicts: is a benchmark run slower than its history? Pure (numpy, no I/O).

Method. The statistic is the ratio of median per-iteration latencies, ``run / baseline`` (above 1:
the run is slower). Its confidence interval comes from a two-level bootstrap: each side is a list
of *runs* (one stored result's ``samples_ms`` for one batch size); a resample draws runs with
replacement, then iterations with replacement inside each drawn run, and takes the median of the
pooled draw. Drawing runs first keeps run-to-run variation (another day, a warmer machine) in the
interval, so a baseline whose runs disagree widens the interval instead of raising an alarm. The
interval is the central ``confidence`` percentile interval of ``resamples`` ratios.

Verdicts, with ``t`` the threshold (``Policy.threshold``, default 0.05) and ``[low, high]`` the
interval:

* ``slower``: ``low > 1 + t/2`` and the ratio is at least ``1 + t``: confidently slower by more
  than half the threshold, and by at least the threshold on the best estimate. The only verdict
  that fails a build.
* ``faster``: ``high < 1 / (1 + t/2)`` and the ratio is at most ``1 / (1 + t)``.
* ``unchanged``: the whole interval lies within ``[1 / (1 + t), 1 + t]``.
* ``inconclusive``: anything else: the interval is too wide to tell, and the reason names the
  noisy side (baseline, run or both) with its coefficient of variation; also when either side has
  fewer than ``Policy.min_samples`` iterations.

A false alarm needs the interval's lower end above ``1 + t/2`` (probability below
``(1 - confidence) / 2`` when nothing changed) *and* a point estimate beyond the threshold, so
pure noise almost never reads ``slower``. A single new run carries no run-to-run variation of
its own; when the baseline has several runs, their spread (each run's median over the pooled
median) is applied to the run's resamples too, so the run is judged as one draw of a run.

:func:`fingerprint_diff` lists the environment fields on which two results differ; results whose
fingerprints differ are never compared (see ``cli/compare.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

VERDICTS = ("faster", "slower", "unchanged", "inconclusive")
_CHUNK = 250  # bootstrap resamples evaluated per numpy call (bounds memory)


@dataclass(frozen=True)
class Policy:
    """How sure and how large a change must be. ``threshold``: relative change (0.05 = 5 %);
    ``confidence``: two-sided interval level in (0.5, 1); ``resamples``: bootstrap draws;
    ``min_samples``: fewer iterations on either side give ``inconclusive``; ``seed`` makes the
    bootstrap reproducible."""

    threshold: float = 0.05
    confidence: float = 0.99
    resamples: int = 2000
    min_samples: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 10:
            raise ValueError(f"threshold must be in (0, 10), got {self.threshold}")
        if not 0.5 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0.5, 1), got {self.confidence}")
        if self.resamples < 100:
            raise ValueError(f"resamples must be >= 100, got {self.resamples}")
        if self.min_samples < 2:
            raise ValueError(f"min_samples must be >= 2, got {self.min_samples}")


@dataclass(frozen=True)
class Verdict:
    """One comparison. ``ratio``/``low``/``high`` are None when no interval was computed."""

    verdict: str
    reason: str
    ratio: float | None = None
    low: float | None = None
    high: float | None = None
    baseline_median_ms: float | None = None
    run_median_ms: float | None = None
    baseline_samples: int = 0
    run_samples: int = 0
    baseline_runs: int = 0

    def figures(self) -> str:
        """One line with the numbers behind the verdict (for terminals and JUnit messages)."""
        if self.ratio is None or self.low is None or self.high is None:
            return self.reason
        return (f"median {self.run_median_ms:.4g} ms vs baseline {self.baseline_median_ms:.4g} ms "
                f"({(self.ratio - 1) * 100:+.1f} %, interval {(self.low - 1) * 100:+.1f} % .. "
                f"{(self.high - 1) * 100:+.1f} %; {self.run_samples} vs {self.baseline_samples} iterations "
                f"in {self.baseline_runs} baseline run(s)): {self.reason}")


def _as_runs(runs: Sequence[Sequence[float]]) -> list[np.ndarray]:
    out = [np.asarray(r, dtype=float) for r in runs if len(r) > 0]
    for r in out:
        if r.ndim != 1 or not np.all(np.isfinite(r)) or np.any(r < 0):
            raise ValueError("samples must be finite, non-negative numbers")
    return out


def bootstrap_medians(runs: list[np.ndarray], resamples: int, rng: np.random.Generator) -> np.ndarray:
    """``resamples`` medians of two-level bootstrap draws (runs, then iterations within runs)."""
    k = len(runs)
    lens = np.array([len(r) for r in runs])
    width = int(lens.max())
    matrix = np.full((k, width), np.nan)
    for i, r in enumerate(runs):
        matrix[i, : len(r)] = r
    out = np.empty(resamples)
    for start in range(0, resamples, _CHUNK):
        b = min(_CHUNK, resamples - start)
        pick = rng.integers(0, k, size=(b, k)) if k > 1 else np.zeros((b, 1), dtype=int)
        n = lens[pick]
        idx = (rng.random((b, pick.shape[1], width)) * n[..., None]).astype(int)
        values = matrix[pick[..., None], idx]
        if np.all(lens == width):
            out[start : start + b] = np.median(values.reshape(b, -1), axis=1)
        else:
            values[np.arange(width) >= n[..., None]] = np.nan
            out[start : start + b] = np.nanmedian(values.reshape(b, -1), axis=1)
    return out


def _run_factors(runs: list[np.ndarray]) -> np.ndarray:
    """Each run's median over the pooled median: the run-to-run variation of a history."""
    pooled = float(np.median(np.concatenate(runs)))
    return np.array([float(np.median(r)) / pooled for r in runs]) if pooled > 0 else np.ones(len(runs))


def _cv(runs: list[np.ndarray]) -> float:
    pooled = np.concatenate(runs)
    mean = float(pooled.mean())
    return float(pooled.std(ddof=1)) / mean if mean > 0 and len(pooled) > 1 else 0.0


def _noise_reason(base_meds: np.ndarray, run_meds: np.ndarray, base: list[np.ndarray],
                  run: list[np.ndarray]) -> str:
    def spread(meds: np.ndarray) -> float:
        q1, q9 = np.percentile(meds, [5, 95])
        centre = float(np.median(meds))
        return float(q9 - q1) / centre if centre > 0 else float("inf")

    sb, sr = spread(base_meds), spread(run_meds)
    noisy = "both the baseline and the run are" if min(sb, sr) >= 0.5 * max(sb, sr) else (
        "the baseline is" if sb > sr else "the run is")
    return (f"inconclusive: {noisy} too noisy to tell a {'change'} of this size "
            f"(cv baseline {_cv(base) * 100:.1f} %, run {_cv(run) * 100:.1f} %)")


def compare(baseline: Sequence[Sequence[float]], run: Sequence[Sequence[float]], policy: Policy = Policy()) -> Verdict:
    """Verdict on latency samples: ``baseline`` and ``run`` are lists of runs, each a list of
    per-iteration latencies (ms). Raises ValueError for negative or non-finite samples."""
    base_runs, new_runs = _as_runs(baseline), _as_runs(run)
    n_base = sum(len(r) for r in base_runs)
    n_run = sum(len(r) for r in new_runs)
    counts = {"baseline_samples": n_base, "run_samples": n_run, "baseline_runs": len(base_runs)}
    if n_base < policy.min_samples or n_run < policy.min_samples:
        return Verdict("inconclusive", f"too few iterations to compare (baseline {n_base}, run {n_run}; "
                                       f"at least {policy.min_samples} each)", **counts)
    rng = np.random.default_rng(policy.seed)
    base_meds = bootstrap_medians(base_runs, policy.resamples, rng)
    run_meds = bootstrap_medians(new_runs, policy.resamples, rng)
    if len(new_runs) == 1 and len(base_runs) > 1:
        run_meds = run_meds * rng.choice(_run_factors(base_runs), size=policy.resamples)
    base_median = float(np.median(np.concatenate(base_runs)))
    run_median = float(np.median(np.concatenate(new_runs)))
    if base_median <= 0 or np.any(base_meds <= 0):
        return Verdict("inconclusive", "baseline median is zero; no ratio", **counts)
    ratios = run_meds / base_meds
    tail = (1 - policy.confidence) / 2 * 100
    low, high = (float(x) for x in np.percentile(ratios, [tail, 100 - tail]))
    ratio = run_median / base_median
    up, down = 1 + policy.threshold, 1 / (1 + policy.threshold)
    level = f"{policy.confidence * 100:g} % confidence, threshold {policy.threshold * 100:g} %"
    if low > 1 + policy.threshold / 2 and ratio >= up:
        verdict, reason = "slower", f"slower ({level})"
    elif high < 1 / (1 + policy.threshold / 2) and ratio <= down:
        verdict, reason = "faster", f"faster ({level})"
    elif low >= down and high <= up:
        verdict, reason = "unchanged", f"unchanged: any change is within the threshold ({level})"
    else:
        verdict, reason = "inconclusive", _noise_reason(base_meds, run_meds, base_runs, new_runs)
    return Verdict(verdict, reason, ratio, low, high, base_median, run_median, **counts)


def fingerprint_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(field, a's value, b's value)`` for every environment field that differs, sorted by field
    (``fingerprint_hash`` itself is left out unless nothing else differs). Empty when the hashes
    agree."""
    if a.get("fingerprint_hash") is not None and a.get("fingerprint_hash") == b.get("fingerprint_hash"):
        return []
    keys = sorted((set(a) | set(b)) - {"fingerprint_hash"})
    diff = [(k, a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)]
    return diff or [("fingerprint_hash", a.get("fingerprint_hash"), b.get("fingerprint_hash"))]


def describe_diff(diff: Sequence[tuple[str, Any, Any]]) -> str:
    """``field: a -> b`` pairs, comma separated."""
    return ", ".join(f"{k}: {x!r} -> {y!r}" for k, x, y in diff)
