"""The last resort of a process that was told to stop: if it is still alive at a deadline, it
says what it was waiting for, kills its child processes and exits.

Every wait on a worker's stop path is bounded (the drain's deadline, the session's teardown, the
runs' stop, the connection's close); this is for whatever is not: a bug (a task that outlived its
cancel kept a worker alive for ever after SIGTERM), a driver call that never returns in a thread,
a thread the interpreter waits for at exit. A daemon thread waits for the deadline, so it fires
even when the event loop is blocked or already closed: it logs the event loop's tasks and every
thread's stack, SIGKILLs every descendant process (task children, warm pool children and what
they started) and ends the process with ``os._exit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import io
import logging
import os
import sys
import threading
import time

import psutil

log = logging.getLogger(__name__)


class ExitDeadline:
    """``arm(seconds, why)``: end the process ``seconds`` from now unless it has exited by then
    (``why``: what started the countdown, for the log); each arm can only bring the deadline
    closer. ``now(why)`` ends it at once. ``loop`` (the process's event loop) is
    only read, for the log of its tasks."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None, exit_code: int = 1) -> None:
        self.loop = loop
        self.exit_code = exit_code
        self._lock = threading.Lock()
        self._at: float | None = None  # time.monotonic() of the deadline
        self._timer: threading.Timer | None = None

    @property
    def remaining(self) -> float | None:
        """Seconds to the deadline (None while not armed)."""
        return None if self._at is None else self._at - time.monotonic()

    def arm(self, seconds: float, why: str) -> None:
        at = time.monotonic() + max(0.0, seconds)
        with self._lock:
            if self._at is not None and self._at <= at:
                return
            if self._timer is not None:
                self._timer.cancel()
            self._at = at
            self._timer = threading.Timer(max(0.0, seconds), self.now, args=(f"still running {seconds:g}s after {why}",))
            self._timer.daemon = True
            self._timer.name = "exit-deadline"
            self._timer.start()

    def cancel(self) -> None:
        """Disarm: the process got past what the deadline guarded (it runs on, e.g. a test
        process that ran a worker in-process)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer, self._at = None, None

    def now(self, why: str) -> None:
        """Log, kill every descendant process and exit, from whichever thread calls it."""
        try:
            log.critical("%s; exiting now (exit status %d), its child processes killed", why, self.exit_code)
            self._log_state()
            killed = kill_descendants()
            if killed:
                log.critical("killed %d child process(es): %s", len(killed), ", ".join(map(str, killed)))
            logging.shutdown()
        finally:
            os._exit(self.exit_code)

    def _log_state(self) -> None:
        """What the process was waiting for: its event loop's tasks, then every thread's stack."""
        with contextlib.suppress(Exception):  # best effort: the loop runs on in another thread
            if self.loop is not None and not self.loop.is_closed():
                out = io.StringIO()
                for task in asyncio.all_tasks(self.loop):
                    task.print_stack(limit=8, file=out)
                log.critical("event loop tasks:\n%s", out.getvalue().rstrip())
        with contextlib.suppress(Exception):
            for handler in logging.getLogger().handlers:
                handler.flush()
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


def kill_descendants() -> list[int]:
    """SIGKILL every living descendant of this process; returns their pids."""
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return []
    killed = []
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
            killed.append(child.pid)
    return killed
