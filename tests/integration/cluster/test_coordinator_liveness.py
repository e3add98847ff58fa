"""The worker's side of the liveness contract, against real processes: a live coordinator is never
left (the worker pings once per TTL and gets its pongs), a coordinator frozen with SIGSTOP (alive
to TCP, answering nothing) is left within two TTLs of its freeze (the next ping, then its TTL),
and once it resumes the worker registers again. The cut path (heartbeats left unacknowledged,
ended by the kernel's ``TCP_USER_TIMEOUT``) is ``tests/chaos/test_chaos_network_cut.py``."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from pathlib import Path

import aiohttp
import pytest

from distributed_testing.config import ws_url
from distributed_testing.testing import (
    Procs,
    Rest,
    hidden_accelerators,
    run_cluster,
    start_coordinator_process,
    wait_until,
)
from distributed_testing.worker.session import bound_unacknowledged

pytestmark = pytest.mark.timeout(90)

INTERVAL_S, TTL_S = 0.5, 1.5
SLACK_S = 1.5  # log timestamps, a loaded machine


def _log_times(log: Path, needle: str) -> list[float]:
    """Epoch times of the log lines holding ``needle`` (logging's ``%(asctime)s``, milliseconds)."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if needle in line:
            stamp = line[:23]  # "2026-11-25 10:11:12,345"
            out.append(time.mktime(time.strptime(stamp[:19], "%Y-%m-%d %H:%M:%S")) + int(stamp[20:23]) / 1000)
    return out


def test_worker_keeps_a_live_coordinator_and_leaves_a_frozen_one_within_two_ttls(tmp_path: Path,
                                                                                  procs: Procs) -> None:
    coord, port = start_coordinator_process(
        procs, tmp_path / "c.duckdb", args=["--heartbeat-interval", f"{INTERVAL_S:g}", "--worker-ttl", f"{TTL_S:g}"])
    base = f"http://127.0.0.1:{port}"
    rest = Rest(base, (tmp_path / "admin.key").read_text().strip())
    key = rest.create_key("worker")
    log = tmp_path / "worker.log"
    procs.start(["run_worker_example.py", "--coordinator", base, "--worker-id", "w", "--reconnect-interval", "0.2"],
                log, env={**hidden_accelerators(tmp_path), "DT_API_KEY": key}, drop_env=["DT_DB_PATH"])
    wait_until(lambda: bool(_log_times(log, "registered with coordinator")), 60, "the worker to register")

    time.sleep(4 * TTL_S)  # several pings answered: a live coordinator is kept
    assert len(_log_times(log, "registered with coordinator")) == 1, log.read_text()[-3000:]
    assert not _log_times(log, "lost"), log.read_text()[-3000:]

    coord.send_signal(signal.SIGSTOP)
    frozen_at = time.time()
    try:
        wait_until(lambda: bool(_log_times(log, "no pong from the coordinator")), 2 * TTL_S + 10,
                   "the worker to give up on the frozen coordinator")
    finally:
        coord.send_signal(signal.SIGCONT)
    left_after = _log_times(log, "no pong from the coordinator")[0] - frozen_at
    assert left_after <= 2 * TTL_S + SLACK_S, f"the worker left the frozen coordinator after {left_after:.2f}s"
    wait_until(lambda: len(_log_times(log, "registered with coordinator")) >= 2, 30,
               "the worker to register again once the coordinator resumed")


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_worker_socket_gives_up_on_data_unacknowledged_for_the_ttl(tmp_path: Path, loop: str) -> None:
    """``TCP_USER_TIMEOUT`` = TTL lands on the session's real socket, on both event loops a
    worker may run (uvloop hands out its own socket objects)."""
    if not hasattr(socket, "TCP_USER_TIMEOUT"):
        pytest.skip("TCP_USER_TIMEOUT is Linux-only")

    async def scenario() -> int:
        async with run_cluster(tmp_path, workers=0) as c:
            key = await c.create_key("worker")
            async with aiohttp.ClientSession() as http, http.ws_connect(
                    ws_url(c.base_url), headers={"Authorization": f"Bearer {key}"}) as ws:
                bound_unacknowledged(ws, 2.5)
                return int(ws.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT))

    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        assert uvloop.run(scenario()) == 2500
    else:
        assert asyncio.run(scenario()) == 2500
