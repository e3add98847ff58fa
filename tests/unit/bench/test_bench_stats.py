"""Statistics of the measurement loop on known numbers (pure)."""

from __future__ import annotations

import math

import pytest

from distributed_testing.bench.measure import percentile, summarize


def test_summarize_one_to_ten() -> None:
    stats = summarize([float(x) for x in range(10, 0, -1)])  # order must not matter
    assert stats["mean"] == pytest.approx(5.5)
    assert stats["median"] == pytest.approx(5.5)
    # numpy.percentile([1..10], 90) == 9.1, 99 -> 9.91 (linear interpolation)
    assert stats["p90"] == pytest.approx(9.1)
    assert stats["p99"] == pytest.approx(9.91)
    assert stats["std"] == pytest.approx(math.sqrt(82.5 / 9))  # sample std, n - 1
    assert stats["cv"] == pytest.approx(math.sqrt(82.5 / 9) / 5.5)
    assert stats["min"] == 1.0
    assert stats["max"] == 10.0


def test_summarize_odd_count_and_outlier() -> None:
    stats = summarize([2.0, 2.0, 2.0, 2.0, 102.0])
    assert stats["median"] == 2.0
    assert stats["mean"] == pytest.approx(22.0)
    assert stats["p90"] == pytest.approx(62.0)  # between 2.0 (index 3) and 102.0 (index 4)
    assert stats["max"] == 102.0


def test_summarize_single_sample_has_zero_spread() -> None:
    stats = summarize([3.0])
    assert stats["std"] == 0.0
    assert stats["cv"] == 0.0
    assert stats["p99"] == 3.0


def test_percentile_edges_and_errors() -> None:
    data = [1.0, 2.0, 3.0, 4.0]
    assert percentile(data, 0) == 1.0
    assert percentile(data, 100) == 4.0
    assert percentile(data, 50) == pytest.approx(2.5)
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile(data, 101)
    with pytest.raises(ValueError):
        summarize([])
