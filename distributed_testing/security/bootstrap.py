"""First-run bootstrap: the initial admin key and writing secrets to disk safely.

There is no hard-coded admin key. On first start the coordinator calls
:func:`bootstrap_admin_key`, stores the record, and writes the plaintext with
:func:`write_secret_file` (or shows it once) for the operator.

:func:`write_secret_file` writes any secret file (the admin key, the token-signing secret).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
from pathlib import Path

from distributed_testing.durable.fsutil import fsync_dir
from distributed_testing.errors import ConfigError
from distributed_testing.security.keys import KeyRecord, generate_key
from distributed_testing.security.roles import Role

__all__ = ["BOOTSTRAP_KEY_NAME", "bootstrap_admin_key", "write_secret_file"]

logger = logging.getLogger(__name__)

BOOTSTRAP_KEY_NAME = "bootstrap-admin"
SECRET_FILE_MODE = 0o600
SECRET_DIR_MODE = 0o700


def bootstrap_admin_key(now: float) -> tuple[str, KeyRecord]:
    """Generate the first admin key (named ``bootstrap-admin``, no expiry)."""
    return generate_key(Role.ADMIN, BOOTSTRAP_KEY_NAME, now)


def _check_target(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"refusing to write secret file {path}: it is a symbolic link")
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"refusing to write secret file {path}: it is not a regular file")


def _write_new(tmp: Path, data: bytes) -> None:
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags | getattr(os, "O_CLOEXEC", 0), SECRET_FILE_MODE)
    try:
        os.fchmod(fd, SECRET_FILE_MODE)  # the umask could only have narrowed it; be exact
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def write_secret_file(path: str | os.PathLike[str], text: str) -> None:
    """Atomically write ``text`` (UTF-8) to ``path`` with mode 0600.

    Missing parent directories are created with mode 0700. The content goes to a fresh temp
    file in the same directory (``O_CREAT|O_EXCL|O_NOFOLLOW``, mode 0600), is fsynced, then
    renamed over ``path`` with :func:`os.replace`, so readers see the old file or the whole new
    one, never a partial one. An existing regular file is replaced.

    Raises :class:`ConfigError` if ``path`` is a symbolic link or not a regular file (a link
    swapped in after that check is itself replaced by the rename, never followed). Other
    ``OSError``\\ s propagate; the temp file is removed on any failure.
    """
    target = Path(path)
    target.parent.mkdir(mode=SECRET_DIR_MODE, parents=True, exist_ok=True)
    _check_target(target)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
    try:
        _write_new(tmp, text.encode("utf-8"))
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(target.parent)
    logger.info("wrote secret file %s (mode 0600)", target)
