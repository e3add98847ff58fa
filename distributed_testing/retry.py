"""The project's one backoff/retry implementation: reconnects, requeues, store writes and the
coordinator client's failover use it.

``Backoff.delay(n)`` is pure (jitter comes from an injectable ``random.Random``), so schedules
are testable without sleeping; :func:`retry_async` is the loop that uses it for a number of
attempts, :func:`retry_within` the synchronous one for a time bound (the clock is passed in).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff: ``base_s * factor**n`` with ±``jitter`` fraction, never above ``max_s``:
    at the cap the delay is drawn from ``max_s * (1 - jitter)`` to ``max_s``, so the fleet's
    retries stay spread without any waiting longer than the cap it was told."""

    base_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def delay(self, attempt: int) -> float:
        raw = min(self.max_s, self.base_s * (self.factor ** max(0, attempt)))
        if self.jitter <= 0:
            return raw
        low = max(0.0, raw * (1 - self.jitter))
        return self.rng.uniform(low, min(self.max_s, raw * (1 + self.jitter)))


class RetriesExhausted(Exception):
    """Raised by :func:`retry_async` after the last attempt; the last error is the cause."""


async def retry_async(
    op: Callable[[], Awaitable[T]],
    *,
    backoff: Backoff,
    attempts: int | None,
    retry_on: tuple[type[BaseException], ...],
    what: str,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """Run ``op`` until it succeeds; on an error in ``retry_on`` wait ``backoff.delay(n)`` and
    retry, at most ``attempts`` times in all (None: forever). Other errors propagate at once."""
    n = 0
    while True:
        try:
            return await op()
        except retry_on as exc:
            n += 1
            if attempts is not None and n >= attempts:
                raise RetriesExhausted(f"{what}: gave up after {n} attempts: {exc}") from exc
            d = backoff.delay(n - 1)
            log.warning("%s failed (%s); attempt %d, retrying in %.2fs", what, exc, n, d)
            await sleep(d)


def retry_within(
    op: Callable[[], T],
    *,
    backoff: Backoff,
    within_s: float,
    retry_on: tuple[type[BaseException], ...],
    what: str,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``op`` until it succeeds; on an error in ``retry_on`` wait ``backoff.delay(n)`` and
    retry, starting a new attempt only within ``within_s`` of the first failure (so an attempt
    that itself took long, a long poll, does not use up the bound). Past it the last error
    propagates as it is: it says what failed. Other errors propagate at once."""
    first: float | None = None
    n = 0
    while True:
        try:
            return op()
        except retry_on as exc:
            now = clock()
            first = now if first is None else first
            if now - first >= within_s:
                raise
            d = backoff.delay(n)
            n += 1
            log.info("%s failed (%s); attempt %d, retrying in %.2fs", what, exc, n, d)
            sleep(d)
