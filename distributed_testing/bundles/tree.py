"""A read-only tree of a bundle, built from the blob cache by hard links, and a task's writable view of it.

``build_tree(cache, manifest, dest)`` makes every directory, links each file from the cache
(``BlobCache.path``, or its executable twin for mode 0755) and then makes the directories
read-only (0555). A cache on another filesystem than ``dest`` gets copies instead of links.
``copy=True`` builds one task's own tree instead: writable copies, like a checkout. A worker with
``--sandbox none`` asks for it for every task, because there the task runs as the worker's user
(root, or the owner of the cache's files) outside any read-only mount, and could ``chmod`` a linked
file and write through it into the cache that later tasks' trees are built from. Every blob must be
in the cache (the worker fetches the missing ones first). ``remove_tree`` undoes it.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from .bytecode import VIEW_MTIME
from .cache import BlobCache
from .manifest import Manifest


def build_tree(cache: BlobCache, m: Manifest, dest: Path, *, copy: bool = False) -> None:
    dest = Path(dest)
    dirs = _make_dirs(m, dest)
    link = os.link
    for f in m.files:
        src = cache.executable(f.digest) if f.mode == 0o755 else cache.path(f.digest)
        if copy:
            _copy(src, dest / f.path, f.mode | 0o200)
            continue
        try:
            link(src, dest / f.path)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EMLINK, errno.EPERM):
                raise
            _copy(src, dest / f.path, f.mode & 0o555)  # read-only, as a link would be
    if copy:
        return
    for d in reversed(dirs):
        os.chmod(dest / d, 0o555)
    os.chmod(dest, 0o555)


# A file over this many bytes (data, weights) in a root worker's view stays a link its task reads but
# cannot change; a copy of it per task would cost its size in time and disk (benchmarks/RESULTS.md,
# "Writable views").
LINK_OVER = 16 * 1024 * 1024


def writable_view(src: Path, m: Manifest, dest: Path, *, link_large: bool) -> None:
    """A task's own view of the built tree ``src`` at ``dest``, writable like a checkout: every
    directory made anew (the task creates, renames and removes files in it) and every file a copy
    the task may rewrite, ``chmod`` and ``os.utime`` (a suite that rewrites its own fixture or
    touches a template to test a cache does that; a hard link owned by the worker gave EACCES and
    EPERM). With ``link_large`` (a root worker, whose child runs as another user:
    worker/sandbox.py hands it the copies) a file over :data:`LINK_OVER` bytes is a hard link to
    ``src``'s instead, which that user can read but not change; a file that cannot take another
    link (EMLINK, EXDEV) is copied. A worker not running as root never links: its child would own
    the linked file and could change the blob cache through it."""
    dest = Path(dest)
    _make_dirs(m, dest)
    for f in m.files:
        if link_large and f.size > LINK_OVER:
            try:
                os.link(src / f.path, dest / f.path)
                continue
            except OSError as exc:
                if exc.errno not in (errno.EMLINK, errno.EXDEV):
                    raise
        _copy(src / f.path, dest / f.path, f.mode | 0o200, VIEW_MTIME)


def _copy(src: Path, dest: Path, mode: int, mtime: int | None = None) -> None:
    """``src`` copied to the new file ``dest`` with ``mode`` (a task's writable copy, or a read-only
    one where a tree cannot link): one open each and the kernel's
    ``copy_file_range`` (about a fifth less time per file than ``shutil.copyfile`` plus ``chmod``);
    ``mtime``: its access and modification time, else now."""
    fi = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fo = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        try:
            left = os.fstat(fi).st_size
            while left > 0:
                try:
                    n = os.copy_file_range(fi, fo, left)
                except OSError as exc:  # a filesystem or kernel without it for these files
                    if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                    os.lseek(fo, os.lseek(fi, 0, os.SEEK_CUR), os.SEEK_SET)
                    n = os.sendfile(fo, fi, None, left)
                if n == 0:
                    break
                left -= n
            os.fchmod(fo, mode)  # the umask took bits off the mode open() was given
            if mtime is not None:
                os.utime(fo, (mtime, mtime))
        finally:
            os.close(fo)
    finally:
        os.close(fi)


def _make_dirs(m: Manifest, dest: Path) -> list[str]:
    """``dest`` and every directory of ``m`` under it; the latter, relative and sorted."""
    dest.mkdir(parents=True)
    dirs = sorted({p.rsplit("/", 1)[0] for p in (f.path for f in m.files) if "/" in p})
    for d in dirs:
        os.makedirs(dest / d, exist_ok=True)
    return dirs


def remove_tree(dest: Path) -> None:
    """Delete a tree ``build_tree`` made (its directories are read-only); absent is fine."""
    dest = Path(dest)
    if not dest.exists():
        return
    for dirpath, _, _ in os.walk(dest):
        os.chmod(dirpath, 0o755)
    shutil.rmtree(dest)


def top_level_modules(root: Path) -> tuple[str, ...]:
    """The top-level module names a built tree offers to ``import`` with its root on ``sys.path``:
    ``NAME.py`` files and directories (packages, namespace packages included) whose NAME is an
    identifier, sorted. What a bundle task's ``module:callable`` may name (docs/tasks.md)."""
    names = set()
    for entry in Path(root).iterdir():
        name = entry.name[:-3] if entry.name.endswith(".py") and entry.is_file() else entry.name
        if name.isidentifier() and (entry.is_dir() or entry.name.endswith(".py")):
            names.add(name)
    return tuple(sorted(names))
