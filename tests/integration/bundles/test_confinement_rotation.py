"""A key or token file replaced while a confined child runs (worker/confine.py): rotated by a
rename (``mv key.new key``) or by a symlink swap (how Kubernetes updates a mounted secret), the new
file must stay out of reach of a long-lived child of the operator's tasks, a custom pool child that
started before the rotation and serves tasks after it. Where the key's directory cannot be hidden
whole (here: it is the test root), the pool replaces a child that started before the rotation, and
the worker says at start that the file is hidden by name only; so does the benchmark executor with
its cached child."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from probe_support import read_paths, read_pool

from distributed_testing.config import WorkerConfig
from distributed_testing.worker import confine
from distributed_testing.worker.executors import TaskContext
from distributed_testing.worker.executors.benchmark import BenchmarkExecutor, BenchmarkOptions
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

FAST = {"model": "mlp", "tiny": True, "iterations": 3, "warmup": 1, "min_duration_s": 0.01}
def _rename_over(path: Path, text: str) -> None:
    """Rotate ``path`` as key managers do: write a new file beside it, rename it over the old one."""
    new = path.with_name(path.name + ".new")
    new.write_text(text)
    os.replace(new, path)


def _kube_secret(folder: Path, name: str, text: str, version: str) -> Path:
    """A secret laid out as a Kubernetes volume holds it (``name -> ..data/name``, ``..data ->
    ..<version>``), or a new version of it swapped in atomically; returns ``folder/name``."""
    (folder / f"..{version}").mkdir(parents=True)
    (folder / f"..{version}" / name).write_text(text)
    (folder / "..data.tmp").symlink_to(f"..{version}")
    os.replace(folder / "..data.tmp", folder / "..data")
    if not (folder / name).is_symlink():
        (folder / name).symlink_to(f"..data/{name}")
    return folder / name


async def test_a_rotated_key_and_a_swapped_secret_stay_hidden_from_a_running_child(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "fixture.txt").write_text("operator data")
    keys = tmp_path / "keys"
    keys.mkdir()
    key = keys / "worker.key"
    key.write_text("dtk_old")
    token = _kube_secret(tmp_path / "secret", "token", "jwt-old", "v1")
    config = WorkerConfig(worker_id="w0", db_path=tmp_path / "state" / "outbox.duckdb", api_key_file=key,
                          token_file=token, test_root=tmp_path / "root")
    fixture = tmp_path / "root" / "fixture.txt"
    ex = await read_pool(tmp_path, config)
    try:
        before = await read_paths(ex, key, token, fixture)
        [pid] = ex.pool.pids
        _rename_over(key, "dtk_new")
        _kube_secret(tmp_path / "secret", "token", "jwt-new", "v2")
        assert (key.read_text(), token.read_text()) == ("dtk_new", "jwt-new")  # rotated for the worker
        after = await read_paths(ex, key, token, fixture, keys / "worker.key.new")
        assert ex.pool.pids == [pid]  # the same child, started before the rotation
    finally:
        await ex.close()
    assert before == {str(key): None, str(token): None, str(fixture): "operator data"}
    assert after == {str(key): None, str(token): None, str(fixture): "operator data",
                     str(keys / "worker.key.new"): None}


async def test_a_key_hidden_by_name_renews_the_pool_child_when_rotated(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "state").mkdir()
    root = tmp_path / "root"  # the test root holds the key: its directory cannot be hidden whole
    root.mkdir()
    key = root / "worker.key"
    key.write_text("dtk_old")
    config = WorkerConfig(worker_id="w0", db_path=tmp_path / "state" / "outbox.duckdb", api_key_file=key,
                          test_root=root)
    with caplog.at_level(logging.WARNING, logger="distributed_testing.worker.confine"):
        ex = await read_pool(tmp_path, config)
    try:
        assert any("--api-key-file" in r.message and "hidden by name" in r.message for r in caplog.records)
        first = await read_paths(ex, key)
        [pid] = ex.pool.pids
        _rename_over(key, "dtk_new")
        second = await read_paths(ex, key)
        [renewed] = ex.pool.pids
        third = await read_paths(ex, key)
        assert ex.pool.pids == [renewed]  # started after the rotation: kept
    finally:
        await ex.close()
    assert first == second == third == {str(key): None}
    assert renewed != pid


async def test_a_key_hidden_by_name_renews_the_cached_benchmark_child_when_rotated(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    root = tmp_path / "root"
    root.mkdir()
    key = root / "worker.key"
    key.write_text("dtk_old")
    config = WorkerConfig(worker_id="w0", db_path=tmp_path / "state" / "outbox.duckdb", api_key_file=key,
                          test_root=root)
    ex = BenchmarkExecutor(BenchmarkOptions(cache_models=True),
                           confinement=confine.for_worker(config, tmp_path / "state" / "outbox-cache"))
    ctx = TaskContext("t1", 1, "benchmark", {"batch_sizes": [1], **FAST}, timeout_s=60)
    pids = []
    try:
        for rotate in (False, True, False):
            if rotate:
                _rename_over(key, "dtk_new")
            outcome = await ex.run(ctx)
            assert outcome.status == "succeeded", outcome.error
            assert ex._child is not None
            pids.append(ex._child.pid)
    finally:
        await ex.close()
    assert pids[0] != pids[1] == pids[2]  # the child started before the rotation was replaced, once
