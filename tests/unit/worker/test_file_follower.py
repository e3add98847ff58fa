"""A training node's launcher log reaches the task's output stream as it grows (proc.FileFollower),
read only as a regular file: a link put in its place is not followed."""

from __future__ import annotations

import asyncio
from pathlib import Path

from distributed_testing.worker.executors.proc import FileFollower


def test_what_is_appended_reaches_the_sink_and_stop_reads_the_rest(tmp_path: Path) -> None:
    log, got = tmp_path / "node0.log", bytearray()

    async def go() -> None:
        follower = FileFollower(log, got.extend)  # the file does not exist yet
        log.write_bytes(b"rank 0 up\n")
        while not got:
            await asyncio.sleep(0.01)
        with log.open("ab") as f:
            f.write(b"rank 0 done\n")
        await follower.stop()

    asyncio.run(go())
    assert bytes(got) == b"rank 0 up\nrank 0 done\n"


def test_a_link_in_place_of_the_log_is_not_read(tmp_path: Path) -> None:
    secret, log, got = tmp_path / "secret", tmp_path / "node0.log", bytearray()
    secret.write_bytes(b"not the task's\n")
    log.symlink_to(secret)

    async def go() -> None:
        await FileFollower(log, got.extend).stop()

    asyncio.run(go())
    assert got == b""
