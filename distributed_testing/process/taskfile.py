"""Reading a file that a task's child wrote, in a directory that child could change.

A sandboxed child owns its writable paths (worker/sandbox.py hands them to its user): once it has
run, any name in them may be a link to a file only the worker may read (which the worker would
send back as the task's results), a FIFO (an ``open`` that never returns) or a file of any size.
:func:`read_task_file` opens such a file the way the worker must: from ``under`` (a directory the
child cannot replace: a bind mount's root, or one outside its sandbox), each name below it without
following a link, the file itself only if it is a regular file, and reads at most ``limit``
bytes. OSError says which of these the file was not.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO opens at once, then is refused


def read_task_file(path: Path, *, under: Path, limit: int, tail: bool = False) -> bytes:
    """The bytes of the regular file ``path`` below ``under``, at most ``limit`` of them: a
    larger file is refused (OSError EFBIG naming its size), or with ``tail`` its last ``limit``
    bytes are read. FileNotFoundError where it is absent; OSError naming the path where a name
    on the way is a link (ELOOP) or the file is not a regular one (EINVAL)."""
    parts = Path(path).relative_to(under).parts
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "not a file", str(path))
    fd = os.open(under, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in parts[:-1]:
            below = _open(name, _DIR, fd, path)
            os.close(fd)
            fd = below
        file = _open(parts[-1], _FILE, fd, path)
    finally:
        os.close(fd)
    with os.fdopen(file, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file: a task's file is read only as one", str(path))
        if st.st_size > limit:
            if not tail:
                raise OSError(errno.EFBIG, f"{st.st_size:,} bytes, over the {limit:,} bytes read of it", str(path))
            f.seek(st.st_size - limit)
        return f.read(limit)


def _open(name: str, flags: int, dir_fd: int, path: Path) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # O_NOFOLLOW met a link
            raise OSError(exc.errno, f"{name!r} is a link or not a directory: a task's file is not read through one",
                          str(path)) from None
        raise
