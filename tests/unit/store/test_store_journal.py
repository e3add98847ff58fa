"""The group-commit journal: round trip, group commit, segments, torn tails, failure handling."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path

import msgspec
import pytest

from distributed_testing.durable import journal as journal_mod
from distributed_testing.durable.journal import Journal
from distributed_testing.errors import StoreError

pytestmark = pytest.mark.timeout(10)


class Put(msgspec.Struct, tag="put", frozen=True):
    key: str
    value: int
    extra: dict[str, int] = {}


class Delete(msgspec.Struct, tag="del", frozen=True):
    key: str


Rec = Put | Delete


class Other(msgspec.Struct, tag="other", frozen=True):
    n: int


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The fds the journal fsyncs, in order (the fsyncs still happen)."""
    calls: list[int] = []
    real = journal_mod._fsync_data

    def recording_fsync(fd: int) -> None:
        real(fd)
        calls.append(fd)

    monkeypatch.setattr(journal_mod, "_fsync_data", recording_fsync)
    return calls


def _segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("j-*.log"))


async def _write(directory: Path, n: int) -> None:
    """n records, one flush each, in one segment."""
    async with Journal(directory, Rec, name="j") as j:
        for i in range(n):
            await j.append([Put(f"k{i}", i)])


@pytest.mark.asyncio
async def test_round_trip_in_order(tmp_path: Path) -> None:
    async with Journal(tmp_path, Rec, name="j") as j:
        await j.append([Put("a", 1), Delete("b")])
        await j.append([Put("c", 3, {"x": 1})])
    assert Journal(tmp_path, Rec, name="j").replay() == [Put("a", 1), Delete("b"), Put("c", 3, {"x": 1})]


@pytest.mark.asyncio
async def test_concurrent_appends_share_fsyncs(tmp_path: Path) -> None:
    async with Journal(tmp_path, Rec, name="j") as j:
        await asyncio.gather(*(j.append([Put(f"k{i}", i)]) for i in range(200)))
        assert j.flush_count <= 2

        async def appender(a: int) -> None:
            for i in range(20):
                await j.append([Put(f"a{a}-{i}", i)])

        before = j.flush_count
        await asyncio.gather(*(appender(a) for a in range(50)))
        assert j.flush_count - before <= 1000 // 5
        assert j.record_count == 1200
    assert len(Journal(tmp_path, Rec, name="j").replay()) == 1200


@pytest.mark.asyncio
async def test_future_completes_only_after_fsync(tmp_path: Path, synced: list[int]) -> None:
    async with Journal(tmp_path, Rec, name="j") as j:
        fut = j.append([Put("a", 1)])
        assert not fut.done()
        await fut
        assert len(synced) == 1


@pytest.mark.asyncio
async def test_unsynced_appends_are_written_without_an_fsync_until_a_synced_one(
        tmp_path: Path, synced: list[int]) -> None:
    async with Journal(tmp_path, Rec, name="j") as j:
        await j.append([Put("a", 1)], sync=False)
        await j.append([Delete("a")], sync=False)
        assert synced == []
        # ...but readable at once from the file (a crash of this process loses nothing)
        assert Journal(tmp_path, Rec, name="j").replay() == [Put("a", 1), Delete("a")]
        lazy = j.append([Put("b", 2)], sync=False)
        await j.append([Put("c", 3)])  # one flush carries both, fsync'd once
        assert lazy.done() and len(synced) == 1
    assert Journal(tmp_path, Rec, name="j").replay() == [Put("a", 1), Delete("a"), Put("b", 2), Put("c", 3)]


@pytest.mark.asyncio
async def test_a_rotation_after_unsynced_appends_makes_them_durable(tmp_path: Path, synced: list[int]) -> None:
    async with Journal(tmp_path, Rec, name="j") as j:
        await j.append([Put("a", 1)], sync=False)
        assert synced == []
        assert await j.rotate() == 1
        assert len(synced) == 1
        assert list(j.read_segments(1)) == [Put("a", 1)]
        await j.rotate()
        assert len(synced) == 1  # nothing new to make durable


