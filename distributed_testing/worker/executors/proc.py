"""Child-process helpers shared by every executor.

Each executor starts its children with ``start_new_session=True``, so a child's pid is also its
process group id and everything it spawns (grandchildren included) stays in that group unless it
deliberately leaves. Killing the group is therefore how a task is stopped for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import stat
from collections import deque
from collections.abc import Callable

import psutil

from distributed_testing.process.childout import REQUEST_END

logger = logging.getLogger(__name__)

DEFAULT_TAIL_BYTES = 4096
# control characters shown escaped in a child's logged output (tab kept): none can end the line,
# move the cursor or recolour a terminal; nor the line and paragraph separators, which end a line
# for str.splitlines (a log reader in Python) and some viewers
_ESCAPED = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0)) if c != 0x09} | {
    c: f"\\u{c:04x}" for c in (0x2028, 0x2029)}


def kill_process_group(pgid: int) -> bool:
    """SIGKILL every process in group ``pgid``.

    Returns True if a signal was delivered, False if the group no longer exists. Any other
    failure (for example EPERM) is raised: it means we tried to kill something that is not ours.
    """
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    logger.debug("killed process group %d", pgid)
    return True


async def kill_and_reap(proc: asyncio.subprocess.Process) -> int:
    """Kill ``proc``'s whole process group, wait for ``proc`` to exit and return its exit code.

    ``proc`` must have been started with ``start_new_session=True``. Safe to call on a process
    that has already exited: the group is still killed so no grandchild outlives it.
    """
    kill_process_group(proc.pid)
    return await proc.wait()


async def finish_relay(relay: asyncio.Task[None], what: str, grace_s: float = 5.0) -> None:
    """Wait up to ``grace_s`` for the task relaying an exited child's output to reach EOF (its
    error, if any, propagates); a process that left the child's group may hold the pipe open: the
    relay is then cancelled, with a warning naming ``what``."""
    try:
        async with asyncio.timeout(grace_s):
            await relay
    except TimeoutError:
        logger.warning("%s: output still open %g s after exit (a process left its group)", what, grace_s)


def exited(proc: asyncio.subprocess.Process) -> bool:
    """Whether ``proc`` has exited, also before the event loop has noticed (a child killed while
    idle, between two requests: sent the next one, it would fail as if it had died running it).
    Read from ``/proc`` (a zombie, or gone): a ``waitid`` would miss a child the loop's watcher is
    reaping at that moment; elsewhere ``waitid`` without reaping it."""
    if proc.returncode is not None:
        return True
    try:
        with open(f"/proc/{proc.pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] in (b"Z", b"X")
    except FileNotFoundError:
        return True
    except OSError:  # no /proc
        try:
            return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True


def describe_exit(returncode: int) -> str:
    """Human wording for a child's exit status: ``exit code 3`` or ``killed by signal SIGSEGV``."""
    if returncode < 0:
        return f"killed by {signal_name(-returncode) or f'signal {-returncode}'} (exit code {returncode})"
    return f"exit code {returncode}"


