"""The worker's state as it grows while a confined child of the operator's tasks runs
(worker/confine.py): files that did not exist when the child started (DuckDB's WAL beside the
outbox, the journal's next segment, the cache directory a first training run makes) must be as
absent as those that did, while a test root inside the state directory stays readable. And a
``--db-path`` in ``HOME`` hides the worker's files there, not ``HOME``."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from probe_support import read_paths, read_pool

from distributed_testing.config import WorkerConfig
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]


async def test_state_made_after_the_child_started_is_hidden(tmp_path: Path) -> None:
    state = tmp_path / "state"
    root = state / "tests"  # the test root inside the state directory: bound back, read-only
    root.mkdir(parents=True)
    (root / "fixture.txt").write_text("operator data")
    db = state / "outbox.duckdb"
    db.write_bytes(b"results")
    cache = tmp_path / "home" / ".cache" / "distributed_testing" / "w0"  # made by the first training run
    config = WorkerConfig(worker_id="w0", db_path=db, test_root=root)
    ex = await read_pool(tmp_path, config, cache)
    try:
        assert cache.is_dir()  # made at start, so that it is hidden from the start
        later = [state / "outbox.duckdb.wal", state / "outbox.duckdb.journal" / "00000002.seg",
                 state / "bundles-w0" / "tasks" / "t2" / "conftest.py", cache / "training" / "t1-a1" / "result.json"]
        for path in later:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("the worker's")
        seen = await read_paths(ex, db, *later, root / "fixture.txt")
        (root / "planted.txt").write_text("new operator data")  # the test root, as the operator changes it
        fixture = await read_paths(ex, root / "planted.txt")
    finally:
        await ex.close()
    assert seen == {**{str(p): None for p in (db, *later)}, str(root / "fixture.txt"): "operator data"}
    assert fixture == {str(root / "planted.txt"): "new operator data"}


async def test_a_db_path_in_home_hides_the_workers_files_not_home(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    home = tmp_path / "home"
    (home / ".cache" / "huggingface").mkdir(parents=True)
    (home / ".cache" / "huggingface" / "model.txt").write_text("weights")
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "root").mkdir()
    db = home / "w.duckdb"
    db.write_bytes(b"results")
    config = WorkerConfig(worker_id="w0", db_path=db, test_root=tmp_path / "root")
    with caplog.at_level(logging.WARNING, logger="distributed_testing.worker.confine"):
        ex = await read_pool(tmp_path, config, home / "w-cache")
    try:
        later = [home / "w.duckdb.journal" / "00000002.seg", home / "bundles-w0" / "tasks" / "t2" / "conftest.py",
                 home / "scratch-w0" / "other" / "tmp" / "mine.txt", home / "w-cache" / "training" / "r.json"]
        for path in later:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("the worker's")
        (home / "notes.txt").write_text("operator's")
        seen = await read_paths(ex, db, *later, home / ".cache" / "huggingface" / "model.txt", home / "notes.txt")
    finally:
        await ex.close()
    assert seen == {**{str(p): None for p in (db, *later)}, str(home / ".cache" / "huggingface" / "model.txt"): "weights",
                    str(home / "notes.txt"): "operator's"}
    assert any("--db-path" in r.message and "directory of its own" in r.message for r in caplog.records)
