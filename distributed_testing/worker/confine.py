"""How the children of the operator's own tasks (no bundle) are confined: bubblewrap, deny-list.

A task without a bundle runs code the operator installed (tests under ``--test-root``, custom
handlers, model modules, training's built-in models) with parameters a submitter chose. That code
legitimately reads fixtures, datasets, caches and packages wherever the operator keeps them and
reaches services on the network, so the bundle sandbox's allow-list (:mod:`.sandbox`: a root with
nothing but the system and Python) would break it. Its children get the reverse
(:class:`Confinement`):

* the host's whole filesystem, read-only (``--ro-bind / /``): the test root, installed packages,
  the Hugging Face cache and the home directory stay readable, and nothing outside the task's
  scratch directory takes a write (``TMPDIR`` points into it; ``/tmp`` is the host's, read-only);
* minus what is the worker's: its state directory (the folder of ``--db-path``: outbox, WAL,
  journal, blob cache, the cache directory), its key and token files, the cache directory and the
  scratch root of every other task are covered by an empty read-only ``tmpfs`` (a file by
  ``/dev/null``), so they are absent, not merely unreadable, which holds for a worker running as
  root; the task's own scratch directory is bound back in, writable;
* its own PID namespace with a fresh ``/proc`` (no ``/proc/<worker pid>/environ`` or ``cmdline``),
  IPC and UTS namespaces, a new session, ``--die-with-parent``, every capability dropped (a root
  child cannot unmount what hides the worker's files), a fresh ``/dev`` plus the GPU nodes;
* the environment the executors already give these children (the worker's, minus its
  credentials: :mod:`distributed_testing.process.childenv`), with ``TMPDIR`` in the scratch directory;
* the host's network: operator suites reach the services they test (``--task-network`` is the
  network of shipped code).

:func:`for_worker` decides once, at start, and says so in the log: with ``--sandbox none`` these
children run unconfined (a warning at every start); where bwrap cannot make a sandbox they run
unconfined as before, with a warning naming why (shipped code is refused there, fail closed).
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .sandbox import PACKAGE_PARENT, available

log = logging.getLogger(__name__)


def state_base(config: Any) -> Path:
    """The folder that holds the worker's local state: that of ``--db-path``, else a folder under
    the system's temporary directory (bundles, scratch directories)."""
    if config.db_path is not None:
        return Path(config.db_path).parent.absolute()
    return Path(tempfile.gettempdir()) / "distributed_testing"


@dataclass(frozen=True)
class Confinement:
    """A deny-list sandbox (module docstring): ``hide`` is absent in the child, ``scratch_root``
    holds each child's scratch directory (:meth:`scratch`), itself hidden from the others."""

    hide: tuple[Path, ...]
    scratch_root: Path
    bwrap: str = "bwrap"

    def scratch(self, name: str) -> Path:
        """A fresh scratch directory (0700) for one task or one long-lived child, with ``tmp``."""
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:40]
        path = Path(tempfile.mkdtemp(prefix=f"{safe}-", dir=self.scratch_root))
        (path / "tmp").mkdir()
        return path

    @staticmethod
    def environ(base: Mapping[str, str], scratch: Path) -> dict[str, str]:
        """``base`` with the temporary directory moved into ``scratch``."""
        return {**base, "TMPDIR": str(scratch / "tmp")}

    def wrap(self, argv: Sequence[str], *, rw: Sequence[Path], cwd: Path | None = None,
             devices: Sequence[str] = ()) -> list[str]:
        """The command that runs ``argv`` confined, ``rw`` writable (those that exist)."""
        cmd = [self.bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc",
               "--unshare-uts", "--unshare-cgroup-try", "--cap-drop", "ALL",
               "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
        for d in devices:
            cmd += ["--dev-bind-try", d, d]
        dirs = []
        for p in _outermost(self.hide):
            if p.is_dir():
                cmd += ["--tmpfs", str(p)]
                dirs.append(p)
            elif p.exists():
                cmd += ["--ro-bind", "/dev/null", str(p)]
        for p in rw:
            cmd += ["--bind-try", str(p.resolve()), str(p.resolve())]  # a cache directory not made yet
        for p in dirs:  # after the binds, whose mount points bwrap makes inside the tmpfs
            cmd += ["--remount-ro", str(p)]
        if cwd is not None:
            cmd += ["--chdir", str(cwd)]
        return [*cmd, "--", *argv]


def _outermost(paths: Sequence[Path]) -> list[Path]:
    """``paths`` resolved, without those inside another of them."""
    resolved = sorted({p.resolve() for p in paths}, key=lambda p: len(p.parts))
    out: list[Path] = []
    for p in resolved:
        if not any(p.is_relative_to(q) for q in out):
            out.append(p)
    return out


def worker_paths(config: Any, cache_dir: Path) -> tuple[list[Path], Path]:
    """What a confined child must not see (the worker's files), and the scratch root.

    The state directory is hidden whole unless it holds what tasks read (the test root, the
    Python installation or this package): then its state files are hidden one by one."""
    base = state_base(config)
    scratch_root = base / f"scratch-{config.worker_id}"
    hide = [cache_dir, base / f"bundles-{config.worker_id}", scratch_root]
    for f in (getattr(config, "api_key_file", None), config.token_file):
        if f is not None:
            hide.append(Path(f).absolute())
    if config.db_path is not None:
        db = Path(config.db_path).absolute()
        hide += [db, db.with_name(db.name + ".wal"), db.parent / f"{db.name}.journal"]
        needed = [Path(config.test_root), Path(sys.prefix), Path(sys.base_prefix), PACKAGE_PARENT]
        if not any(n.resolve().is_relative_to(base.resolve()) for n in needed):
            hide.append(base)
    return hide, scratch_root


def for_worker(config: Any, cache_dir: Path) -> Confinement | None:
    """The confinement of this worker's operator tasks, or None (unconfined), logged at start."""
    if config.sandbox == "none":
        log.warning("--sandbox none: the children of every task run unconfined, with this worker's key file, state "
                    "directory and /proc/<pid>/environ in reach (the operator's explicit choice)")
        return None
    reason = available()
    if reason is not None:
        log.warning("no sandbox can be made here (%s): tasks without a bundle run unconfined as this worker's user "
                    "(the key file, state directory and /proc/<pid>/environ in their reach); shipped code is "
                    "refused", reason)
        return None
    hide, scratch_root = worker_paths(config, cache_dir)
    scratch_root.mkdir(parents=True, exist_ok=True, mode=0o700)
    log.info("tasks without a bundle run in bwrap: the filesystem read-only, %s hidden, writes to their own "
             "scratch directory under %s", ", ".join(str(p) for p in _outermost(hide)), scratch_root)
    return Confinement(tuple(hide), scratch_root)


def remove(path: Path | None) -> None:
    """Delete a scratch directory (blocking; absent is fine)."""
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)

