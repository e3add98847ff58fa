"""A long-lived custom-handler child: ``python -m distributed_testing.worker.executors.pool_child``.

Wire format on the child's stdin/stdout: frames of a 4-byte little-endian length followed by a
msgpack-encoded message. The child first writes a :class:`Hello`, then answers each
:class:`Request` with exactly one :class:`Reply`, in the order received, one request at a time,
until stdin reaches EOF. The worker may send several requests in one write (a chain: tasks queued
for one slot); the child runs them one after another and writes each reply as it is made. A
:class:`Skip` naming a request not yet begun makes the child answer it ``skipped`` without running
it (a task cancelled while it waited in the chain); the child reads what is in the pipe before it
begins each request, so a skip written before that is obeyed.

At start the child moves the protocol off fds 0 and 1 (stdin becomes /dev/null, stdout points at
stderr), so a handler that prints or reads stdin cannot corrupt the framing. The parent starts the
child with ``start_new_session=True``; anything a handler spawns stays in the child's process group
and dies with it when the parent kills the group.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import select
import shutil
import stat
import struct
import sys
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any, BinaryIO, Literal

import msgspec

from distributed_testing.errors import ExecutionError
from distributed_testing.process.childout import end_request
from distributed_testing.worker.executors.handlers import (
    HandlerContext,
    HandlerParameterError,
    HandlerRegistry,
)

logger = logging.getLogger(__name__)

HEADER = struct.Struct("<I")
MAX_FRAME = 64 * 1024 * 1024

ReplyKind = Literal["ok", "raised", "bad_parameters", "load_error", "skipped"]


class Hello(msgspec.Struct, array_like=True, frozen=True):
    pid: int
    handlers: list[str]


class Request(msgspec.Struct, array_like=True, frozen=True, tag="r"):
    seq: int
    name: str
    parameters: dict[str, Any]
    task_id: str
    attempt: int
    cache_dir: str | None = None
    work_dir: str | None = None
    timeout_s: float | None = None
    clean_scratch: bool = False  # after the reply, empty work_dir's parent (a confined child's scratch) and /dev/shm


class Skip(msgspec.Struct, array_like=True, frozen=True, tag="s"):
    """Do not run these requests (by ``seq``) if they have not begun: answer them ``skipped``."""

    seqs: list[int]


class Reply(msgspec.Struct, array_like=True, frozen=True):
    """``output_json`` is the handler's result as JSON bytes (proves it is JSON-able)."""

    seq: int
    kind: ReplyKind
    output_json: bytes = b"{}"
    error: str | None = None
    traceback: str | None = None
    duration_s: float = 0.0


def frame(payload: bytes) -> bytes:
    """Prefix ``payload`` with its length."""
    return HEADER.pack(len(payload)) + payload


