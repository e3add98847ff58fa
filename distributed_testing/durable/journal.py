"""A generic group-commit, append-only journal of msgspec records, split into segment files.

Used by the coordinator store (the durability point in front of DuckDB) and by the worker's
result outbox. Records are any msgspec-encodable type, usually a tagged union of Structs.

On-disk format: ``<dir>/<name>-<seq:08d>.log`` files, each a sequence of frames
``[u32 length][u32 crc32(payload)][payload]`` (little endian), the payload being the record
encoded as MessagePack. There is no file header; an empty file is a valid empty segment.
The active segment is preallocated (``PREALLOCATE_BYTES`` at a time, zero-filled by the file
system) and frames are written at an offset into that space, so an fsync after a write flushes
data only, not a file size change too; a segment is truncated to its frames when it is closed.
A reader therefore treats an all-zero frame header as the clean end of a segment.

Durability contract: the future returned by :meth:`Journal.append` completes only after the
records' bytes were written and fsync'd; an ``append(..., sync=False)`` (for an owner with
another durable copy, such as the worker's outbox) completes once they are written, which
survives a crash of the process, and a flush holding only such records skips the fsync (the next
synced flush or rotation covers them). An ``append(..., linger_s=L)`` does not start a flush of
its own for up to ``L`` seconds: any other append, a rotation or ``close`` flushes it sooner, so an
owner that needs records durable only together with later ones (a submission answered only with
its outcome) pays one fsync for both when the later ones come within ``L``. One owned writer
task takes everything queued since its last flush, writes it and fsyncs it in one call, then
resolves all of those futures (group commit: while one fsync runs, new appends queue for the
next). A small flush (``inline_max_frames``) runs on the event loop; a bigger one, a rotation, any
flush while frames keep queuing behind the last one (sustained load), or one that must first
reserve more space (``posix_fallocate``, which some file systems such as NFS emulate by writing
zeros) runs in ``asyncio.to_thread``.

Crash behaviour: a crash can leave a torn frame at the end of the segment being written. Readers
stop at the first short or crc-failing frame of a segment, log a warning naming the file and
offset, and go on with the next segment; nothing after a torn frame was ever acknowledged. A
frame whose crc matches but which does not decode as ``record_type`` is not a torn write but a
format mismatch, and raises :class:`~distributed_testing.errors.StoreError`.

After a failed write or fsync the journal is *failed*: the pending futures fail with
``StoreError``, and so does every later ``append``/``rotate``. Retrying an fsync after an error
can report success for data the kernel already dropped, so the owner must restart (reopening
replays what reached the disk).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import os
import re
import struct
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

import msgspec

from ..errors import StoreError
from ..process.aio import wake_within
from .fsutil import fsync_dir

log = logging.getLogger(__name__)

R = TypeVar("R")

_HEADER = struct.Struct("<II")
_MAX_PAYLOAD = 2**32 - 1
_NAME_RE = re.compile(r"^[A-Za-z0-9_.]+$")
_fsync_data = getattr(os, "fdatasync", os.fsync)
_posix_fallocate = getattr(os, "posix_fallocate", None)  # not on macOS: segments just grow there
# A flush of at most this many records is written and fsync'd on the event loop itself: one
# fdatasync (~0.15 ms here) costs less than the two thread hand-offs around it. Measured with
# `python benchmarks/store.py` (seq, one appender): append->durable p50 0.24 ms inline, 0.38 ms
# through a thread. Bigger flushes, which only happen under load, go to a thread so the loop
# keeps reading while the disk works.
INLINE_MAX_FRAMES = 8
# ...but not under sustained load: when frames were queued behind the last flush, appends keep
# coming, and the thread path wins because the loop keeps taking appends during each fsync and they
# share the next one (more records a flush, fewer fsyncs). Measured with benchmarks/dispatch.py:
# always inline 1,649 tasks/s, always in a thread 1,843 tasks/s but p50 latency 3.60 ms against
# 2.81 ms inline.
# DT_JOURNAL_VALIDATE=1 makes every journal check that each record decodes back before accepting
# it (the test suite sets it). Off by default: it costs as much as encoding, about 11 % of the
# coordinator's CPU while tasks are submitted (py-spy --gil, benchmarks/dispatch.py).
VALIDATE_ENV = "DT_JOURNAL_VALIDATE"
# Space reserved ahead of the writes in the active segment. fdatasync after a write that grows the
# file must also commit the new size through the file system's journal; into preallocated space it
# flushes the data alone. Measured on this VM's ext4 (a loop of os.pwrite + os.fdatasync of 300
# bytes): p50 141-154 us appending, 92-115 us into posix_fallocate'd space; `benchmarks/store.py`
# seq append->durable p50 0.27 ms -> 0.24-0.25 ms.
PREALLOCATE_BYTES = 4 << 20


def _resolve(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _fail(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


def _fail_all(futs: Iterable[asyncio.Future[Any]], exc: BaseException) -> None:
    for fut in futs:
        _fail(fut, exc)


class Journal(Generic[R]):
    """Append-only, segmented, group-committed journal of ``record_type`` records.

    Lifecycle: construct, ``await start()`` (or ``async with``), ``append``/``rotate`` from the
    event loop, ``await close()``. ``read_segments``, ``drop_segments`` and ``replay`` do blocking
    file I/O: call them from a worker thread (``asyncio.to_thread``), never on the event loop.

    ``flush_count`` counts write+fsync calls, ``record_count`` the records they carried and
    ``byte_count`` their bytes; with many concurrent appenders ``flush_count`` is much smaller than the number of ``append`` calls.
    """

    def __init__(self, directory: Path, record_type: Any, *, name: str = "journal", validate: bool | None = None,
                 inline_max_frames: int = INLINE_MAX_FRAMES) -> None:
        if not _NAME_RE.match(name):
            raise ValueError(f"journal name must match {_NAME_RE.pattern}: {name!r}")
        self.directory = Path(directory)
        self.name = name
        self._seg_re = re.compile(rf"^{re.escape(name)}-(\d{{8,}})\.log$")
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(record_type)
        self._validate = validate if validate is not None else os.environ.get(VALIDATE_ENV) == "1"
        self.inline_max_frames = inline_max_frames
        self._backlog = False  # frames were already queued when the last flush ended: under load
        self._sync = False  # a queued frame was appended with sync=True: the next flush fsyncs
        self._frames: list[bytes] = []
        self._waiters: list[asyncio.Future[None]] = []
        # (future, frames queued, waiters queued) at each rotate() call: what the closing segment holds
        self._rotations: list[tuple[asyncio.Future[int], int, int]] = []
        self._wake = asyncio.Event()
        self._linger: asyncio.TimerHandle | None = None  # wakes the writer for lingering appends
        self._writer: asyncio.Task[None] | None = None
        self._fd: int | None = None
        self._offset = 0  # bytes of frames in the active segment
        self._allocated = 0  # bytes preallocated in it
        self._can_preallocate = True  # false once the file system (or a full disk) refused
        self._unsynced = False  # the active segment holds bytes written without an fsync since
        self._seq = 0
        self._failure: BaseException | None = None
        self._closing = False
        self.flush_count = 0
        self.record_count = 0
        self.byte_count = 0  # frame bytes written (headers included)

    # ------------------------------------------------------------------ lifecycle

    @property
    def active_segment(self) -> int:
        """Number of the segment appends currently go to (0 before ``start``)."""
        return self._seq

    async def start(self, *, min_seq: int = 1) -> None:
        """Create the directory, open a new active segment, start the writer.

        The new segment is numbered after every existing one and at least ``min_seq`` (an owner
        that remembers the last segment it consumed passes that + 1, so numbers never repeat).
        """
        if self._writer is not None:
            raise StoreError(f"journal {self.directory} already started")
        if self._closing:
            raise StoreError(f"journal {self.directory} is closed")
        try:
            await asyncio.to_thread(self._start_sync, min_seq)
        except OSError as exc:  # an unwritable or full directory: name it
            raise StoreError(f"journal {self.directory}: cannot start: {exc}") from exc
        self._writer = asyncio.get_running_loop().create_task(self._run(), name=f"journal-writer:{self.name}")
        self._writer.add_done_callback(self._writer_done)

    def _start_sync(self, min_seq: int) -> None:
        if not self.directory.is_dir():
            self.directory.mkdir(mode=0o700, parents=True)  # private: records hold payloads and results
            fsync_dir(self.directory.parent)  # make the new directory's own entry durable
        existing = [seq for seq, _ in self.segments()]
        self._seq = max(max(existing, default=0) + 1, min_seq)
        self._fd = self._open_segment(self._seq)

    async def close(self) -> None:
        """Flush everything appended so far, stop the writer and close the active segment.

        An active segment left empty is deleted. Idempotent. Raises ``StoreError`` if the final
        flush failed (the futures of that flush fail too).
        """
        if self._closing:
            return
        self._closing = True
        self._wake.set()
        if self._writer is not None:
            await asyncio.wait([self._writer])  # its outcome is recorded by _writer_done
        await asyncio.to_thread(self._close_sync)
        if self._failure is not None and not isinstance(self._failure, asyncio.CancelledError):
            raise StoreError(f"journal {self.directory} failed: {self._failure}") from self._failure

    def _close_sync(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        empty = self._offset == 0
        try:
            self._trim(fd)
        finally:
            os.close(fd)
        if empty and self._failure is None:
            self._segment_path(self._seq).unlink()
            fsync_dir(self.directory)

    async def watch(self) -> None:
        """Wait while the journal works; return once it was closed, raise ``StoreError`` (the
        cause chained) as soon as its writer stopped any other way: a failed write or fsync, or a
        crash. Cancelling the wait leaves the writer alone."""
        if self._writer is None:
            raise StoreError(f"journal {self.directory} is not started")
        await asyncio.wait([self._writer])
        failure = self._failure
        if failure is not None and not isinstance(failure, asyncio.CancelledError):
            raise StoreError(f"journal {self.directory} failed: {failure}") from failure
        if not self._closing:
            raise StoreError(f"journal {self.directory}: the writer stopped{f' ({failure!r})' if failure else ''}")

    async def __aenter__(self) -> Journal[R]:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ writing

    def append(self, records: list[R], *, sync: bool = True, linger_s: float = 0.0) -> asyncio.Future[None]:
        """Queue ``records``; the returned future completes once they are written and fsync'd
        (with ``sync=False``: once written; see the module doc). With ``linger_s`` > 0 the flush
        that takes them starts within ``linger_s`` rather than at once (see the module doc).

        Call from the event loop thread (plain function, not a coroutine). Records are encoded
        here, so later mutation of their contents does not change what is written. An empty list
        is a barrier: its future completes once everything appended before it is durable.
        With ``validate`` (default: ``DT_JOURNAL_VALIDATE=1`` in the environment, as in the test
        suite) each record is also decoded back as ``record_type``, so a record that could never be
        read back (a Struct built with a wrong field type) is refused here. Raises ``StoreError`` if the journal is not started, closed or failed, or a record
        cannot be encoded.
        """
        self._check_usable()
        frames: list[bytes] = []
        # bound once: this loop runs for every record the coordinator writes
        encode, validate, pack, crc, add = self._encoder.encode, self._validate, _HEADER.pack, zlib.crc32, frames.append
        for rec in records:
            try:
                payload = encode(rec)
            except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
                raise StoreError(f"cannot encode journal record {type(rec).__name__}: {exc}") from exc
            if validate:
                self._check_decodes(rec, payload)
            if len(payload) > _MAX_PAYLOAD:
                raise StoreError(f"journal record of {len(payload)} bytes exceeds the 4 GiB frame limit")
            add(pack(len(payload), crc(payload)) + payload)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._frames.extend(frames)
        self._waiters.append(fut)
        self._sync = self._sync or sync
        self._linger = wake_within(self._wake, self._linger, linger_s)
        return fut

    def _check_decodes(self, rec: object, payload: bytes) -> None:
        # A record that encodes but does not decode as record_type (a Struct built with a wrong
        # field type) would poison every later read of its segment; refuse it at the door.
        try:
            self._decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise StoreError(f"journal record {type(rec).__name__} is not a valid record: {exc}") from exc

    async def rotate(self) -> int:
        """Close the active segment and start a new one; return the closed segment's number.

        Everything appended before this call is in the closed segment (or an earlier one) and is
        durable when this returns; appends made afterwards go to the new segment.
        """
        self._check_usable()
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._rotations.append((fut, len(self._frames), len(self._waiters)))
        self._wake.set()
        return await fut

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise StoreError(f"journal {self.directory} failed: {self._failure}") from self._failure
        if self._closing:
            raise StoreError(f"journal {self.directory} is closed")
        if self._writer is None:
            raise StoreError(f"journal {self.directory} is not started")

    async def _run(self) -> None:
        """The single writer: flush queued frames (and rotate when asked) until closed."""
        while True:
            idle = not (self._frames or self._waiters or self._rotations)
            if idle or not self._wake.is_set():  # nothing queued, or only lingering appends
                if idle and self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._flush_once()
            if self._failure is not None:
                return

    def _writer_done(self, task: asyncio.Task[None]) -> None:
        # Runs however the writer ended (even cancelled before its first step): nothing may hang.
        if not task.cancelled() and task.exception() is not None:
            self._failure = task.exception()
            log.error("journal %s: writer crashed", self.directory, exc_info=self._failure)
        if self._failure is None and task.cancelled():
            self._failure = asyncio.CancelledError("journal writer cancelled")
        reason = f": {self._failure!r}" if self._failure is not None else ""
        self._fail_pending(StoreError(f"journal {self.directory} writer stopped{reason}"))

    async def _flush_once(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if self._rotations:
            frames, waiters, rotations = self._take_rotation()
            sync = True
        else:
            frames, self._frames = self._frames, []
            waiters, self._waiters = self._waiters, []
            rotations = []
            sync, self._sync = self._sync, False
        try:
            if sync and (rotations or self._backlog or len(frames) > self.inline_max_frames):
                closed = await asyncio.to_thread(self._write_sync, frames, bool(rotations))
            else:
                if sync:
                    # Let the callbacks already scheduled run first (a send the appender scheduled goes
                    # out ahead of the fsync), and let appends they make join this flush.
                    # Not after a rotate() call: what was appended after it belongs in the next segment.
                    await asyncio.sleep(0)
                    if not self._rotations:
                        frames += self._frames
                        waiters += self._waiters
                        self._frames, self._waiters, self._sync = [], [], False
                write = functools.partial(self._write_sync, frames, False, fsync=sync)
                # posix_fallocate can take long (glibc writes zeros on NFS): not on the loop
                closed = await asyncio.to_thread(write) if self._needs_space(sum(map(len, frames))) else write()
        except asyncio.CancelledError:
            err = StoreError(f"journal {self.directory} writer cancelled during a flush")
            _fail_all(waiters, err)
            _fail_all(rotations, err)
            raise
        except OSError as exc:
            self._failure = exc
            log.error("journal %s: write/fsync failed, journal is now failed: %s", self.directory, exc)
            err = StoreError(f"journal {self.directory} write failed: {exc}")
            err.__cause__ = exc
            _fail_all(waiters, err)
            _fail_all(rotations, err)
            return
        self._backlog = bool(self._frames)
        if frames:
            self.flush_count += 1
            self.record_count += len(frames)
        for w in waiters:
            _resolve(w, None)
        for r in rotations:
            _resolve(r, closed)

    def _take_rotation(self) -> tuple[list[bytes], list[asyncio.Future[None]], list[asyncio.Future[int]]]:
        """Dequeue what the next rotation closes: the frames and waiters queued before the first
        pending ``rotate()`` call, and every rotation requested at that same point. Frames appended
        after that call stay queued for the new segment: an owner that took its in-memory copy of
        the closing segment's records when it called ``rotate()`` (a checkpoint) must not find
        later records in it."""
        _, n_frames, n_waiters = self._rotations[0]
        frames, self._frames = self._frames[:n_frames], self._frames[n_frames:]
        waiters, self._waiters = self._waiters[:n_waiters], self._waiters[n_waiters:]
        rotations = [fut for fut, f, w in self._rotations if (f, w) == (n_frames, n_waiters)]
        self._rotations = [(fut, f - n_frames, w - n_waiters) for fut, f, w in self._rotations
                           if (f, w) != (n_frames, n_waiters)]
        # The sync flag is not kept per frame: frames left queued are fsync'd if any queued frame asked.
        self._sync = self._sync and bool(self._waiters)
        return frames, waiters, rotations

    def _fail_pending(self, err: StoreError) -> None:
        waiters, self._waiters = self._waiters, []
        rotations = [fut for fut, _, _ in self._rotations]
        self._rotations = []
        self._frames = []
        _fail_all(waiters, err)
        _fail_all(rotations, err)

    def _write_sync(self, frames: list[bytes], rotate: bool, *, fsync: bool = True) -> int:
        """Write ``frames`` to the active segment and fsync it (unless ``fsync`` is false); rotate
        after if asked. Worker thread, or the loop for a small flush."""
        fd = self._fd
        if fd is None:
            raise OSError(f"journal {self.directory}: no active segment")
        if frames:
            data = memoryview(b"".join(frames))
            if self._needs_space(len(data)):
                self._preallocate(fd, len(data))
            self.byte_count += len(data)
            while data:
                written = os.pwrite(fd, data, self._offset)
                self._offset += written
                data = data[written:]
            if fsync:
                _fsync_data(fd)
            self._unsynced = not fsync
        elif fsync and self._unsynced:  # a barrier or a rotation: what came before is durable after it
            _fsync_data(fd)
            self._unsynced = False
        if not rotate:
            return self._seq
        closed = self._seq
        self._fd = None
        try:
            self._trim(fd)
        finally:
            os.close(fd)
        self._seq = closed + 1
        self._fd = self._open_segment(self._seq)
        return closed

    def _needs_space(self, size: int) -> bool:
        """Whether writing ``size`` more bytes must first reserve more space in the segment."""
        return self._can_preallocate and self._offset + size > self._allocated

    def _preallocate(self, fd: int, need: int) -> None:
        """Reserve room for at least ``need`` more bytes after the frames written so far. Where
        the file system cannot (or the disk is too full for a whole chunk), writes just append."""
        want = self._offset + max(need, PREALLOCATE_BYTES)
        try:
            if _posix_fallocate is None:
                raise OSError(errno.ENOTSUP, "no posix_fallocate on this platform")
            _posix_fallocate(fd, self._allocated, want - self._allocated)
        except OSError as exc:
            log.debug("journal %s: no preallocation (%s); appending instead", self.directory, exc)
            self._can_preallocate = False
            return
        self._allocated = want

    def _trim(self, fd: int) -> None:
        """Cut the unused preallocated space off a segment being closed (also what a
        preallocation that failed partway left). A crash before this leaves zeros after the last
        frame, which readers take as the end."""
        if os.fstat(fd).st_size > self._offset:
            os.ftruncate(fd, self._offset)

    # ------------------------------------------------------------------ segments (blocking)

    def _segment_path(self, seq: int) -> Path:
        return self.directory / f"{self.name}-{seq:08d}.log"

    def _open_segment(self, seq: int) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(self._segment_path(seq), flags, 0o600)
        self._offset = self._allocated = 0
        self._unsynced = False
        self._can_preallocate = PREALLOCATE_BYTES > 0
        try:
            if self._can_preallocate:
                self._preallocate(fd, 0)
            fsync_dir(self.directory)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def segments(self) -> list[tuple[int, Path]]:
        """``(seq, path)`` of every segment file on disk, oldest first. Blocking."""
        if not self.directory.is_dir():
            return []
        found = []
        for entry in self.directory.iterdir():
            m = self._seg_re.match(entry.name)
            if m:
                found.append((int(m.group(1)), entry))
        return sorted(found)

    def _closed_upto(self, upto: int, after: int = 0) -> list[tuple[int, Path]]:
        if self._seq and upto >= self._seq:
            raise StoreError(f"journal {self.directory}: segment {self._seq} is active; closed segments are < it")
        return [(seq, path) for seq, path in self.segments() if after < seq <= upto]

    def read_segments(self, upto: int, *, after: int = 0) -> Iterator[R]:
        """Yield the records of every closed segment numbered ``after < seq <= upto``, in order.
        Blocking.

        A torn or corrupt frame ends that segment's records (warning logged with file and offset).
        """
        for _, path in self._closed_upto(upto, after):
            yield from self._read_file(path)

    def drop_segments(self, upto: int) -> None:
        """Delete every closed segment numbered ``<= upto`` and fsync the directory. Blocking."""
        doomed = self._closed_upto(upto)
        for _, path in doomed:
            path.unlink()
        if doomed:
            fsync_dir(self.directory)

    def replay(self) -> list[R]:
        """Every record of every segment on disk, in order. Blocking.

        Meant for startup, before any append: a segment being written concurrently may show a
        partially written batch, which reads (and is logged) as a torn tail.
        """
        out: list[R] = []
        for _, path in self.segments():
            out.extend(self._read_file(path))
        return out

    def _read_file(self, path: Path) -> Iterator[R]:
        data = path.read_bytes()
        size = len(data)
        off = 0
        while off < size:
            if not data[off : off + _HEADER.size].strip(b"\0") and not data[off:].strip(b"\0"):
                return  # the unused preallocated end (never a frame: payloads are not empty)
            problem = self._frame_problem(data, off)
            if problem is not None:
                log.warning(
                    "journal %s: %s at offset %d; ignoring the last %d bytes (torn or corrupt tail)",
                    path,
                    problem,
                    off,
                    size - off,
                )
                return
            length, _ = _HEADER.unpack_from(data, off)
            start = off + _HEADER.size
            try:
                record = self._decoder.decode(data[start : start + length])
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise StoreError(f"journal {path} at offset {off}: record does not decode: {exc}") from exc
            yield record
            off = start + length

    @staticmethod
    def _frame_problem(data: bytes, off: int) -> str | None:
        if len(data) - off < _HEADER.size:
            return "short frame header"
        length, crc = _HEADER.unpack_from(data, off)
        start = off + _HEADER.size
        if length == 0:
            return "zero-length frame (a zero-filled gap before more data)"
        if start + length > len(data):
            return f"short frame ({len(data) - start} of {length} payload bytes)"
        if zlib.crc32(data[start : start + length]) != crc:
            return "crc mismatch"
        return None
