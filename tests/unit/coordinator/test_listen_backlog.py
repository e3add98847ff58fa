"""The coordinator's listen backlog follows its descriptor limit: large enough that a restarted
coordinator's fleet reconnecting within a second is queued by the kernel, not dropped (asyncio's
default of 100 overflowed at 10,000 workers), and small enough to fit the reserve kept below
RLIMIT_NOFILE."""

from __future__ import annotations

import pytest

from distributed_testing.coordinator.admission import (
    ACCEPT_BURST,
    LISTEN_BACKLOG_MAX,
    RESERVED_FDS_MIN,
    connection_limits,
    listen_backlog,
)


@pytest.mark.parametrize(("nofile", "backlog"), [(256, ACCEPT_BURST), (1024, 102), (20000, 2000), (65536, 4096),
                                                 (1 << 20, LISTEN_BACKLOG_MAX)])
def test_the_backlog_is_the_files_reserve_between_the_accept_burst_and_the_maximum(nofile: int, backlog: int) -> None:
    assert listen_backlog(nofile) == backlog


@pytest.mark.parametrize("nofile", [256, 1024, 20000, 65536, 1 << 20])
def test_a_full_backlog_accepted_at_once_fits_below_the_limit_with_both_caps_full(nofile: int) -> None:
    lim = connection_limits(0, 0, nofile)
    assert lim.max_connections + lim.max_worker_sessions + listen_backlog(nofile) + RESERVED_FDS_MIN <= nofile
