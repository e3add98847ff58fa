"""The bundle flags, through the real command lines: the coordinator's ``--max-bundle-mb``,
``--max-bundle-file-mb`` and ``--bundle-retention`` (and DT_MAX_BUNDLE_MB, DT_MAX_BUNDLE_FILE_MB,
DT_BUNDLE_RETENTION) in a ``run_coordinator.py`` process; the worker's ``--accept-bundles``,
``--sandbox``, ``--task-network`` and ``--cache-max-gb`` (and DT_ACCEPT_BUNDLES, DT_SANDBOX,
DT_TASK_NETWORK, DT_CACHE_MAX_GB) parsed by ``dt-worker``'s parser and run by a real worker:
the cache cap evicts the least recently used blobs, and ``loopback`` hides the host's listeners
that ``host`` reaches."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flags_support import ROOT, Procs, StartWorker, worker_config

from distributed_testing.bundles.cache import BlobCache
from distributed_testing.bundles.digest import of_bytes
from distributed_testing.bundles.upload import UploadError, upload_with_stats
from distributed_testing.errors import ConfigError
from distributed_testing.testing import Rest, run_cluster, start_coordinator_process
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]
NO_SANDBOX = available()


def tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
    return root


def coordinator(procs: Procs, tmp: Path, args: list[str], env: dict[str, str] | None = None) -> tuple[str, str]:
    procs.cwd = ROOT
    _p, port = start_coordinator_process(procs, tmp / "c.duckdb", args=["--db-path", "memory://",
                                         "--admin-key-file", str(tmp / "admin.key"), *args], env=env)
    base = f"http://127.0.0.1:{port}"
    admin = Rest(base, (tmp / "admin.key").read_text().strip())
    return base, str(admin.ok("POST", "/api/v1/keys", json={"role": "submitter", "allow_code": True})["key"])


@pytest.mark.parametrize("how", ["flags", "variables"])
def test_coordinator_bundle_caps_and_retention(procs: Procs, tmp_path: Path, how: str) -> None:
    values = {"--max-bundle-mb": ("DT_MAX_BUNDLE_MB", "0.05"), "--max-bundle-file-mb": ("DT_MAX_BUNDLE_FILE_MB", "0.03"),
              "--bundle-retention": ("DT_BUNDLE_RETENTION", "1")}
    args = [a for flag, (_, v) in values.items() for a in (flag, v)] if how == "flags" else []
    env = {var: v for var, v in values.values()} if how == "variables" else None
    base, key = coordinator(procs, tmp_path, args, env)
    with pytest.raises(UploadError) as info:  # one file over 0.03 MiB
        upload_with_stats(base, key, tree(tmp_path / "big", {"big.bin": b"x" * 40_000}))
    assert info.value.status == 413 and "big.bin" in str(info.value)
    with pytest.raises(UploadError) as info:  # each file under 0.03 MiB, together over 0.05 MiB
        upload_with_stats(base, key, tree(tmp_path / "many", {f"f{i}.bin": bytes([i]) * 20_000 for i in range(3)}))
    assert info.value.status == 413 and "--max-bundle-mb" in str(info.value)
    small = upload_with_stats(base, key, tree(tmp_path / "small", {"a.py": "A = 1\n"}))
    blob = Rest(base, key)
    assert blob.request("GET", f"/api/v1/bundles/{small.digest}")[0] == 200
    deadline = time.monotonic() + 30  # retention 1 s: no task refers to it, so it goes
    while blob.request("GET", f"/api/v1/bundles/{small.digest}")[0] != 404:
        assert time.monotonic() < deadline, "the unused bundle outlived --bundle-retention 1"
        time.sleep(0.2)


def test_coordinator_refuses_bad_bundle_values_with_exit_2(tmp_path: Path) -> None:
    for argv, env, named in ((["--max-bundle-mb", "-1"], {}, "--max-bundle-mb"),
                             ([], {"DT_BUNDLE_RETENTION": "soon"}, "DT_BUNDLE_RETENTION")):
        done = subprocess.run([sys.executable, "run_coordinator.py", "--db-path", "memory://", "--port", "0", *argv],
                              cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and named in done.stderr, (argv, env, done.stderr)


def test_worker_flags_and_variables_parse_as_documented() -> None:
    base = ["--coordinator", "http://127.0.0.1:1", "--api-key", "k"]
    c = worker_config(base)
    assert (c.accept_bundles, c.sandbox, c.task_network, c.cache_max_gb) == (False, "bwrap", "loopback", 10.0)
    c = worker_config([*base, "--accept-bundles", "--sandbox", "none", "--task-network", "host", "--cache-max-gb", "0.5"])
    assert (c.accept_bundles, c.sandbox, c.task_network, c.cache_max_gb) == (True, "none", "host", 0.5)
    c = worker_config(base, {"DT_ACCEPT_BUNDLES": "1", "DT_SANDBOX": "none", "DT_TASK_NETWORK": "none",
                             "DT_CACHE_MAX_GB": "2"})
    assert (c.accept_bundles, c.sandbox, c.task_network, c.cache_max_gb) == (True, "none", "none", 2.0)
    c = worker_config([*base, "--task-network", "loopback"], {"DT_TASK_NETWORK": "host"})
    assert c.task_network == "loopback"  # the flag wins
    for env, named in (({"DT_SANDBOX": "docker"}, "DT_SANDBOX"), ({"DT_TASK_NETWORK": "lan"}, "DT_TASK_NETWORK"),
                       ({"DT_CACHE_MAX_GB": "0"}, "DT_CACHE_MAX_GB")):
        with pytest.raises(ConfigError, match=named):
            worker_config(base, env)
    with pytest.raises(ConfigError, match="--cache-max-gb"):
        worker_config([*base, "--cache-max-gb", "-3"])
    done = subprocess.run([sys.executable, "-m", "distributed_testing.cli.worker", *base, "--sandbox", "docker"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--sandbox" in done.stderr, done.stderr


def test_the_cache_cap_evicts_least_recently_used_first(tmp_path: Path) -> None:
    blobs = {name: name.encode() * 100 for name in ("old", "mid", "new")}  # 300 bytes each
    cache = BlobCache(tmp_path / "cache", max_bytes=650)
    for i, data in enumerate(blobs.values()):
        cache.put(of_bytes(data), data)
        os.utime(cache.path(of_bytes(data)), (1000 + i, 1000 + i))
    cache.touch({of_bytes(blobs["old"])})  # used again: now the most recent
    assert cache.evict(keep=set()) == 300
    assert not cache.has(of_bytes(blobs["mid"])) and cache.has(of_bytes(blobs["old"])) and cache.has(of_bytes(blobs["new"]))
    assert cache.evict(keep=set()) == 0 and cache.size == 600
    small = BlobCache(tmp_path / "cache", max_bytes=100)  # reopened with a smaller cap: what a task keeps stays
    small.evict(keep={of_bytes(blobs["new"])})
    assert small.has(of_bytes(blobs["new"])) and not small.has(of_bytes(blobs["old"]))


@pytest.mark.asyncio
async def test_a_worker_keeps_its_cache_under_cache_max_gb(tmp_path: Path, start_cli_worker: StartWorker) -> None:
    async with run_cluster(tmp_path / "c", workers=0) as c:
        key = await c.create_key("submitter", allow_code=True)
        worker_key = await c.create_key("worker")
        # 0.0000002 GB = 214 bytes: room for one 150-byte data file and the test, not for two
        await start_cli_worker(c, ["--coordinator", c.base_url, "--api-key", worker_key, "--worker-id", "cw",
                                   "--db-path", str(tmp_path / "w" / "outbox.duckdb"), "--accept-bundles",
                                   "--sandbox", "none", "--cache-max-gb", "0.0000002"])
        cache = next((tmp_path / "w").glob("bundles-cw")) / "cache"
        test = "def test_ok():\n    pass\n"
        seen = []
        for name in ("first", "second"):
            data = name[0] * 150
            stats = await asyncio.to_thread(upload_with_stats, c.base_url, key,
                                            tree(tmp_path / name, {"test_x.py": test, "data.txt": data}))
            [tid] = await c.submit({"type": "test", "config": {"test_file": "test_x.py"}, "bundle": stats.digest},
                                   key=key)
            assert (await c.wait(tid, timeout=60))["state"] == "succeeded"
            seen.append(of_bytes(data.encode()))
        left = {p.name for p in cache.glob("??/*")}
        assert seen[1] in left and seen[0] not in left  # the older bundle's data went first
        assert sum(p.stat().st_size for p in cache.glob("??/*")) <= 214 + len(test)


NET_PROBE = '''
import socket

def test_reach():
    try:
        socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
        reached = True
    except OSError:
        reached = False
    server = socket.socket()
    server.bind(("127.0.0.1", 0))  # its own loopback works in every mode but none
    server.listen()
    socket.create_connection(server.getsockname(), timeout=3).close()
    assert reached == {expect}
'''


@pytest.mark.asyncio
@pytest.mark.skipif(NO_SANDBOX is not None, reason=f"no sandbox here: {NO_SANDBOX}")
@pytest.mark.parametrize("network", ["loopback", "host"])
async def test_loopback_hides_the_host_network_that_host_reaches(tmp_path: Path, network: str,
                                                                 start_cli_worker: StartWorker) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        async with run_cluster(tmp_path / "c", workers=0) as c:
            key = await c.create_key("submitter", allow_code=True)
            await start_cli_worker(c, ["--coordinator", c.base_url, "--api-key", await c.create_key("worker"),
                                       "--db-path", str(tmp_path / "w" / "o.duckdb"), "--accept-bundles",
                                       "--task-network", network])
            probe = NET_PROBE.format(port=listener.getsockname()[1], expect=network == "host")
            stats = await asyncio.to_thread(upload_with_stats, c.base_url, key, tree(tmp_path / "p", {"test_n.py": probe}))
            [tid] = await c.submit({"type": "test", "config": {"test_file": "test_n.py"}, "bundle": stats.digest}, key=key)
            done = await c.wait(tid, timeout=90)
            assert done["state"] == "succeeded", done
    finally:
        listener.close()


