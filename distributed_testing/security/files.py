"""Private state on disk: directories 0700, files 0600, and a check of what already exists.

The coordinator's state directory holds the DuckDB file, its ``.wal``, the journal, the admin
key and the token-signing secret; the worker's holds its outbox. Whoever can read them can read
task payloads and results (and, for the secret, sign tokens), so:

* a directory this process creates for state is created with mode 0700
  (:func:`make_private_dir`); an existing one is left as the operator made it, with a warning
  when group or others may enter it;
* a state file that grants group or others any access is narrowed to 0600 when this process
  owns it, with a warning naming it (:func:`tighten`); one owned by someone else, or one whose
  mode cannot be changed (a read-only mount), is only warned about.

Blocking file-system calls: run them off the event loop.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

__all__ = ["PRIVATE_DIR_MODE", "PRIVATE_FILE_MODE", "make_private_dir", "tighten", "tighten_tree"]

log = logging.getLogger(__name__)

PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700
_OPEN_BITS = stat.S_IRWXG | stat.S_IRWXO


def make_private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) with mode 0700, or warn if it exists and is open.

    Missing parents are created too, with the process umask (like ``mkdir -p``). An existing
    directory keeps its mode; if group or others have any access, a warning names it.
    """
    try:
        path.mkdir(mode=PRIVATE_DIR_MODE, parents=True)
    except FileExistsError:
        mode = path.stat().st_mode
        if not stat.S_ISDIR(mode):
            raise NotADirectoryError(f"state directory {path} exists and is not a directory") from None
        if mode & _OPEN_BITS:
            log.warning("state directory %s has mode %04o: other local users can list it (its files are "
                        "kept 0600); chmod 700 it", path, stat.S_IMODE(mode))
        return
    log.info("created state directory %s (mode 0700)", path)


def tighten(path: Path, *, quiet: bool = False) -> None:
    """Narrow an existing state file (or directory) that grants group or others access.

    A file becomes 0600, a directory 0700, when this process owns it; a warning names it unless
    ``quiet`` (for files that are re-created routinely, like DuckDB's WAL). A file owned by
    another user is only warned about. A missing path is ignored; symbolic links are not followed.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or not st.st_mode & _OPEN_BITS:
        return
    old = stat.S_IMODE(st.st_mode)
    if st.st_uid != os.geteuid():
        log.warning("state file %s has mode %04o and belongs to uid %d, not this process: other local "
                    "users may read it; chmod 600 it", path, old, st.st_uid)
        return
    new = PRIVATE_DIR_MODE if stat.S_ISDIR(st.st_mode) else PRIVATE_FILE_MODE
    try:
        os.chmod(path, new)
    except OSError as exc:  # a read-only mount, say: the operator's to fix, not a reason to stop
        log.warning("state file %s has mode %04o, readable by other local users, and cannot be changed (%s); "
                    "chmod 600 it", path, old, exc.strerror)
        return
    if not quiet:
        log.warning("state file %s had mode %04o, readable by other local users: changed it to %04o",
                    path, old, new)


def tighten_tree(directory: Path) -> None:
    """:func:`tighten` ``directory`` and every entry directly in it (a journal directory)."""
    if not directory.is_dir():
        return
    tighten(directory)
    for entry in directory.iterdir():
        tighten(entry)
