"""``coordinator/admission.py``: connection caps below RLIMIT_NOFILE, the per-address throttle of
failed authentications, and the rate-limited log. Pure: the clock is an argument."""

from __future__ import annotations

import logging

import pytest

from distributed_testing.coordinator.admission import (
    ACCEPT_BURST,
    RESERVED_FDS_MIN,
    AuthThrottle,
    RateLimitedLog,
    address_key,
    connection_limits,
)
from distributed_testing.errors import ConfigError


@pytest.mark.parametrize("nofile", [256, 1024, 20000, 1 << 20])
def test_derived_caps_leave_a_reserve_below_the_descriptor_limit(nofile: int) -> None:
    lim = connection_limits(0, 0, nofile)
    assert lim.max_connections > 0 and lim.max_worker_sessions > 0
    assert lim.max_connections + lim.max_worker_sessions <= nofile - max(RESERVED_FDS_MIN, nofile // 10) - ACCEPT_BURST
    assert abs(lim.max_connections - lim.max_worker_sessions) <= 1


def test_a_given_cap_leaves_the_rest_to_the_other() -> None:
    assert connection_limits(100, 0, 1024).max_worker_sessions == 1024 - 102 - ACCEPT_BURST - 100
    assert connection_limits(0, 100, 1024).max_connections == 1024 - 102 - ACCEPT_BURST - 100
    assert connection_limits(10, 20, 1024) == type(connection_limits(10, 20, 1024))(10, 20)


@pytest.mark.parametrize(("conns", "workers", "nofile"), [(1000, 0, 1024), (0, 1000, 1024), (500, 400, 1024),
                                                          (0, 0, 10), (0, 0, 160)])
def test_caps_that_do_not_fit_are_refused_naming_the_flags(conns: int, workers: int, nofile: int) -> None:
    with pytest.raises(ConfigError, match="RLIMIT_NOFILE|ulimit"):
        connection_limits(conns, workers, nofile)


def test_the_throttle_refuses_an_address_at_the_limit_until_its_failures_age_out() -> None:
    t = AuthThrottle(limit=3, window_s=10.0)
    assert [t.failed("a", now) for now in (0.0, 1.0, 2.0)] == [False, False, True]
    assert t.retry_after("a", 2.5) == pytest.approx(7.5)  # the first of the three leaves at 10
    assert t.retry_after("b", 2.5) is None  # another address is not affected
    assert t.retry_after("a", 10.0) is None  # 0.0 has left the window: two failures remain
    assert t.failed("a", 10.5) is True  # and a third one refuses it again
    assert t.retry_after("a", 10.6) == pytest.approx(0.4)  # until 1.0 leaves


def test_old_failures_do_not_add_up() -> None:
    t = AuthThrottle(limit=2, window_s=1.0)
    for now in range(10):  # one a second: never two within the window
        assert t.failed("a", float(now)) is False
        assert t.retry_after("a", now + 0.5) is None


def test_limit_zero_never_refuses() -> None:
    t = AuthThrottle(limit=0, window_s=1.0)
    assert not any(t.failed("a", 0.0) for _ in range(100))
    assert t.retry_after("a", 0.0) is None and len(t) == 0


def test_the_throttle_remembers_a_bounded_number_of_addresses() -> None:
    t = AuthThrottle(limit=2, window_s=60.0, max_tracked=100)
    t.failed("first", 0.0)
    t.failed("first", 0.0)
    for i in range(1000):
        t.failed(f"10.0.{i // 256}.{i % 256}", 1.0)
    assert len(t) == 100
    assert t.retry_after("first", 2.0) is None  # forgotten first, as the least recently failing


def test_addresses_are_throttled_by_host_and_ipv6_by_its_slash_64() -> None:
    assert address_key("192.0.2.7") == "192.0.2.7"
    assert address_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert address_key("2001:db8:1:2:aaaa::1") == address_key("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert address_key("2001:db8:1:3::1") != address_key("2001:db8:1:2::1")
    assert address_key("") == ""


def test_the_rate_limited_log_writes_once_per_interval_and_counts_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    log = RateLimitedLog(logging.getLogger("t"), logging.WARNING, interval_s=10.0)
    with caplog.at_level(logging.WARNING, logger="t"):
        for now in (0.0, 1.0, 2.0, 3.0, 11.0, 12.0):
            log(now, "refused %s", "x")
    assert [r.getMessage() for r in caplog.records] == ["refused x", "refused x (and 3 more like it in the last 11s)"]
