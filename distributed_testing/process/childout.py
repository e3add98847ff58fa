"""Where one request's output ends in the stderr of a long-lived child (a pool child, the cached
benchmark child), which serves tasks of different submitters one after another.

The child calls :func:`end_request` before each reply: its output so far is flushed, and when the
worker has not read all of it from the pipe yet, ``REQUEST_END`` follows it there. The worker reads
the pipe in its own time, so when a later request's child dies, bytes of the request before may
have been unread when that later request started; the tail it reports is cut at the last
``REQUEST_END`` (``OutputTail.ended_at``), not only at the byte count read when it started. A
request whose output the worker had read already writes no marker: nothing wakes the worker's
reader for a request that printed nothing (a no-op task's round trip stays as it was).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import sys
import termios

REQUEST_END = b"\x00dt:request-end\x00\n"


def unread(fd: int) -> int:
    """Bytes written to the pipe ``fd`` (either end) that its reader has not read yet; -1 when
    that cannot be told (not a pipe, closed)."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])
    except OSError:
        return -1


def end_request() -> None:
    """Flush this process's stdout and stderr, then, unless the worker has read all that reached
    its stderr (fd 2), write ``REQUEST_END`` there. A handler may have closed or replaced the
    streams: what fails is skipped."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if unread(2) != 0:
        with contextlib.suppress(OSError):
            os.write(2, REQUEST_END)
