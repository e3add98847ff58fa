"""``retry.Backoff``: the delay doubles from its base with ±jitter and never passes its cap, the
jitter included (the worker's reconnect logged "retrying in 32.85s" against a documented 30 s)."""

from __future__ import annotations

import random

from distributed_testing.retry import Backoff


def test_no_delay_passes_the_cap_and_those_at_the_cap_stay_spread() -> None:
    at_cap = []
    for seed in range(200):
        b = Backoff(base_s=1.0, factor=2.0, max_s=30.0, jitter=0.2, rng=random.Random(seed))
        delays = [b.delay(n) for n in range(12)]
        assert all(d <= 30.0 for d in delays), (seed, delays)
        for n, d in enumerate(delays[:5]):  # 1, 2, 4, 8, 16: below the cap, ±20 %
            assert 0.8 * 2**n <= d <= 1.2 * 2**n, (seed, n, d)
        at_cap += delays[5:]
    assert min(at_cap) >= 24.0  # 30 s less the jitter
    assert len({round(d, 3) for d in at_cap}) > 100  # a fleet's retries do not all land on 30.000


def test_without_jitter_the_schedule_is_exact() -> None:
    b = Backoff(base_s=0.5, factor=2.0, max_s=3.0, jitter=0.0)
    assert [b.delay(n) for n in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
