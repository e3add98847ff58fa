"""Track a child process and every descendant it starts, and stop them all.

torch's elastic agent puts each rank in its own session, so one ``killpg`` cannot reach them and a
rank whose agent died is re-parented away from us. :class:`ProcessTree` therefore remembers every
descendant it has seen (``refresh`` while the child runs; psutil handles guard against pid reuse)
and :meth:`stop` signals each one.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess

import psutil

logger = logging.getLogger(__name__)


class ProcessTree:
    """A child started with ``start_new_session=True`` plus all descendants seen so far."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self._known: dict[int, psutil.Process] = {}
        try:
            self._known[proc.pid] = psutil.Process(proc.pid)
        except psutil.NoSuchProcess:
            logger.debug("process %d exited before it could be tracked", proc.pid)

    @property
    def pids(self) -> set[int]:
        return set(self._known)

    def refresh(self) -> None:
        """Add descendants that exist now (call periodically while the child runs)."""
        root = self._known.get(self.proc.pid)
        if root is None:
            return
        try:
            children = root.children(recursive=True)
        except psutil.NoSuchProcess:
            return
        for child in children:
            self._known.setdefault(child.pid, child)

    def alive(self) -> list[psutil.Process]:
        """Tracked processes that still run (zombies count as gone)."""
        running = []
        for process in self._known.values():
            try:
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    running.append(process)
            except psutil.NoSuchProcess:
                continue
        return running

    def stop(self, grace_s: float) -> None:
        """SIGTERM the root (the agent stops its ranks), wait ``grace_s``, then SIGKILL the rest."""
        self.refresh()
        if self.proc.poll() is None:
            self._signal_root(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                logger.warning("launcher agent %d ignored SIGTERM for %.0fs; killing", self.proc.pid, grace_s)
        self.refresh()
        self._signal_root(signal.SIGKILL)
        leftovers = self.alive()
        for process in leftovers:
            logger.warning("killing leftover process %d (%s)", process.pid, _name(process))
            try:
                process.kill()
            except psutil.NoSuchProcess:
                continue
        _, still = psutil.wait_procs(leftovers, timeout=5.0)
        if still:
            raise RuntimeError(f"processes survived SIGKILL: {[p.pid for p in still]}")
        if self.proc.poll() is None:
            self.proc.wait(timeout=5.0)

    def _signal_root(self, sig: signal.Signals) -> None:
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            logger.debug("process group %d already gone", self.proc.pid)


def _name(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline()[:4])
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "?"