@pytest.mark.asyncio
async def test_a_lingering_append_shares_the_next_appends_fsync(tmp_path: Path, synced: list[int]) -> None:
    async with Journal(tmp_path, Rec, name="j") as j:
        lingering = j.append([Put("a", 1)], linger_s=30.0)
        await asyncio.sleep(0.05)
        assert not lingering.done() and synced == []  # no flush of its own yet
        await j.append([Put("b", 2)])  # an ordinary append flushes both, with one fsync
        assert lingering.done() and len(synced) == 1
        late = j.append([Put("c", 3)], linger_s=0.05)
        await asyncio.wait_for(late, 5)  # alone, it is flushed once its linger is over
        assert len(synced) == 2
        unflushed = j.append([Put("d", 4)], linger_s=30.0)
    assert unflushed.done()  # close flushes it
    assert Journal(tmp_path, Rec, name="j").replay() == [Put("a", 1), Put("b", 2), Put("c", 3), Put("d", 4)]


@pytest.mark.asyncio
async def test_a_shorter_linger_brings_the_flush_forward(tmp_path: Path, synced: list[int]) -> None:
    async with Journal(tmp_path, Rec, name="j") as j:
        patient = j.append([Put("a", 1)], linger_s=30.0)
        hurried = j.append([Put("b", 2)], linger_s=0.05)
        await asyncio.wait_for(asyncio.gather(patient, hurried), 5)  # not 30 s: the earlier deadline wins
        assert len(synced) == 1


@pytest.mark.asyncio
async def test_reserving_segment_space_happens_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """posix_fallocate may write the whole chunk (glibc's emulation, on NFS say): a flush that
    needs more space runs in a thread, one that fits runs on the loop."""
    monkeypatch.setattr(journal_mod, "PREALLOCATE_BYTES", 64)
    loop_thread = threading.get_ident()
    threads: list[bool] = []
    real = journal_mod._posix_fallocate

    def recording(fd: int, offset: int, length: int) -> None:
        threads.append(threading.get_ident() == loop_thread)
        real(fd, offset, length)

    monkeypatch.setattr(journal_mod, "_posix_fallocate", recording)
    async with Journal(tmp_path, Rec, name="j") as j:
        opened = len(threads)  # the segment's first chunk, reserved when it was opened
        for i in range(3):
            await j.append([Put("k" * 40, i)])  # each record outgrows the 64-byte chunk
        await j.append([Put("x", 9)], sync=False)
        await j.append([Put("y" * 80, 10)], sync=False)
    assert len(threads) > opened + 3 and not any(threads[opened:])
    assert Journal(tmp_path, Rec, name="j").replay()[-1] == Put("y" * 80, 10)


@pytest.mark.asyncio
async def test_empty_append_is_a_barrier(tmp_path: Path) -> None:
    async with Journal(tmp_path, Rec, name="j") as j:
        first = j.append([Put("a", 1)])
        await j.append([])
        assert first.done()


@pytest.mark.asyncio
async def test_records_are_encoded_at_append_time(tmp_path: Path) -> None:
    extra = {"x": 1}
    async with Journal(tmp_path, Rec, name="j") as j:
        fut = j.append([Put("a", 1, extra)])
        extra["x"] = 2
        await fut
    assert Journal(tmp_path, Rec, name="j").replay() == [Put("a", 1, {"x": 1})]


@pytest.mark.asyncio
async def test_unreadable_records_are_refused_at_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DT_JOURNAL_VALIDATE", "1")
    async with Journal(tmp_path, Rec, name="j") as j:
        with pytest.raises(StoreError, match="not a valid record"):
            j.append([Put("a", "not an int")])  # type: ignore[arg-type]
        with pytest.raises(StoreError, match="not a valid record"):
            j.append([Other(1)])  # type: ignore[list-item]
        with pytest.raises(StoreError, match="cannot encode"):
            j.append([object()])  # type: ignore[list-item]
        await j.append([Put("ok", 1)])
    assert Journal(tmp_path, Rec, name="j").replay() == [Put("ok", 1)]


