"""Byte code a submitter's pytest sessions compiled in one tree, kept for its next session there.

A task's view of a tree is fresh copies (:func:`.tree.writable_view`), so without this every
session of a run compiled the tree's modules again and pytest rewrote and compiled every test
module again: toolz's 193 tests collect in 1.6-2.4 s that way against 0.5-0.75 s with their
``__pycache__`` (benchmarks/RESULTS.md, "Byte code kept between sessions"), on each worker, for
every run. A local pytest, and each pytest-xdist worker, reads the ``__pycache__`` an earlier run
wrote.

* **What is kept.** Once a session has collected, and again when it ends, the ``*.pyc`` files
  under the ``__pycache__`` directories of its view (regular files only, never through a link,
  each directory held open while it is read; at most :data:`MAX_FILES` files and
  :data:`MAX_BYTES`) are copied into an entry of the store, which the next session's view is
  seeded from before its pytest starts.
* **Whose.** An entry is keyed by the submitter's key id, the bundle's digest (less its run
  state, ``manifest.code_digest``: a ``.hypothesis/`` a local run changed holds no code) and the
  Python environment's digest: byte code is code, and what one session wrote reaches only later sessions
  of the same key, over the same tree, in the same environment; those run the same code anyway.
  A run of another key, or of a changed tree (a pull request's, say), never reads it.
* **Valid.** Python and pytest check a ``.pyc`` against its source's size and modification time
  (seconds): every file of a view gets the same fixed time (:data:`VIEW_MTIME`), so a ``.pyc``
  written in one view is current in the next view of the same tree. pytest before 9.2 kept the
  compiling view's path in a rewritten test module's code (its tracebacks would name another
  session's tree), so its rewritten ``.pyc`` files (``*-pytest-X.Y.Z.pyc``) are kept only for
  pytest 9.2 or newer; importlib corrects a plain module's path itself.
* **Bounded.** At most :data:`MAX_ENTRIES` entries holding :data:`MAX_STORE_BYTES` in all (each
  entry records its size), the least recently used removed first: a submitter who keeps changing
  the tree (a new bundle each run) cannot fill the worker's disk. Any failure to keep or seed is
  logged and costs only the compile it would have saved.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

VIEW_MTIME = 946684800  # 2000-01-01 00:00 UTC: the modification time of every file of a task's view
MAX_ENTRIES = 32
MAX_FILES = 20_000
MAX_BYTES = 64 * 1024 * 1024  # one entry's
MAX_STORE_BYTES = 256 * 1024 * 1024  # all entries'
SIZE_FILE = ".bytes"  # an entry's size, beside its directories (seeding reads only __pycache__ ones)
CACHE_DIR = "__pycache__"
# a pytest-rewritten module's byte code: NAME.TAG-pytest-X.Y.Z.pyc
_PYTEST_TAG = re.compile(r"-pytest-(\d+)\.(\d+)")
FIXED_PYTEST = (9, 2)  # the first pytest that corrects a cached rewritten module's path (pytest PR 14551)


def entry_key(submitter: str, bundle: str, environment: str) -> str:
    """The store's name for the byte code of ``submitter``'s sessions over ``bundle`` in ``environment``."""
    return hashlib.sha256("\0".join((submitter, bundle, environment)).encode()).hexdigest()[:40]


def keepable(name: str) -> bool:
    """Whether a ``.pyc`` called ``name`` may be handed to another view of its tree."""
    if not name.endswith(".pyc"):
        return False
    tagged = _PYTEST_TAG.search(name)
    return tagged is None or (int(tagged[1]), int(tagged[2])) >= FIXED_PYTEST


class BytecodeStore:
    """Entries of kept byte code under ``root`` (module docstring)."""

    def __init__(self, root: Path, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_STORE_BYTES) -> None:
        self.root = Path(root)
        self.max_entries = max_entries
        self.max_bytes = max_bytes

    def seed(self, key: str, tree: Path) -> int:
        """Copy entry ``key``'s files into ``tree`` (a view being made, nothing of the task runs in
        it yet), each into a ``__pycache__`` of a directory the tree has; the number copied."""
        entry = self.root / key
        copied = 0
        try:
            os.utime(entry)  # its last use: eviction removes the least recently used
            for dirpath, _, filenames in os.walk(entry):
                rel = os.path.relpath(dirpath, entry)
                if os.path.basename(rel) != CACHE_DIR:
                    continue
                home = tree / os.path.dirname(rel)  # "" for the top's own
                if not _plain_dir(home):
                    continue
                target = home / CACHE_DIR
                target.mkdir(exist_ok=True)
                for name in filenames:
                    shutil.copyfile(os.path.join(dirpath, name), target / name)
                    copied += 1
        except FileNotFoundError:  # none yet, or replaced while read: nothing (more) to seed
            pass
        except OSError as exc:
            log.warning("byte code of an earlier session not seeded into %s: %s", tree, exc)
        return copied

    def keep(self, key: str, tree: Path) -> int:
        """Replace entry ``key`` with the keepable byte code under ``tree`` (a session's view; its
        process may still run); the number of files kept (0: nothing, or over the bounds). The
        walk holds each directory open and opens nothing through a link (``os.fwalk``, and
        ``O_NOFOLLOW`` relative to the directory): a task that swaps a directory for a link
        while this runs cannot make it read outside its view."""
        found: list[tuple[str, bytes]] = []  # (path relative to tree, contents)
        total = 0
        for dirpath, _, filenames, dirfd in os.fwalk(tree, follow_symlinks=False):
            if os.path.basename(dirpath) != CACHE_DIR:
                continue
            for name in filenames:
                if not keepable(name):
                    continue
                data = _read_regular(name, dirfd)
                if data is None:
                    continue
                total += len(data)
                found.append((os.path.relpath(os.path.join(dirpath, name), tree), data))
                if len(found) > MAX_FILES or total > MAX_BYTES:
                    log.info("byte code of %s not kept: over %d files or %d bytes", tree, MAX_FILES, MAX_BYTES)
                    return 0
        if not found:
            return 0
        self.root.mkdir(parents=True, exist_ok=True)
        new = Path(tempfile.mkdtemp(prefix=".new-", dir=self.root))
        try:
            for rel, data in found:
                (new / rel).parent.mkdir(parents=True, exist_ok=True)
                (new / rel).write_bytes(data)
            (new / SIZE_FILE).write_text(str(total))
            self._swap_in(new, key)
        finally:
            shutil.rmtree(new, ignore_errors=True)  # gone already once it is the entry
        self._evict()
        return len(found)

    def _swap_in(self, new: Path, key: str) -> None:
        """Make the directory ``new`` entry ``key``, the old one (if any) removed; when another
        session's keep puts its own in between, that one stands."""
        aside = self.root / f".old-{key}-{os.getpid()}-{time.monotonic_ns()}"
        with contextlib.suppress(FileNotFoundError):
            os.rename(self.root / key, aside)
        try:
            os.rename(new, self.root / key)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        shutil.rmtree(aside, ignore_errors=True)

    def _evict(self) -> None:
        """Remove the least recently used entries beyond ``max_entries`` or ``max_bytes`` in all."""
        entries = []
        for p in self.root.iterdir():
            if p.name.startswith("."):
                continue
            try:
                entries.append((p.stat().st_mtime, p, _size(p)))
            except FileNotFoundError:
                continue
        held = 0
        for n, (_, p, size) in enumerate(sorted(entries, key=lambda e: e[0], reverse=True)):
            held += size
            if n >= self.max_entries or (n > 0 and held > self.max_bytes):
                shutil.rmtree(p, ignore_errors=True)


def _size(entry: Path) -> int:
    """The bytes entry ``entry`` holds, as its keep recorded them (an entry without a record
    counts as full: :data:`MAX_BYTES`)."""
    try:
        return int((entry / SIZE_FILE).read_text())
    except (OSError, ValueError):
        return MAX_BYTES


def _plain_dir(path: Path) -> bool:
    """A directory, not a link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _read_regular(name: str, dirfd: int) -> bytes | None:
    """The contents of ``name`` in the directory ``dirfd`` when it is a regular file (not a link,
    FIFO or device: opened without following a link and without blocking), else None."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dirfd)
    except OSError:  # a link (ELOOP), or gone since it was listed
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(MAX_BYTES + 1)
    finally:
        os.close(fd)