class FrameReader:
    """The parent's frames from ``stream``: :meth:`next` blocks for one; :meth:`ready` takes
    those already in the pipe without blocking (a chain's next requests and its skips)."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._buf = bytearray()
        self.eof = False
        try:
            self._fd: int | None = stream.fileno()
        except (OSError, AttributeError, ValueError):  # not a pipe (a test's buffer): read what is there
            self._fd = None

    def _fill(self, block: bool) -> None:
        if self._fd is None:
            data = self._stream.read(1 << 16)
        elif block or select.select([self._fd], [], [], 0)[0]:
            data = os.read(self._fd, 1 << 16)
        else:
            return
        if data:
            self._buf += data
        else:
            self.eof = True

    def _take(self) -> bytes | None:
        if len(self._buf) < HEADER.size:
            return None
        (size,) = HEADER.unpack_from(self._buf)
        if size > MAX_FRAME:
            raise ExecutionError(f"pool child: frame of {size} bytes exceeds {MAX_FRAME}")
        if len(self._buf) < HEADER.size + size:
            return None
        payload = bytes(self._buf[HEADER.size:HEADER.size + size])
        del self._buf[:HEADER.size + size]
        return payload

    def ready(self) -> list[bytes]:
        """Every whole frame that has arrived, without blocking."""
        if not self.eof:
            self._fill(block=False)
        frames = []
        while (f := self._take()) is not None:
            frames.append(f)
        return frames

    def next(self) -> bytes | None:
        """The next frame, blocking; None at EOF."""
        while (f := self._take()) is None:
            if self.eof:
                if self._buf:
                    raise ExecutionError("pool child: truncated frame from parent")
                return None
            self._fill(block=True)
        return f


_PATHS: dict[str, Path] = {}  # a child's requests name the same few directories: one Path each (Path() costs
# a quarter of a no-op request's time here; a Path is immutable, so sharing it is safe)


def _path(text: str | None) -> Path | None:
    if text is None:
        return None
    p = _PATHS.get(text)
    if p is None:
        if len(_PATHS) >= 64:  # a bound, should the worker ever vary them
            _PATHS.clear()
        p = _PATHS[text] = Path(text)
    return p


def run_request(registry: HandlerRegistry, req: Request, json_encoder: msgspec.json.Encoder) -> Reply:
    """Run one request's handler and describe the outcome; never raises for handler errors."""
    start = time.perf_counter()
    try:
        handler = registry.resolve(req.name)
    except ExecutionError as exc:
        return Reply(req.seq, "load_error", error=str(exc), traceback=traceback.format_exc())
    ctx = HandlerContext(req.task_id, req.attempt, _path(req.cache_dir), _path(req.work_dir), req.timeout_s)
    try:
        output = handler(dict(req.parameters), ctx)
        if not isinstance(output, dict):
            raise TypeError(f"handler {req.name!r} returned {type(output).__name__}, expected dict")
        encoded = json_encoder.encode(output)
    except HandlerParameterError as exc:
        return Reply(req.seq, "bad_parameters", error=str(exc), duration_s=time.perf_counter() - start)
    except Exception as exc:  # noqa: BLE001 - any handler error is the task's result, reported in full
        last_line = traceback.format_exception_only(exc)[-1].strip()
        return Reply(
            req.seq,
            "raised",
            error=last_line,
            traceback=traceback.format_exc(),
            duration_s=time.perf_counter() - start,
        )
    return Reply(req.seq, "ok", output_json=encoded, duration_s=time.perf_counter() - start)


def serve(proto_in: BinaryIO, proto_out: BinaryIO, registry: HandlerRegistry) -> None:
    """Answer requests from ``proto_in`` on ``proto_out`` until EOF."""
    encoder = msgspec.msgpack.Encoder()
    json_encoder = msgspec.json.Encoder()
    decoder = msgspec.msgpack.Decoder(Request | Skip)
    proto_out.write(frame(encoder.encode(Hello(os.getpid(), registry.names()))))
    proto_out.flush()
    watch: ScratchWatch | None = None
    reader = FrameReader(proto_in)
    pending: deque[Request] = deque()
    skipped: set[int] = set()
    while True:
        for payload in reader.ready():  # a chain's next requests, and skips, before the next begins
            _receive(decoder.decode(payload), pending, skipped)
        if not pending:
            if (first := reader.next()) is None:
                return
            _receive(decoder.decode(first), pending, skipped)
            continue
        request = pending.popleft()
        if request.seq in skipped:
            skipped.discard(request.seq)
            proto_out.write(frame(encoder.encode(Reply(request.seq, "skipped"))))
            proto_out.flush()
            continue
        reply = run_request(registry, request, json_encoder)
        end_request()  # this task's output before its reply, never in the next's
        proto_out.write(frame(encoder.encode(reply)))
        proto_out.flush()
        if request.clean_scratch and request.work_dir is not None:
            if watch is None:  # confined: /dev/shm is the confinement's own (worker/confine.py)
                watch = ScratchWatch(Path(request.work_dir).parent, shm=SHM)
            watch.clean()


def _receive(msg: Request | Skip, pending: deque[Request], skipped: set[int]) -> None:
    if isinstance(msg, Request):
        pending.append(msg)
    else:  # only requests still waiting here can be skipped; a skip of one already run is moot
        waiting = {r.seq for r in pending}
        skipped.update(s for s in msg.seqs if s in waiting)


SCRATCH_DIRS = ("work", "tmp")  # what a confined child's scratch directory holds between tasks, empty
SHM = Path("/dev/shm")  # a confined child's own tmpfs, emptied between tasks too
_IN_CHANGED = 0x100 | 0x200 | 0x40 | 0x80 | 0x400 | 0x800  # IN_CREATE, DELETE, MOVED_FROM/TO, DELETE/MOVE_SELF