@pytest.mark.asyncio
async def test_rotate_read_and_drop_segments(tmp_path: Path) -> None:
    async with Journal(tmp_path, Rec, name="j") as j:
        assert j.active_segment == 1
        pending = j.append([Put("a", 1)])
        assert await j.rotate() == 1
        assert pending.done()
        await j.append([Put("b", 2)])
        assert await j.rotate() == 2
        await j.append([Put("c", 3)])
        assert list(j.read_segments(2)) == [Put("a", 1), Put("b", 2)]
        with pytest.raises(StoreError, match="active"):
            list(j.read_segments(3))
        j.drop_segments(1)
        assert list(j.read_segments(2)) == [Put("b", 2)]
        assert [p.name for p in _segment_files(tmp_path)] == ["j-00000002.log", "j-00000003.log"]
    # a new journal continues after the leftovers and can apply them
    async with Journal(tmp_path, Rec, name="j") as j:
        assert j.active_segment == 4
        assert list(j.read_segments(3)) == [Put("b", 2), Put("c", 3)]
        j.drop_segments(3)
    assert _segment_files(tmp_path) == []  # the empty active segment is removed on close
    async with Journal(tmp_path, Rec, name="j") as j:
        assert j.active_segment == 1


@pytest.mark.asyncio
async def test_appends_after_a_rotate_call_go_to_the_new_segment(tmp_path: Path) -> None:
    # An owner takes its in-memory copy of the closing segment when it calls rotate() (a
    # checkpoint): a record appended before the writer gets to the rotation must not land in it.
    async with Journal(tmp_path, Rec, name="j") as j:
        j.append([Put("a", 1)])
        first = asyncio.ensure_future(j.rotate())
        second = asyncio.ensure_future(j.rotate())  # asked at the same point: shares the rotation
        await asyncio.sleep(0)  # both rotate() calls have queued; the writer has not run yet
        late = j.append([Put("b", 2)], sync=False)
        third = asyncio.ensure_future(j.rotate())
        await asyncio.sleep(0)
        j.append([Put("c", 3)])
        assert (await first, await second, await third) == (1, 1, 2)
        await late
        assert list(j.read_segments(1)) == [Put("a", 1)]
        assert list(j.read_segments(2, after=1)) == [Put("b", 2)]
    assert j.replay() == [Put("a", 1), Put("b", 2), Put("c", 3)]


@pytest.mark.asyncio
async def test_min_seq_and_after(tmp_path: Path) -> None:
    j: Journal[Rec] = Journal(tmp_path, Rec, name="j")
    await j.start(min_seq=7)
    assert j.active_segment == 7
    for i in range(3):
        await j.append([Put("k", i)])
        await j.rotate()
    assert list(j.read_segments(9, after=7)) == [Put("k", 1), Put("k", 2)]
    await j.close()


@pytest.mark.asyncio
async def test_lifecycle_errors(tmp_path: Path) -> None:
    j: Journal[Rec] = Journal(tmp_path, Rec, name="j")
    with pytest.raises(StoreError, match="not started"):
        j.append([Put("a", 1)])
    await j.start()
    with pytest.raises(StoreError, match="already started"):
        await j.start()
    await j.close()
    await j.close()
    with pytest.raises(StoreError, match="closed"):
        j.append([Put("a", 1)])
    with pytest.raises(ValueError):
        Journal(tmp_path, Rec, name="bad name/")