def signal_name(signum: int) -> str | None:
    """``SIGSEGV`` for 11; None for a number that names no signal here."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return None


def process_tree_rss(pid: int) -> int:
    """Memory in bytes held by ``pid`` and all its living descendants: their resident set sizes
    plus what the tree keeps in memory file systems of its own (:func:`private_tmpfs_bytes`).

    Raises :class:`psutil.NoSuchProcess` if ``pid`` itself is gone; descendants that exit while
    being measured are skipped (they no longer hold memory).
    """
    root = psutil.Process(pid)
    total = int(root.memory_info().rss)
    pids = [pid]
    for child in root.children(recursive=True):
        try:
            total += int(child.memory_info().rss)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        pids.append(child.pid)
    return total + private_tmpfs_bytes(pids)


_TMPFS_PATHS = ("dev/shm", "tmp")


def private_tmpfs_bytes(pids: list[int]) -> int:
    """Bytes used in the ``/dev/shm`` and ``/tmp`` that these processes see and this one does not:
    a sandboxed child's own tmpfs mounts (worker/sandbox.py, worker/confine.py). A file written
    there is memory no RSS shows (400 MB were written under a 100 MB limit); each mount counts
    once, and the worker's own ``/dev/shm`` and ``/tmp`` not at all. A process whose root cannot be
    read (gone, or not ours to inspect) is skipped."""
    seen = set()
    for path in _TMPFS_PATHS:
        try:
            seen.add(os.stat(f"/{path}").st_dev)
        except OSError:
            continue
    total = 0
    for p in pids:
        for path in _TMPFS_PATHS:
            where = f"/proc/{p}/root/{path}"
            try:
                dev = os.stat(where).st_dev
                if dev in seen:
                    continue
                fs = os.statvfs(where)
            except OSError:
                continue
            seen.add(dev)
            total += (fs.f_blocks - fs.f_bfree) * fs.f_frsize
    return total


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


class OutputTail:
    """Keeps the last ``limit`` bytes of a stream, for error messages and result output. While
    ``sink`` is set, every byte fed is also passed to it (``REQUEST_END`` markers left out): the
    running task's output stream (``TaskContext.output``)."""

    def __init__(self, limit: int = DEFAULT_TAIL_BYTES, sink: Callable[[bytes], None] | None = None) -> None:
        self.sink = sink
        self._limit = limit
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self.total_bytes = 0
        self.ended_at = 0  # total_bytes just after the last REQUEST_END (process/childout.py)
        self._carry = b""  # the end of what was fed, where a REQUEST_END split across feeds begins

    def feed(self, data: bytes) -> None:
        """Append ``data``, discarding the oldest bytes beyond the limit."""
        self._chunks.append(data)
        self._size += len(data)
        self.total_bytes += len(data)
        while self._size - len(self._chunks[0]) >= self._limit:
            self._size -= len(self._chunks.popleft())
        window = self._carry + data
        end = window.rfind(REQUEST_END)
        if end >= 0:
            self.ended_at = self.total_bytes - len(window) + end + len(REQUEST_END)
        self._carry = window[-(len(REQUEST_END) - 1):]
        if self.sink is not None:
            self.sink(data.replace(REQUEST_END, b""))

    def text(self, since: int = 0) -> str:
        """The kept tail decoded as UTF-8 (invalid bytes replaced), at most ``limit`` bytes; with
        ``since`` (``total_bytes`` at some moment), only what was fed after that moment and after
        the last ``REQUEST_END``: a long-lived child's output for one request, not that of the
        requests before it, even what of theirs was still unread when ``since`` was taken."""
        keep = min(self._limit, self.total_bytes - max(since, self.ended_at))
        data = b"".join(self._chunks)[-keep:] if keep > 0 else b""
        return data.replace(REQUEST_END, b"").decode("utf-8", errors="replace")

    async def drain(self, reader: asyncio.StreamReader, log_prefix: str | None = None) -> None:
        """Read ``reader`` to EOF into the tail; with ``log_prefix``, also log each chunk at DEBUG."""
        while chunk := await reader.read(65536):
            self.feed(chunk)
            if log_prefix is not None and logger.isEnabledFor(logging.DEBUG):  # each line marked as the child's
                for line in chunk.replace(REQUEST_END, b"").decode("utf-8", errors="replace").splitlines():
                    logger.debug("%s %s", log_prefix, line.translate(_ESCAPED))

    async def forward(self, reader: asyncio.StreamReader, log: logging.Logger, prefix: str) -> None:
        """Read ``reader`` to EOF into the tail, logging each line at INFO as ``prefix line``: a
        child's stderr in the worker's log rather than on its stderr, where a line could pass for
        one of the worker's own (control characters are escaped, a line over the reader's limit is
        cut)."""
        while True:
            try:
                line = await reader.readline()
            except ValueError:  # over the limit: readline dropped it
                line = b"(a line over the limit, cut)\n"
            if not line:
                return
            self.feed(line)
            if line.endswith(REQUEST_END):  # the end of a request's output, not a line of it
                line = line[:-len(REQUEST_END)]
                if not line:
                    continue
            log.info("%s %s", prefix, line.decode("utf-8", errors="replace").rstrip("\r\n").translate(_ESCAPED))


FOLLOW_INTERVAL_S = 0.5
FOLLOW_READ_BYTES = 4 * 1024 * 1024


class FileFollower:
    """Feeds ``sink`` (on the event loop) what is appended to ``path``, a file a task's process
    writes (a training node's launcher log), every ``FOLLOW_INTERVAL_S`` until :meth:`stop`, which
    reads what is left. The file is the task's: it is read only while it is a regular file, never
    through a link (nor a FIFO, which would block), at most ``FOLLOW_READ_BYTES`` a time, in a thread."""

    def __init__(self, path: os.PathLike[str] | str, sink: Callable[[bytes], None]) -> None:
        self.path, self.sink, self.offset = path, sink, 0
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._follow(), name=f"follow {path}")

    async def _follow(self) -> None:
        while not self._stop.is_set():
            await self._read()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FOLLOW_INTERVAL_S):
                    await self._stop.wait()
        while await self._read() == FOLLOW_READ_BYTES:  # what was written before the end
            pass

    async def _read(self) -> int:
        data = await asyncio.to_thread(_read_regular, self.path, self.offset, FOLLOW_READ_BYTES)
        self.offset += len(data)
        if data:
            self.sink(data)
        return len(data)

    async def stop(self) -> None:
        self._stop.set()
        await self._task


def _read_regular(path: os.PathLike[str] | str, offset: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of ``path`` from ``offset``; nothing when it is missing, a link or
    not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.pread(fd, limit, offset) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return b""
    finally:
        os.close(fd)
