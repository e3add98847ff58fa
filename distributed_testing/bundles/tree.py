"""A read-only tree of a bundle, built from the blob cache by hard links, and a task's writable view of it.

``build_tree(cache, manifest, dest)`` makes every directory, links each file from the cache
(``BlobCache.path``, or its executable twin for mode 0755) and then makes the directories
read-only (0555). A cache on another filesystem than ``dest`` gets copies instead of links, and so
does ``copy=True``: a worker with ``--sandbox none`` asks for it, because there the task runs as
the worker's user (root, or the owner of the cache's files) outside any read-only mount, and could
``chmod`` a linked file and write through it into the cache that later tasks' trees are built from. Every blob must be in the cache (the
worker fetches the missing ones first). ``remove_tree`` undoes it.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from .cache import BlobCache
from .manifest import Manifest


def build_tree(cache: BlobCache, m: Manifest, dest: Path, *, copy: bool = False) -> None:
    dest = Path(dest)
    dirs = _make_dirs(m, dest)
    link = os.link
    for f in m.files:
        src = cache.executable(f.digest) if f.mode == 0o755 else cache.path(f.digest)
        if copy:
            _copy(src, dest / f.path, f.mode)
            continue
        try:
            link(src, dest / f.path)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EMLINK, errno.EPERM):
                raise
            _copy(src, dest / f.path, f.mode)
    for d in reversed(dirs):
        os.chmod(dest / d, 0o555)
    os.chmod(dest, 0o555)


def writable_view(src: Path, m: Manifest, dest: Path, *, copy: bool) -> None:
    """A task's own view of the built tree ``src`` at ``dest``: every directory made anew (so the
    task creates, renames and removes files in it as in a checkout), each file a hard link to
    ``src``'s, or with ``copy`` a writable copy. Links are sound only where the task cannot change
    the linked file: a child running as another user than the files' owner (a root worker's
    sandbox, worker/sandbox.py) gets EACCES writing one in place and EPERM on ``chmod``; where the
    child would own them (a worker not running as root), ``copy`` them. A file that cannot take
    another link (EMLINK, EXDEV) is copied too: no other bundle can make this one's views fail."""
    dest = Path(dest)
    _make_dirs(m, dest)
    for f in m.files:
        if not copy:
            try:
                os.link(src / f.path, dest / f.path)
                continue
            except OSError as exc:  # a file linked to its limit (EMLINK: another bundle's 65,000 empty files)
                if exc.errno not in (errno.EMLINK, errno.EXDEV):
                    raise
        shutil.copyfile(src / f.path, dest / f.path)  # the task's own: it may change it
        os.chmod(dest / f.path, f.mode | 0o200)


def _make_dirs(m: Manifest, dest: Path) -> list[str]:
    """``dest`` and every directory of ``m`` under it; the latter, relative and sorted."""
    dest.mkdir(parents=True)
    dirs = sorted({p.rsplit("/", 1)[0] for p in (f.path for f in m.files) if "/" in p})
    for d in dirs:
        os.makedirs(dest / d, exist_ok=True)
    return dirs


def _copy(src: Path, dest: Path, mode: int) -> None:
    shutil.copyfile(src, dest)
    os.chmod(dest, mode & 0o555)


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