@pytest.mark.asyncio
async def test_truncated_last_record_is_a_torn_tail(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    await _write(tmp_path, 10)
    (seg,) = _segment_files(tmp_path)
    seg.write_bytes(seg.read_bytes()[:-3])
    with caplog.at_level(logging.WARNING, logger="distributed_testing.durable.journal"):
        got = Journal(tmp_path, Rec, name="j").replay()
    assert got == [Put(f"k{i}", i) for i in range(9)]
    assert str(seg) in caplog.text and "offset" in caplog.text


@pytest.mark.asyncio
@pytest.mark.parametrize("chunk", [journal_mod.PREALLOCATE_BYTES, 100, 0])
async def test_the_active_segment_is_preallocated_and_trimmed_when_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, chunk: int
) -> None:
    # A copy of the active segment is what a crash leaves: the frames, then the preallocated zeros,
    # which end the segment quietly. Closed segments hold their frames and nothing more. Records
    # bigger than a chunk (100 bytes) make the journal reserve more as it goes; 0 never reserves.
    monkeypatch.setattr(journal_mod, "PREALLOCATE_BYTES", chunk)
    records = [Put(f"k{i}", i, {"pad": i} if i % 2 else {f"x{j}": j for j in range(20)}) for i in range(12)]
    async with Journal(tmp_path / "j", Rec, name="j") as j:
        for rec in records[:6]:
            await j.append([rec])
        closed = await j.rotate()
        await j.append(records[6:])
        (tmp_path / "crash").mkdir()
        for seg in _segment_files(tmp_path / "j"):
            (tmp_path / "crash" / seg.name).write_bytes(seg.read_bytes())
    active = tmp_path / "crash" / f"j-{closed + 1:08d}.log"
    assert active.stat().st_size >= (chunk or 0)
    with caplog.at_level(logging.WARNING, logger="distributed_testing.durable.journal"):
        assert Journal(tmp_path / "crash", Rec, name="j").replay() == records
        assert Journal(tmp_path / "j", Rec, name="j").replay() == records
    assert caplog.text == ""
    sizes = [seg.stat().st_size for seg in _segment_files(tmp_path / "j")]
    encoded = [len(msgspec.msgpack.encode(r)) + 8 for r in records]
    assert sizes == [sum(encoded[:6]), sum(encoded[6:])]


@pytest.mark.asyncio
async def test_a_platform_without_posix_fallocate_gets_plain_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_mod, "_posix_fallocate", None)  # as on macOS
    async with Journal(tmp_path, Rec, name="j") as j:
        await j.append([Put("a", 1)])
        assert (tmp_path / "j-00000001.log").stat().st_size == len(msgspec.msgpack.encode(Put("a", 1))) + 8
    assert j.replay() == [Put("a", 1)]


