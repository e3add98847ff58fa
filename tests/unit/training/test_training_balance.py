from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distributed_testing.training.balance import (
    Balancer,
    apportion,
    damped_split,
    equal_split,
    proportional_split,
)

throughput = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def batch_and_throughputs(draw: st.DrawFn) -> tuple[int, list[float]]:
    rates = draw(st.lists(throughput, min_size=1, max_size=16))
    batch = draw(st.integers(min_value=len(rates), max_value=4096))
    return batch, rates


def test_equal_split_gives_remainder_to_lowest_ranks() -> None:
    assert equal_split(10, 4) == [3, 3, 2, 2]
    assert equal_split(8, 2) == [4, 4]
    assert equal_split(3, 3) == [1, 1, 1]


@given(st.integers(1, 16).flatmap(lambda w: st.tuples(st.integers(w, 5000), st.just(w))))
def test_equal_split_properties(case: tuple[int, int]) -> None:
    batch, world = case
    shares = equal_split(batch, world)
    assert sum(shares) == batch
    assert max(shares) - min(shares) <= 1
    assert shares == sorted(shares, reverse=True)


def test_proportional_split_examples() -> None:
    assert proportional_split(8, [3.0, 1.0]) == [6, 2]
    assert proportional_split(9, [2.0, 1.0]) == [6, 3]
    assert proportional_split(4, [1e6, 1.0, 1.0]) == [2, 1, 1]
    assert proportional_split(5, [1.0, 1.0]) == [3, 2]


@given(batch_and_throughputs())
def test_proportional_split_sums_to_batch_and_gives_everyone_a_sample(case: tuple[int, list[float]]) -> None:
    batch, rates = case
    shares = proportional_split(batch, rates)
    assert len(shares) == len(rates)
    assert sum(shares) == batch
    assert min(shares) >= 1


@given(batch_and_throughputs())
def test_proportional_split_is_monotone_in_throughput(case: tuple[int, list[float]]) -> None:
    batch, rates = case
    shares = proportional_split(batch, rates)
    for i, rate_i in enumerate(rates):
        for j, rate_j in enumerate(rates):
            if rate_i > rate_j:
                assert shares[i] >= shares[j]
            if rate_i == rate_j:
                assert abs(shares[i] - shares[j]) <= 1


@given(batch_and_throughputs())
def test_proportional_split_is_within_one_of_the_exact_quota(case: tuple[int, list[float]]) -> None:
    batch, rates = case
    shares = proportional_split(batch, rates)
    exact = [Fraction(r) for r in rates]
    rest = batch - len(rates)
    for share, rate in zip(shares, exact, strict=True):
        quota = 1 + rest * rate / sum(exact)
        assert abs(share - quota) < 1


@given(batch_and_throughputs(), st.floats(1.01, 100.0))
def test_raising_one_ranks_throughput_never_shrinks_its_share(case: tuple[int, list[float]], factor: float) -> None:
    batch, rates = case
    faster = [rates[0] * factor, *rates[1:]]
    assert proportional_split(batch, faster)[0] >= proportional_split(batch, rates)[0]


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_invalid_throughputs_are_rejected(bad: float) -> None:
    with pytest.raises(ValueError, match="throughput weights"):
        proportional_split(10, [1.0, bad])


def test_batch_smaller_than_world_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        equal_split(2, 3)
    with pytest.raises(ValueError, match="at least 1"):
        proportional_split(1, [1.0, 2.0])


def test_apportion_respects_minimum() -> None:
    assert apportion(10, [1.0, 1.0, 100.0], minimum=2) == [2, 2, 6]


def test_damped_split_moves_half_way() -> None:
    # target for throughputs 3:1 over 64 samples is [48, 16]; half way from [32, 32] is [40, 24]
    assert damped_split(64, [32, 32], [3.0, 1.0]) == [40, 24]