class ScratchWatch:
    """Empties a confined child's scratch directory (:func:`empty_scratch`) and ``shm`` (its
    ``/dev/shm``, the other place in its view a task can leave files for the next) only when
    something changed in them since the last time: inotify watches the directory, ``work``,
    ``tmp`` and ``shm`` (a file anywhere below needs an entry made in one of them first), so a task
    that wrote nothing costs one non-blocking read instead of four directory listings. Without
    inotify it always lists."""

    def __init__(self, root: Path, shm: Path | None = None) -> None:
        self.root = root
        self.shm = shm
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        self._dirty = True  # the first task's files were made before the watch

    def _watch(self) -> bool:
        return self._fd >= 0 and all(
            self._libc.inotify_add_watch(self._fd, os.fsencode(d), _IN_CHANGED) >= 0
            for d in (self.root, *(self.root / n for n in SCRATCH_DIRS), *([self.shm] if self.shm else [])))

    def _changed(self) -> bool:
        changed = False
        while True:
            try:
                if not os.read(self._fd, 65536):
                    return True
            except BlockingIOError:
                return changed
            changed = True

    def clean(self) -> None:
        if self._fd < 0 or self._dirty or self._changed():
            empty_scratch(self.root)
            if self.shm is not None:
                empty_dir(self.shm)
            self._dirty = not self._watch()  # work/tmp may be new directories: watch them again
            if not self._dirty:
                self._changed()  # our own changes


def empty_dir(path: Path) -> None:
    """Remove everything in ``path`` (absent is fine)."""
    try:
        _own(path)
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return
    for entry in entries:
        _remove(entry)


def empty_scratch(root: Path) -> None:
    """Leave ``root`` holding nothing but empty ``work`` and ``tmp`` (``TMPDIR``): the files one
    task left for the next are removed. Checking costs a few directory reads when there are none
    (creating and removing directories costs milliseconds on some disks)."""
    _own(root)
    kept = set()
    with os.scandir(root) as entries:
        for entry in entries:
            if entry.name in SCRATCH_DIRS and entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(PermissionError), os.scandir(entry.path) as inner:  # unlistable: removed
                    if next(inner, None) is None:
                        kept.add(entry.name)
                        continue
            _remove(entry)
    for name in SCRATCH_DIRS:
        if name not in kept:
            os.makedirs(root / name, exist_ok=True)


def _own(directory: Path | str) -> None:
    """Give the owner back every right on ``directory`` (a task may have taken them away)."""
    mode = stat.S_IMODE(os.stat(directory, follow_symlinks=False).st_mode)
    if mode & stat.S_IRWXU != stat.S_IRWXU:
        os.chmod(directory, mode | stat.S_IRWXU)


def _remove(entry: os.DirEntry[str]) -> None:
    """Remove ``entry``, a tree too, also one a task made read-only or unlistable (Go leaves its
    module cache 0555, an unpacked archive keeps its modes): a tree ``rmtree`` cannot remove has
    its directories opened to the owner and is removed again. What still cannot be removed
    raises: the child ends, and a new one, with a new scratch directory, takes its place."""
    if not entry.is_dir(follow_symlinks=False):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(entry.path)
        return
    try:
        shutil.rmtree(entry.path)
    except FileNotFoundError:
        return
    except OSError:
        _open_tree(entry.path)
        shutil.rmtree(entry.path)


def _open_tree(directory: str) -> None:
    """Give the owner every right on ``directory`` and each directory below it (not through a link)."""
    with contextlib.suppress(OSError):
        _own(directory)
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            _open_tree(entry.path)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pool_child", description=__doc__)
    parser.add_argument("--handler", action="append", default=[], metavar="NAME=MODULE:FUNC")
    parser.add_argument("--no-entry-points", action="store_true")
    parser.add_argument("--log-level", type=int, default=logging.WARNING, help="numeric logging level")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr, format=f"pool-child[{os.getpid()}] %(levelname)s %(name)s: %(message)s"
    )
    extra = {}
    for item in args.handler:
        name, sep, spec = item.partition("=")
        if not sep:
            raise SystemExit(f"--handler expects NAME=MODULE:FUNC, got {item!r}")
        extra[name] = spec
    registry = HandlerRegistry(extra, use_entry_points=not args.no_entry_points)
    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    with contextlib.suppress(AttributeError, ValueError):  # a line printed is streamed at once (worker/tasklogs.py)
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    serve(proto_in, proto_out, registry)
    return 0


if __name__ == "__main__":
    sys.exit(main())