@pytest.mark.asyncio
async def test_a_preallocation_that_fails_partway_is_trimmed_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def half_then_full(fd: int, offset: int, length: int) -> None:
        os.ftruncate(fd, offset + length // 2)  # what a disk running full can leave
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(journal_mod, "_posix_fallocate", half_then_full)
    async with Journal(tmp_path, Rec, name="j") as j:
        await j.append([Put("a", 1)])
    (seg,) = _segment_files(tmp_path)
    assert seg.stat().st_size == len(msgspec.msgpack.encode(Put("a", 1))) + 8
    assert j.replay() == [Put("a", 1)]


@pytest.mark.asyncio
async def test_a_barrier_after_unsynced_appends_makes_them_durable(tmp_path: Path, synced: list[int]) -> None:
    async with Journal(tmp_path, Rec, name="j") as j:
        await j.append([Put("a", 1)], sync=False)
        assert synced == []
        await j.append([])
        assert len(synced) == 1


@pytest.mark.asyncio
async def test_zeros_end_a_segment_quietly_unless_data_follows(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await _write(tmp_path, 2)
    (seg,) = _segment_files(tmp_path)
    frames = seg.read_bytes()
    with caplog.at_level(logging.WARNING, logger="distributed_testing.durable.journal"):
        for tail in (b"\0" * 3, b"\0" * 4096):  # the preallocated end, however short
            seg.write_bytes(frames + tail)
            assert Journal(tmp_path, Rec, name="j").replay() == [Put("k0", 0), Put("k1", 1)]
        assert caplog.text == ""
        seg.write_bytes(frames + b"\0" * 4096 + frames)  # a lost page before data: not a clean end
        assert Journal(tmp_path, Rec, name="j").replay() == [Put("k0", 0), Put("k1", 1)]
    assert "zero-filled gap" in caplog.text


@pytest.mark.asyncio
async def test_a_file_system_without_preallocation_gets_plain_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(fd: int, offset: int, length: int) -> None:
        raise OSError(95, "Operation not supported")

    monkeypatch.setattr(journal_mod.os, "posix_fallocate", refuse)
    async with Journal(tmp_path, Rec, name="j") as j:
        for i in range(3):
            await j.append([Put(f"k{i}", i)])
    assert j.replay() == [Put(f"k{i}", i) for i in range(3)]


@pytest.mark.asyncio
@pytest.mark.parametrize("tail", [b"\x05\x00\x00", b"\x00" * 64])
async def test_short_header_or_zero_fill_is_a_torn_tail(tmp_path: Path, tail: bytes) -> None:
    await _write(tmp_path, 3)
    (seg,) = _segment_files(tmp_path)
    seg.write_bytes(seg.read_bytes() + tail)
    assert Journal(tmp_path, Rec, name="j").replay() == [Put(f"k{i}", i) for i in range(3)]


@pytest.mark.asyncio
async def test_flipped_byte_stops_before_the_corrupt_record(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    await _write(tmp_path, 10)
    (seg,) = _segment_files(tmp_path)
    data = bytearray(seg.read_bytes())
    frame = len(data) // 10  # every frame has the same size here
    data[5 * frame + 10] ^= 0x40
    seg.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="distributed_testing.durable.journal"):
        got = Journal(tmp_path, Rec, name="j").replay()
    assert got == [Put(f"k{i}", i) for i in range(5)]
    assert "crc mismatch" in caplog.text and f"offset {5 * frame}" in caplog.text


@pytest.mark.asyncio
async def test_torn_segment_does_not_hide_later_segments(tmp_path: Path) -> None:
    await _write(tmp_path, 4)
    (seg,) = _segment_files(tmp_path)
    seg.write_bytes(seg.read_bytes()[:-1])
    async with Journal(tmp_path, Rec, name="j") as j:  # the restart after the crash
        await j.append([Put("after", 1)])
    assert Journal(tmp_path, Rec, name="j").replay() == [*(Put(f"k{i}", i) for i in range(3)), Put("after", 1)]


@pytest.mark.asyncio
async def test_record_of_another_type_raises(tmp_path: Path) -> None:
    async with Journal(tmp_path, Other, name="j") as j:
        await j.append([Other(1)])
    with pytest.raises(StoreError, match="does not decode"):
        Journal(tmp_path, Rec, name="j").replay()


@pytest.mark.asyncio
async def test_fsync_failure_fails_pending_and_later_appends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    j: Journal[Rec] = Journal(tmp_path, Rec, name="j")
    await j.start()
    await j.append([Put("a", 1)])
    monkeypatch.setattr(journal_mod, "_fsync_data", broken_fsync)
    futs = [j.append([Put("b", i)]) for i in range(3)]
    results = await asyncio.gather(*futs, return_exceptions=True)
    assert all(isinstance(r, StoreError) and isinstance(r.__cause__, OSError) for r in results)
    with pytest.raises(StoreError, match="failed"):
        j.append([Put("c", 1)])
    with pytest.raises(StoreError, match="failed"):
        await j.rotate()
    with pytest.raises(StoreError, match="failed"):
        await j.close()


@pytest.mark.asyncio
async def test_cancelled_writer_fails_futures_instead_of_hanging(tmp_path: Path) -> None:
    j: Journal[Rec] = Journal(tmp_path, Rec, name="j")
    await j.start()
    fut = j.append([Put("a", 1)])
    assert j._writer is not None
    j._writer.cancel()
    with pytest.raises(StoreError):
        await fut
    with pytest.raises(asyncio.CancelledError):
        await j._writer
    await j.close()  # a cancelled writer is not a write failure: close releases quietly
    with pytest.raises(StoreError, match="writer"):
        j.append([Put("b", 1)])


@pytest.mark.asyncio
async def test_validation_is_off_without_dt_journal_validate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Production default: no decode-back check (it costs as much as the encoding); a record of a
    # wrong field type is written as it is and only a reader finds out.
    monkeypatch.delenv("DT_JOURNAL_VALIDATE", raising=False)
    async with Journal(tmp_path, Rec, name="j") as j:
        await j.append([Put("a", "not an int")])  # type: ignore[arg-type]
    with pytest.raises(StoreError):
        Journal(tmp_path, Rec, name="j").replay()
