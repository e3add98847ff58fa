"""A test's tmp_path on a worker is as short as a local one: the sandbox shows the task's directory
at /task, its scratch directory as /task/home and TMPDIR as /task/home/tmp. Before, tmp_path lay under the worker's state
folder (over 120 characters), and a test that binds a unix socket there (anyio's, a server's test
fixtures) failed with "AF_UNIX path too long" on the worker only."""

from __future__ import annotations

import asyncio
import functools
import re
from pathlib import Path

import pytest

from distributed_testing.testing import bundle_cluster
from distributed_testing.testing.suites import plugin_pytest, submitter_env
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(600), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

TESTS = '''\
import socket


def test_sock(tmp_path):
    where = tmp_path / ("d" * 40) / "server.sock"  # about 90 bytes here; 108 is AF_UNIX's limit
    where.parent.mkdir()
    print("TMP_PATH", len(str(tmp_path)))
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(where))
        server.listen()
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(where))
            client.sendall(b"ping")
            conn, _ = server.accept()
            assert conn.recv(4) == b"ping"
            conn.close()
'''


async def test_a_unix_socket_in_tmp_path_binds_there_as_here(tmp_path: Path) -> None:
    tree = tmp_path / "proj"
    tree.mkdir()
    (tree / "test_sock.py").write_text(TESTS)
    python = await asyncio.to_thread(submitter_env, tmp_path / "venv", [])
    run = functools.partial(plugin_pytest, python, tree, "-s")

    local = await asyncio.to_thread(run)
    async with bundle_cluster(tmp_path, workers=1) as (c, key):
        remote = await asyncio.to_thread(run, "--dt-coordinator", c.base_url, env={"DT_API_KEY": key})

    assert "1 passed" in local.stdout, local.stdout[-3000:]
    assert "1 passed" in remote.stdout, remote.stdout[-3000:] + remote.stderr[-2000:]
    here, there = (int(re.search(r"TMP_PATH (\d+)", r.stdout).group(1)) for r in (local, remote))  # type: ignore[union-attr]
    assert there <= here + 12, (here, there)  # /var/tmp for /tmp, dt-task for the local user
