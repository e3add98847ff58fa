"""Where one request's output ends in the stderr of a long-lived child (a pool child, the cached
benchmark child), which serves tasks of different submitters one after another.

The child calls :func:`end_request` before each reply: its output so far is flushed, then
``REQUEST_END`` follows it on the stderr pipe. The worker reads the pipe in its own time, so when
a later request's child dies, bytes of the request before may still have been unread when that
request started; the tail it reports is cut at the last ``REQUEST_END``, never the first byte
count the worker happened to have read (``OutputTail.ended_at``).
"""

from __future__ import annotations

import contextlib
import os
import sys

REQUEST_END = b"\x00dt:request-end\x00\n"


def end_request() -> None:
    """Flush this process's stdout and stderr, then write ``REQUEST_END`` to its stderr (fd 2).
    A handler may have closed or replaced the streams: what fails is skipped."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(OSError):
        os.write(2, REQUEST_END)
