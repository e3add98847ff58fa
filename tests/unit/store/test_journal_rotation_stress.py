"""Randomised interleavings of append (sync / sync=False / linger / barrier) and rotate(), with
each flush path (inline, threaded) and preallocation off, smaller than a record, and default:
every rotate() closes exactly what was appended before the call and nothing after it, every
record lands once, all futures resolve, and a sync append, a barrier and a rotation resolve only
after everything they cover was fsync'd."""
from __future__ import annotations

import asyncio
import random
from pathlib import Path

import msgspec
import pytest

from distributed_testing.durable import journal as journal_mod
from distributed_testing.durable.journal import Journal

pytestmark = pytest.mark.timeout(120)


class Put(msgspec.Struct, tag="put", frozen=True):
    key: str
    value: int


def _frame(rec: Put) -> bytes:
    p = msgspec.msgpack.encode(rec)
    return journal_mod._HEADER.pack(len(p), journal_mod.zlib.crc32(p)) + p


@pytest.mark.asyncio
@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("inline", [0, 2, 1000])
@pytest.mark.parametrize("chunk", [0, 64, 4 << 20])
async def test_rotation_boundaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, inline: int,
                                   chunk: int) -> None:
    monkeypatch.setattr(journal_mod, "PREALLOCATE_BYTES", chunk)
    rnd = random.Random(seed)
    written: set[bytes] = set()
    durable: set[bytes] = set()
    real_fsync = journal_mod._fsync_data

    def fsync(fd: int) -> None:
        real_fsync(fd)
        durable.update(written)

    monkeypatch.setattr(journal_mod, "_fsync_data", fsync)

    class J(Journal):  # type: ignore[type-arg]
        def _write_sync(self, frames, rotate, *, fsync=True):  # type: ignore[no-untyped-def]
            written.update(frames)
            return super()._write_sync(frames, rotate, fsync=fsync)

    j = J(tmp_path, Put, name="j", inline_max_frames=inline)
    await j.start()
    appended: list[Put] = []
    rotations: list[tuple[int, int]] = []  # (records appended before the call, closed seq)
    problems: list[str] = []
    futs: list[asyncio.Future[None]] = []

    def check_durable(recs: list[Put], what: str) -> None:
        missing = [r for r in recs if _frame(r) not in durable]
        if missing:
            problems.append(f"{what} resolved before fsync of {missing}")

    async def actor(n: int) -> None:
        for _ in range(n):
            op = rnd.random()
            if op < 0.12:
                before = list(appended)
                closed = await j.rotate()
                rotations.append((len(before), closed))
                check_durable(before, "rotate")
            elif op < 0.17:
                before = list(appended)
                f = j.append([], sync=True)
                futs.append(f)
                f.add_done_callback(lambda f, b=before: f.exception() is None and check_durable(b, "barrier"))
            else:
                recs = [Put(f"r{len(appended) + k}", len(appended) + k) for k in range(rnd.choice([1, 1, 2, 5]))]
                sync = rnd.random() < 0.6
                linger = rnd.choice([0.0, 0.0, 0.001])
                appended.extend(recs)
                f = j.append(recs, sync=sync, linger_s=linger)
                futs.append(f)
                if sync:
                    f.add_done_callback(lambda f, r=recs: f.exception() is None and check_durable(r, "append"))
            for _ in range(rnd.choice([0, 0, 1, 2, 3])):
                await asyncio.sleep(0)
            if rnd.random() < 0.05:
                await asyncio.sleep(0.001)

    await asyncio.gather(*(actor(40) for _ in range(4)))
    await asyncio.gather(*futs)
    await j.close()
    # what each segment holds
    where: dict[str, int] = {}
    for seq, path in j.segments():
        for rec in j._read_file(path):
            assert rec.key not in where, f"duplicate {rec}"
            where[rec.key] = seq
    assert set(where) == {r.key for r in appended}
    for n_before, closed in rotations:
        for r in appended[:n_before]:
            assert where[r.key] <= closed, (r, closed)
        for r in appended[n_before:]:
            assert where[r.key] > closed, (r, closed, n_before)
    assert not problems, problems[:3]
