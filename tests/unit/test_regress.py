"""Regression verdicts on synthetic histories with known shifts and noise (pure, no I/O).

Latencies are log-normal around 10 ms (a benchmark's typical right skew), with a few slow
outliers and a small run-to-run offset, as real runs on a shared machine show."""

from __future__ import annotations

import numpy as np
import pytest

from distributed_testing.cli.regress import Policy, compare, describe_diff, fingerprint_diff

SEEDS = 200
POLICY = Policy(resamples=500)


def _run(rng: np.random.Generator, n: int, sigma: float, shift: float = 1.0) -> list[float]:
    offset = rng.normal(1.0, 0.01)  # run-to-run variation
    samples = 10.0 * shift * offset * rng.lognormal(0.0, sigma, n)
    outliers = rng.random(n) < 0.02
    samples[outliers] *= 1.5
    return samples.tolist()


def _history(seed: int, shift: float, sigma: float = 0.08, n: int = 200, runs: int = 3) -> tuple[list[list[float]], list[list[float]]]:
    rng = np.random.default_rng(seed + 10_000)
    return [_run(rng, n, sigma) for _ in range(runs)], [_run(rng, n, sigma, shift)]


def _verdicts(shift: float, seeds: int = SEEDS) -> dict[str, int]:
    counts: dict[str, int] = {}
    for seed in range(seeds):
        base, run = _history(seed, shift)
        v = compare(base, run, POLICY).verdict
        counts[v] = counts.get(v, 0) + 1
    return counts


def test_a_ten_percent_slowdown_is_found_in_at_least_95_percent_of_seeds() -> None:
    counts = _verdicts(1.10)
    assert counts.get("slower", 0) >= 0.95 * SEEDS, counts
    assert counts.get("faster", 0) == 0, counts


def test_pure_noise_raises_at_most_one_percent_false_alarms() -> None:
    counts = _verdicts(1.0)
    assert counts.get("slower", 0) <= 0.01 * SEEDS, counts
    assert counts.get("faster", 0) <= 0.01 * SEEDS, counts
    assert counts.get("unchanged", 0) >= 0.6 * SEEDS, counts


def test_a_ten_percent_speedup_reads_faster() -> None:
    base, run = _history(1, 1 / 1.10)
    assert compare(base, run, POLICY).verdict == "faster"


def test_a_shift_below_the_threshold_is_not_an_alarm() -> None:
    counts = _verdicts(1.02, seeds=50)
    assert counts.get("slower", 0) <= 1, counts


def test_very_noisy_data_is_inconclusive_and_names_the_noisy_side() -> None:
    rng = np.random.default_rng(3)
    base = [_run(rng, 200, 0.05) for _ in range(3)]
    run = [_run(rng, 30, 1.0)]
    v = compare(base, run, POLICY)
    assert v.verdict == "inconclusive", v
    assert "the run is too noisy" in v.reason
    noisy_base = [_run(rng, 30, 1.0) for _ in range(2)]
    v = compare(noisy_base, [_run(rng, 200, 0.05)], POLICY)
    assert v.verdict == "inconclusive" and "the baseline is too noisy" in v.reason


def test_runs_that_disagree_widen_the_interval_instead_of_alarming() -> None:
    rng = np.random.default_rng(5)
    base = [(np.array(_run(rng, 300, 0.03)) * f).tolist() for f in (0.94, 1.0, 1.06)]
    v = compare(base, [_run(rng, 300, 0.03, shift=1.06)], POLICY)
    assert v.verdict == "inconclusive", v


def test_too_few_samples_is_inconclusive_and_says_so() -> None:
    v = compare([[1.0, 1.1]], [[2.0] * 50], POLICY)
    assert v.verdict == "inconclusive" and "too few iterations" in v.reason


def test_figures_carry_the_numbers() -> None:
    base, run = _history(2, 1.10)
    text = compare(base, run, POLICY).figures()
    assert "baseline" in text and "%" in text and "slower" in text


def test_bad_samples_and_policies_are_refused() -> None:
    with pytest.raises(ValueError, match="finite"):
        compare([[1.0, float("nan")] * 10], [[1.0] * 20])
    with pytest.raises(ValueError, match="confidence"):
        Policy(confidence=1.5)
    with pytest.raises(ValueError, match="threshold"):
        Policy(threshold=0)


def test_the_same_seed_gives_the_same_verdict() -> None:
    base, run = _history(7, 1.04)
    assert compare(base, run, POLICY) == compare(base, run, POLICY)


def test_fingerprint_diff_names_the_fields() -> None:
    a = {"fingerprint_hash": "aa", "torch_threads": 4, "torch_version": "2.13.0", "cpu_model": "X"}
    b = {"fingerprint_hash": "bb", "torch_threads": 2, "torch_version": "2.13.0", "cpu_model": "X"}
    assert fingerprint_diff(a, b) == [("torch_threads", 4, 2)]
    assert "torch_threads: 4 -> 2" in describe_diff(fingerprint_diff(a, b))
    assert fingerprint_diff(a, dict(a)) == []


def test_noisy_data_never_alarms_over_many_seeds() -> None:
    alarms = 0
    for seed in range(50):
        rng = np.random.default_rng(seed)
        v = compare([_run(rng, 30, 1.0) for _ in range(2)], [_run(rng, 30, 1.0)], POLICY)
        alarms += v.verdict in ("slower", "faster")
    assert alarms == 0
