"""What unauthenticated clients may cost the coordinator: connections, idle time, failed logins.

* :func:`connection_limits`: how many HTTP connections and worker WebSocket sessions may be open
  at once, below the process's descriptor limit (``RLIMIT_NOFILE``) with room kept for the store,
  the journal and logs. Both HTTP layers refuse a connection over the cap at accept.
* :class:`AuthThrottle` and :func:`address_key` (from ``security/throttle.py``, which the
  dashboard shares): failed authentications per client address in a sliding window; an address
  with ``limit`` failures in the last ``window_s`` is refused (429) until the oldest of them
  leaves the window.
* :class:`RateLimitedLog`: one log line per interval for events an attacker can repeat at will.

Pure apart from ``RateLimitedLog`` writing to a logger: the clock is always a ``now`` argument.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..errors import ConfigError
from ..security.throttle import MAX_TRACKED_ADDRESSES, AuthThrottle, address_key

__all__ = ["MAX_TRACKED_ADDRESSES", "AuthThrottle", "ConnectionLimits", "RateLimitedLog", "address_key",
           "connection_limits", "listen_backlog"]

RESERVED_FDS_MIN = 64  # the store, its journal, log files, PostgreSQL connections, child pipes
ACCEPT_BURST = 100  # connections one event-loop turn may accept (the listen backlog) before any is refused
# The kernel's queue of connections not yet accepted (clamped to net.core.somaxconn). asyncio's
# default of 100 overflowed when a restarted coordinator's 10,000 workers reconnected within a
# second: the kernel dropped the handshakes and each waited out SYN retransmits (1, 2, 4 ... 32 s),
# so the fleet took two minutes to come back (benchmarks/RESULTS.md, "Fleet scale").
LISTEN_BACKLOG_MAX = 4096


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int  # HTTP connections (a worker counts here until it has registered)
    max_worker_sessions: int  # registered worker WebSocket sessions


def connection_limits(max_connections: int, max_worker_sessions: int, nofile: int) -> ConnectionLimits:
    """The caps to enforce given the configured values (0: derive) and the soft descriptor limit
    ``nofile``. Derived caps split evenly what is left after ``max(64, nofile // 10)`` descriptors
    for files plus ``ACCEPT_BURST`` for connections accepted before they can be refused.
    ConfigError naming the flags when the two caps leave less than 64 + ``ACCEPT_BURST``."""
    reserve = max(RESERVED_FDS_MIN, nofile // 10) + ACCEPT_BURST
    usable = nofile - reserve
    if usable < 2:
        raise ConfigError(f"RLIMIT_NOFILE is {nofile}: too few file descriptors to serve anything (raise `ulimit -n`)")
    workers = max_worker_sessions or (usable - max_connections if max_connections else usable // 2)
    conns = max_connections or usable - workers
    floor = RESERVED_FDS_MIN + ACCEPT_BURST
    if conns < 1 or workers < 1 or conns + workers + floor > nofile:
        raise ConfigError(f"--max-connections ({conns}) + --max-worker-sessions ({workers}) must leave at least "
                          f"{floor} of the {nofile} file descriptors RLIMIT_NOFILE allows "
                          "(lower them or raise `ulimit -n`)")
    return ConnectionLimits(conns, workers)


def listen_backlog(nofile: int) -> int:
    """The listen backlog for a soft descriptor limit of ``nofile``: the tenth of it the reserve of
    :func:`connection_limits` keeps for files (they use a handful), between ``ACCEPT_BURST`` and
    ``LISTEN_BACKLOG_MAX``, so connections accepted in one turn before the caps refuse them still
    fit below the limit (``ulimit -n`` 1024: 102; 20,000: 2,000; 65,536 and up: 4,096)."""
    return max(ACCEPT_BURST, min(LISTEN_BACKLOG_MAX, nofile // 10))


class RateLimitedLog:
    """Logs the first event at once, then at most one line per ``interval_s`` counting the
    events in between (an attacker decides how often these happen)."""

    def __init__(self, logger: logging.Logger, level: int, interval_s: float = 10.0) -> None:
        self._log = logger
        self._level = level
        self._interval_s = interval_s
        self._last = float("-inf")
        self._suppressed = 0

    def __call__(self, now: float, msg: str, *args: object) -> None:
        if now - self._last < self._interval_s:
            self._suppressed += 1
            return
        if self._suppressed:
            msg += f" (and {self._suppressed} more like it in the last {now - self._last:.0f}s)"
        self._last, self._suppressed = now, 0
        self._log.log(self._level, msg, *args)
