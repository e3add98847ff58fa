"""The coordinator listens with the backlog its descriptor limit allows (``admission.listen_backlog``),
not asyncio's default of 100: the kernel reports a listening socket's backlog as its Send-Q."""

from __future__ import annotations

import asyncio
import resource
import shutil
import subprocess
from pathlib import Path

import pytest

from distributed_testing.config import CoordinatorConfig
from distributed_testing.coordinator.admission import listen_backlog
from distributed_testing.testing import start_coordinator

pytestmark = [pytest.mark.timeout(60), pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")]


def _listen_queue(port: int) -> int:
    out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    return int(out.split()[2])  # State Recv-Q Send-Q ...: Send-Q is the backlog of a listening socket


def test_the_listening_socket_has_the_derived_backlog(tmp_path: Path) -> None:
    async def main() -> int:
        runner, base = await start_coordinator(CoordinatorConfig(db_path=str(tmp_path / "c.duckdb")), None)
        try:
            return await asyncio.to_thread(_listen_queue, int(base.rsplit(":", 1)[1]))
        finally:
            await runner.cleanup()

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    expect = min(listen_backlog(soft), somaxconn)
    assert expect > 100 or soft < 2000  # this machine's limit makes it more than asyncio's default
    assert asyncio.run(main()) == expect