def test_damped_split_dead_band_keeps_split() -> None:
    assert damped_split(100, [50, 50], [1.03, 1.0]) == [50, 50]
    assert damped_split(100, [50, 50], [1.2, 1.0]) != [50, 50]


@given(batch_and_throughputs(), st.data())
def test_damped_split_moves_towards_target_and_stays_valid(case: tuple[int, list[float]], data: st.DataObject) -> None:
    batch, rates = case
    current = proportional_split(batch, data.draw(st.lists(throughput, min_size=len(rates), max_size=len(rates))))
    target = proportional_split(batch, rates)
    new = damped_split(batch, current, rates)
    assert sum(new) == batch
    assert min(new) >= 1
    for c, t, n in zip(current, target, new, strict=True):
        assert min(c, t) - 1 <= n <= max(c, t) + 1
    assert sum(abs(n - t) for n, t in zip(new, target, strict=True)) <= sum(
        abs(c - t) for c, t in zip(current, target, strict=True)
    )


@settings(max_examples=100)
@given(batch_and_throughputs())
def test_dynamic_rebalancing_settles_without_oscillating(case: tuple[int, list[float]]) -> None:
    batch, rates = case
    shares = equal_split(batch, len(rates))
    seen = [shares]
    for _ in range(40):
        shares = damped_split(batch, shares, rates)
        if shares == seen[-1]:
            break
        seen.append(shares)
    else:
        pytest.fail(f"no fixed point after 40 rebalances: {seen[-4:]}")
    target = proportional_split(batch, rates)
    band = max(1, batch // 50)
    assert all(abs(s - t) <= band for s, t in zip(shares, target, strict=True))


def _due_steps(balancer: Balancer, total: int) -> list[int]:
    return [s for s in range(total) if balancer.due(s, total)]


def test_schedules() -> None:
    assert _due_steps(Balancer("none", 8, 2, warmup_steps=3), 20) == []
    assert _due_steps(Balancer("proportional", 8, 2, warmup_steps=3), 20) == [2]
    assert _due_steps(Balancer("dynamic", 8, 2, warmup_steps=3, rebalance_interval=5), 20) == [4, 9, 14]
    assert _due_steps(Balancer("hybrid", 8, 2, warmup_steps=3, rebalance_interval=5), 20) == [2, 7, 12, 17]


def test_proportional_jumps_once_and_hybrid_jumps_then_damps() -> None:
    proportional = Balancer("proportional", 64, 2, warmup_steps=3)
    assert proportional.rebalance(2, [3.0, 1.0]) == [48, 16]
    hybrid = Balancer("hybrid", 64, 2, warmup_steps=3, rebalance_interval=5)
    assert hybrid.rebalance(2, [3.0, 1.0]) == [48, 16]
    assert hybrid.rebalance(7, [1.0, 1.0]) == [40, 24]
    assert hybrid.history == [(-1, [32, 32]), (2, [48, 16]), (7, [40, 24])]


def test_dynamic_starts_equal_and_damps() -> None:
    dynamic = Balancer("dynamic", 64, 2, warmup_steps=0, rebalance_interval=2)
    assert dynamic.shares == [32, 32]
    assert dynamic.rebalance(1, [3.0, 1.0]) == [40, 24]
    assert dynamic.rebalance(3, [3.0, 1.0]) == [44, 20]


@pytest.mark.parametrize(
    ("policy", "kwargs", "message"),
    [
        ("greedy", {"warmup_steps": 1}, "unknown load_balance"),
        ("proportional", {"warmup_steps": 0}, "warmup_steps"),
        ("dynamic", {"warmup_steps": 0, "rebalance_interval": 0}, "rebalance_interval"),
    ],
)
def test_balancer_rejects_bad_setup(policy: str, kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Balancer(policy, 8, 2, **kwargs)


def test_rebalance_needs_one_throughput_per_rank() -> None:
    with pytest.raises(ValueError, match="expected 2"):
        Balancer("proportional", 8, 2, warmup_steps=1).rebalance(0, [1.0])
