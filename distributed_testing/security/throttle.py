"""Failed authentications per client in a sliding window: the coordinator's ``--auth-fail-limit``
and the dashboard's sign-in limit share it.

A client with ``limit`` failures in the last ``window_s`` seconds is refused (429) until the
oldest of them leaves the window. Clients are keyed by :func:`address_key`. A proxy the
coordinator trusts (the dashboard mounted in it, which holds the coordinator's per-process proxy
secret) names the client it speaks for in ``CLIENT_HEADER`` beside the secret in
``PROXY_HEADER``; the coordinator then counts that client, not the proxy's own address, so one
guesser behind the dashboard cannot lock out every local client.

Pure: the clock is always a ``now`` argument.
"""

from __future__ import annotations

import functools
import ipaddress
from collections import OrderedDict, deque

MAX_TRACKED_ADDRESSES = 65536  # AuthThrottle forgets the least recently failing beyond this
PROXY_HEADER = "X-DT-Proxy-Secret"
CLIENT_HEADER = "X-DT-Client-Address"


@functools.lru_cache(maxsize=4096)  # asked on every request that carries credentials
def address_key(peer: str) -> str:
    """The unit a client address is throttled by: the address itself, an IPv6 one by its /64
    (one host usually holds a whole /64)."""
    try:
        ip = ipaddress.ip_address(peer)
    except ValueError:
        return peer  # a Unix socket path or an unknown peer: one bucket
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class AuthThrottle:
    """Failed authentications per address in a sliding window of ``window_s`` seconds.

    ``limit`` 0 turns throttling off. At most ``max_tracked`` addresses are remembered (the least
    recently failing is forgotten first), so many addresses cannot grow it without bound."""

    def __init__(self, limit: int, window_s: float, max_tracked: int = MAX_TRACKED_ADDRESSES) -> None:
        if limit < 0 or window_s <= 0:
            raise ValueError(f"limit must be >= 0 and window_s > 0, got {limit}, {window_s}")
        self.limit = limit
        self.window_s = window_s
        self._max_tracked = max_tracked
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def retry_after(self, addr: str, now: float) -> float | None:
        """Seconds until ``addr`` may try again, or None when it may now."""
        if not self.limit:
            return None
        times = self._failures.get(addr)
        if times is None:
            return None
        self._expire(times, now)
        if not times:
            del self._failures[addr]
            return None
        if len(times) < self.limit:
            return None
        return max(times[-self.limit] + self.window_s - now, 0.001)

    def failed(self, addr: str, now: float) -> bool:
        """Count a failure from ``addr``; True when this one reaches the limit (it is now refused)."""
        if not self.limit:
            return False
        times = self._failures.get(addr)
        if times is None:
            times = self._failures[addr] = deque()
            while len(self._failures) > self._max_tracked:
                self._failures.popitem(last=False)
        else:
            self._failures.move_to_end(addr)
            self._expire(times, now)
        times.append(now)
        if len(times) > self.limit:
            times.popleft()  # only the last `limit` decide when the address may try again
        return len(times) == self.limit

    def _expire(self, times: deque[float], now: float) -> None:
        while times and times[0] <= now - self.window_s:
            times.popleft()

    def __len__(self) -> int:
        return len(self._failures)
