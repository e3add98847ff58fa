"""Splitting the global batch into per-rank local batches. Pure: no torch, no clock, no I/O.

Policies (``load_balance`` in the task config):

``none``
    Equal split; the remainder goes one each to the lowest ranks. Never changes.
``proportional``
    Starts equal. At the end of warmup (the profiling phase) the batch is split in proportion to
    each rank's measured throughput, once, and kept for the measured steps.
``dynamic``
    Starts equal. Every ``rebalance_interval`` steps (counted from the first step) the split moves
    *half way* towards the proportional split of the latest measurements (damping), and does not
    move at all while every rank is within a small dead band of its target. Halving the distance
    each time converges geometrically without the overshoot that a full jump on noisy measurements
    gives, and the dead band stops it from trading single samples back and forth on timing noise.
``hybrid``
    ``proportional`` at the end of warmup (a full, undamped jump), then ``dynamic`` every
    ``rebalance_interval`` steps after warmup.

Every split is a list of ints, one per rank, each >= 1, summing exactly to the global batch.
Rounding uses the largest-remainder method over exact rationals, ties going to the lower rank, so
every rank computing a split from the same inputs gets the same answer, and a rank with strictly
higher throughput never gets a smaller share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

POLICIES = ("none", "proportional", "dynamic", "hybrid")
DAMPING = Fraction(1, 2)
DEADBAND_FRACTION = Fraction(1, 50)


def equal_split(global_batch: int, world_size: int) -> list[int]:
    """Split ``global_batch`` evenly over ``world_size`` ranks; the remainder to the lowest ranks."""
    _check_batch(global_batch, world_size)
    base, remainder = divmod(global_batch, world_size)
    return [base + (1 if rank < remainder else 0) for rank in range(world_size)]


def apportion(total: int, weights: Sequence[float | Fraction], minimum: int = 1) -> list[int]:
    """Integer shares of ``total`` in proportion to ``weights``, each at least ``minimum``.

    Every rank first gets ``minimum``; the rest is split by largest remainder. Weights must be
    finite and positive.
    """
    _check_batch(total, len(weights), minimum)
    exact = [_positive_fraction(w) for w in weights]
    rest = total - minimum * len(exact)
    weight_sum = sum(exact, Fraction(0))
    return _largest_remainder([minimum + rest * w / weight_sum for w in exact], total)


def proportional_split(global_batch: int, throughputs: Sequence[float]) -> list[int]:
    """Split ``global_batch`` in proportion to per-rank throughputs (samples/s), each >= 1."""
    return apportion(global_batch, throughputs)


def damped_split(
    global_batch: int,
    current: Sequence[int],
    throughputs: Sequence[float],
    *,
    damping: Fraction = DAMPING,
    deadband: int | None = None,
) -> list[int]:
    """Move ``current`` a fraction ``damping`` of the way to the proportional split.

    Returns ``current`` unchanged when every rank is within ``deadband`` samples of its target
    (default: 2% of the global batch, at least 1).
    """
    if len(current) != len(throughputs):
        raise ValueError(f"{len(current)} current shares but {len(throughputs)} throughputs")
    if sum(current) != global_batch or min(current) < 1:
        raise ValueError(f"current shares {list(current)} are not a valid split of {global_batch}")
    if not 0 < damping <= 1:
        raise ValueError(f"damping must be in (0, 1], got {damping}")
    target = proportional_split(global_batch, throughputs)
    band = deadband if deadband is not None else max(1, math.floor(global_batch * DEADBAND_FRACTION))
    if all(abs(t - c) <= band for t, c in zip(target, current, strict=True)):
        return list(current)
    blended = [(1 - damping) * c + damping * t for c, t in zip(current, target, strict=True)]
    return _largest_remainder(blended, global_batch)


class Balancer:
    """The split schedule of one policy. Every rank runs an identical instance.

    Steps are numbered from 0 over warmup and measured steps together. After each step the caller
    asks :meth:`due`; when it is, the caller measures every rank's throughput over the steps since
    the previous rebalance and passes them, in rank order, to :meth:`rebalance`.
    """

    def __init__(
        self,
        policy: str,
        global_batch: int,
        world_size: int,
        *,
        warmup_steps: int,
        rebalance_interval: int = 0,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown load_balance policy {policy!r}; expected one of {POLICIES}")
        if policy in ("proportional", "hybrid") and warmup_steps < 1:
            raise ValueError(f"{policy} needs warmup_steps >= 1 to profile")
        if policy in ("dynamic", "hybrid") and rebalance_interval < 1:
            raise ValueError(f"{policy} needs rebalance_interval >= 1")
        self.policy = policy
        self.global_batch = global_batch
        self.world_size = world_size
        self.warmup_steps = warmup_steps
        self.rebalance_interval = rebalance_interval
        self.shares = equal_split(global_batch, world_size)
        self.history: list[tuple[int, list[int]]] = [(-1, list(self.shares))]

    def due(self, step: int, total_steps: int) -> bool:
        """Whether a rebalance follows ``step``. Never after the last step."""
        if step >= total_steps - 1 or self.policy == "none":
            return False
        end_of_warmup = step == self.warmup_steps - 1
        if self.policy == "proportional":
            return end_of_warmup
        if self.policy == "dynamic":
            return (step + 1) % self.rebalance_interval == 0
        after_warmup = step - (self.warmup_steps - 1)
        return end_of_warmup or (after_warmup > 0 and after_warmup % self.rebalance_interval == 0)

    def rebalance(self, step: int, throughputs: Sequence[float]) -> list[int]:
        """Apply the policy after ``step`` with per-rank throughputs; returns the new shares."""
        if len(throughputs) != self.world_size:
            raise ValueError(f"expected {self.world_size} throughputs, got {len(throughputs)}")
        jump = self.policy == "proportional" or (self.policy == "hybrid" and step == self.warmup_steps - 1)
        if jump:
            new = proportional_split(self.global_batch, throughputs)
        else:
            new = damped_split(self.global_batch, self.shares, throughputs)
        if new != self.shares:
            self.history.append((step, list(new)))
        self.shares = new
        return list(new)


def _largest_remainder(quotas: Sequence[Fraction], total: int) -> list[int]:
    """Round exact ``quotas`` (summing to ``total``) to ints summing to ``total``; ties to lower ranks."""
    shares = [math.floor(q) for q in quotas]
    leftover = total - sum(shares)
    order = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - shares[i]), i))
    for index in order[:leftover]:
        shares[index] += 1
    return shares


def _check_batch(total: int, world_size: int, minimum: int = 1) -> None:
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    if total < minimum * world_size:
        raise ValueError(f"global batch {total} cannot give {world_size} ranks at least {minimum} sample(s) each")


def _positive_fraction(value: float | Fraction) -> Fraction:
    if isinstance(value, Fraction):
        exact = value
    elif not math.isfinite(value):
        raise ValueError(f"throughput weights must be finite, got {value}")
    else:
        exact = Fraction(value)
    if exact <= 0:
        raise ValueError(f"throughput weights must be positive, got {value}")
    return exact
