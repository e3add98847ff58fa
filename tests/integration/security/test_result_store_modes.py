"""The worker's outbox (--db-path) holds task output: private to the worker's user. Read as user
``nobody`` in a directory everyone may enter, as the attacker would."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from security_support import can_impersonate, read_as_nobody

from distributed_testing.protocol import messages as m
from distributed_testing.worker.result_store_duckdb import DuckDBResultStore

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
MARKER = "result-only-the-worker-may-read"


@pytest.fixture
def shared() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="dt-outbox-"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def fill(path: Path) -> DuckDBResultStore:
    box = DuckDBResultStore(path)
    await box.open()
    now = time.time()
    await box.add(m.TaskResult(task_id="t1", attempt=1, status="succeeded", started_at=now, finished_at=now,
                               output={"secret": MARKER}))
    await box.checkpoint()  # into the DuckDB file (and its WAL)
    await box.add(m.TaskResult(task_id="t2", attempt=1, status="succeeded", started_at=now, finished_at=now,
                               output={"secret": MARKER}))  # and one left in the journal
    return box


@pytest.mark.skipif(not can_impersonate(), reason="reading as another local user needs root to drop to nobody")
@pytest.mark.parametrize("dir_made_by", ["worker", "operator"])
async def test_another_local_user_cannot_read_the_outbox(shared: Path, dir_made_by: str) -> None:
    if dir_made_by == "operator":
        (shared / "w").mkdir(mode=0o755)
    box = await fill(shared / "w" / "outbox.duckdb")
    try:
        stolen = read_as_nobody(shared)
        assert not any(MARKER.encode() in data for data in stolen.values()), sorted(stolen)
        assert stolen == {}, sorted(stolen)
    finally:
        await box.close()


async def test_outbox_files_are_0600_and_a_new_directory_0700(tmp_path: Path) -> None:
    box = await fill(tmp_path / "new" / "outbox.duckdb")
    try:
        assert mode(tmp_path / "new") == 0o700
        entries = list((tmp_path / "new").rglob("*"))
        assert entries
        for p in entries:
            assert mode(p) == (0o700 if p.is_dir() else 0o600), f"{p}: {mode(p):04o}"
    finally:
        await box.close()


async def test_an_outbox_left_open_by_an_older_version_is_narrowed(tmp_path: Path) -> None:
    path = tmp_path / "outbox.duckdb"
    await (await fill(path)).close()
    for p in [path, *path.with_name(path.name + ".journal").iterdir()]:
        os.chmod(p, 0o644)
    box = DuckDBResultStore(path)
    await box.open()
    try:
        assert mode(path) == 0o600
        assert all(mode(p) == 0o600 for p in path.with_name(path.name + ".journal").iterdir())
    finally:
        await box.close()


async def test_a_fresh_outbox_is_private_without_a_warning_and_an_open_one_is_warned_about(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "w" / "worker.duckdb"
    old_umask = os.umask(0o022)  # the usual umask: DuckDB would create the file 0644
    try:
        with caplog.at_level("WARNING"):
            box = DuckDBResultStore(path)
            await box.open()
            await box.close()
        assert mode(path) == 0o600
        assert "had mode" not in caplog.text, caplog.text  # nothing to tell: this worker just made it
        os.chmod(path, 0o644)  # an operator's copy, found open
        caplog.clear()
        with caplog.at_level("WARNING"):
            box = DuckDBResultStore(path)
            await box.open()
            await box.close()
        assert mode(path) == 0o600
        assert f"state file {path} had mode 0644" in caplog.text
    finally:
        os.umask(old_umask)
