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
  journal, blob cache, the cache directory), the directories of its key and token files, the
  cache directory and the scratch root of every other task are covered by an empty read-only
  ``tmpfs``, so they are absent, not merely unreadable, which holds for a worker running as root;
  the task's own scratch directory is bound back in, writable, and the test root, the
  directories on the children's ``PYTHONPATH``, the Python installation and this package
  read-only where they lie inside one of them. Directories, each
  made at start, because a mount covers only what exists when the child starts: DuckDB's WAL, the
  journal's segments and the first training run's cache directory appear later, and a new key
  renamed over the old one (``mv key.new key``) or reached through a swapped symlink (a Kubernetes
  secret's ``..data``) is another file than the one a mount covered. Where such a directory
  cannot be hidden whole (:func:`unhideable`: ``HOME``, ``/tmp``, the test root, ...) its files are
  hidden by name (a file by ``/dev/null``), with a warning at start; a long-lived child (the
  custom pool's, the benchmark's) started before a key or token file so hidden changed is
  replaced before its next task;
* its own PID namespace with a fresh ``/proc`` (no ``/proc/<worker pid>/environ`` or ``cmdline``),
  IPC and UTS namespaces, a new session, ``--die-with-parent``, every capability dropped (a root
  child cannot unmount what hides the worker's files), a fresh ``/dev`` plus the GPU nodes,
  read-only but for its own ``/dev/shm`` (a long-lived child's tasks leave nothing there for the
  next: the pool child empties it after each);
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
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..process.childenv import child_environ
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
    """A deny-list sandbox (module docstring): the directories ``hide`` are absent in the child
    (an empty read-only tmpfs each), except ``show``, paths inside them that tasks need (bound back
    read-only); ``by_name`` are hidden as they are when each child starts (where their directory
    cannot be hidden whole), and of those ``watch`` (key and token files) are watched: a
    long-lived child started before one changed is restarted (:meth:`identity`). ``scratch_root``
    holds each child's scratch directory (:meth:`scratch`), itself hidden from the others."""

    hide: tuple[Path, ...]
    scratch_root: Path
    bwrap: str = "bwrap"
    show: tuple[Path, ...] = ()
    by_name: tuple[Path, ...] = ()
    watch: tuple[Path, ...] = ()

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

    def identity(self) -> tuple[tuple[int, int] | None, ...]:
        """What the watched files are now (device and inode of what their names lead to, None
        when absent). A file hidden by name is hidden as it was when the child started: one
        renamed over it, or a symlink swapped to another, is a new file the child can read, so a
        long-lived child started under another identity is replaced before its next task."""
        out: list[tuple[int, int] | None] = []
        for p in self.watch:
            try:
                st = os.stat(p)
            except OSError:
                out.append(None)
            else:
                out.append((st.st_dev, st.st_ino))
        return tuple(out)

    def wrap(self, argv: Sequence[str], *, rw: Sequence[Path], cwd: Path | None = None,
             devices: Sequence[str] = ()) -> list[str]:
        """The command that runs ``argv`` confined, ``rw`` writable (those that exist)."""
        cmd = [self.bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc",
               "--unshare-uts", "--unshare-cgroup-try", "--cap-drop", "ALL",
               "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]
        for d in devices:
            cmd += ["--dev-bind-try", d, d]
        cmd += ["--tmpfs", "/dev/shm"]  # the one writable place in /dev (remounted read-only below)
        layers = _layers(self.hide, self.show)
        dirs = []
        for p, hidden in layers:
            if not hidden:
                cmd += ["--ro-bind-try", str(p), str(p)]
                continue
            try:
                p.mkdir(mode=0o700, parents=True, exist_ok=True)  # made at start; one removed since is made again
            except OSError:  # a file where the directory should be: bwrap refuses, and the child does not start
                pass
            cmd += ["--tmpfs", str(p)]
            dirs.append(p)
        for p in {p.resolve() for p in self.by_name}:
            if _hidden(p, layers):
                continue
            if p.is_dir():
                cmd += ["--tmpfs", str(p)]
                dirs.append(p)
            elif p.exists():  # as it is now: one made later, or renamed over it, is not hidden (Confinement)
                cmd += ["--ro-bind", "/dev/null", str(p)]
        writable = [p.resolve() for p in rw]
        for p in writable:
            cmd += ["--bind-try", str(p), str(p)]
        for p in dirs:  # after the binds, whose mount points bwrap makes inside the tmpfs
            if p not in writable:  # remounting one bound writable over it would make that read-only
                cmd += ["--remount-ro", str(p)]
        cmd += ["--remount-ro", "/dev"]  # a pool child's next task finds nothing there (and /dev/shm emptied)
        if cwd is not None:
            cmd += ["--chdir", str(cwd)]
        return [*cmd, "--", *argv]


def _layers(hide: Sequence[Path], show: Sequence[Path]) -> list[tuple[Path, bool]]:
    """The mounts that hide the directories ``hide`` and bind ``show`` back, shallowest first
    (a deeper mount covers a shallower one), each only where it changes what is seen: a directory
    inside a hidden one is hidden already, a path outside all of them is seen already."""
    hidden = {p.resolve() for p in hide}
    rules = sorted({(p, True) for p in hidden} | {(p.resolve(), False) for p in show if p.resolve() not in hidden},
                   key=lambda r: (len(r[0].parts), str(r[0])))
    out: list[tuple[Path, bool]] = []
    for p, hide_it in rules:
        if _hidden(p, out) != hide_it:
            out.append((p, hide_it))
    return out


def _hidden(path: Path, layers: Sequence[tuple[Path, bool]]) -> bool:
    """Whether ``path`` is hidden under ``layers`` (shallowest first: the deepest holding it decides)."""
    state = False
    for q, hidden in layers:
        if path.is_relative_to(q):
            state = hidden
    return state


def _shared() -> list[Path]:
    """Directories that hold others' files too: hiding one whole would hide what tasks read
    (``HOME`` and the caches under it) or use (the temporary directories)."""
    return [Path.home(), Path(tempfile.gettempdir()), Path("/tmp"), Path("/var/tmp"), Path("/dev/shm")]


def _needed(config: Any, env: Mapping[str, str] | None = None) -> list[Path]:
    """What the operator's tasks read that may lie in a directory of the worker's: the test root,
    the Python installation, this package, and the directories on the ``PYTHONPATH`` the children
    inherit (``env``, default: ``process.childenv``'s): the operator's own modules, such as an
    allowed ``mymodels:build``, kept beside ``--db-path``."""
    return [Path(config.test_root), Path(sys.prefix), Path(sys.base_prefix), PACKAGE_PARENT, *pythonpath(env)]


def pythonpath(env: Mapping[str, str] | None = None) -> list[Path]:
    """The directories on the ``PYTHONPATH`` of ``env`` (default: what task children inherit), absolute."""
    value = (child_environ() if env is None else env).get("PYTHONPATH", "")
    return [Path(p).absolute() for p in value.split(os.pathsep) if p]


def unhideable(directory: Path, needed: Sequence[Path]) -> str | None:
    """Why ``directory`` cannot be hidden whole (None: it can): a top-level directory, one that
    holds ``HOME`` or a temporary directory, one tasks need (a path of ``needed``), or one inside
    the Python installation or this package. (A needed path inside it is bound back instead.)"""
    d = directory.resolve()
    if len(d.parts) <= 2:
        return "a top-level directory"
    for s in _shared():
        if s.resolve().is_relative_to(d):
            return f"it holds {s}"
    for n in needed:
        if n.resolve() == d:
            return "tasks need it (the test root, a PYTHONPATH entry, the Python installation or this package)"
    for code in (Path(sys.prefix), Path(sys.base_prefix), PACKAGE_PARENT):
        if d.is_relative_to(code.resolve()):
            return "it lies in the Python installation or this package"
    return None


def plan(config: Any, cache_dir: Path, env: Mapping[str, str] | None = None) -> tuple[Confinement, list[str]]:
    """What a confined child must not see (the worker's files), and a warning for each of them
    hidden by name only.

    The directory of the key file and of the token file is hidden whole (a file renamed over the
    key, or a symlink swapped as Kubernetes rotates a secret, stays hidden), with the needed paths
    inside it bound back, unless :func:`unhideable`: then the file is hidden by name and watched.
    The state directory (of ``--db-path``) is hidden whole too, the needed paths inside it bound
    back, so that a file made after a child started (DuckDB's WAL, the journal's next segment) is
    hidden as well; where it cannot be (:func:`unhideable`: ``~/w.db``, ``/tmp/w.db``), the database
    and its WAL are hidden by name and the journal's directory whole. Every directory hidden is made
    at start (:func:`for_worker`), before the worker or a task writes into it."""
    base = state_base(config)
    scratch_root = base / f"scratch-{config.worker_id}"
    needed = _needed(config, env)
    hide = [cache_dir, base / f"bundles-{config.worker_id}", scratch_root]
    by_name: list[Path] = []
    watch: list[Path] = []
    notes: list[str] = []
    for flag, f in (("--api-key-file", getattr(config, "api_key_file", None)), ("--token-file", config.token_file)):
        if f is None:
            continue
        path = Path(f).absolute()
        folder = path.parent.resolve()  # the directory the name lives in, not a symlink's target's
        why = unhideable(folder, needed)
        if why is None:
            hide.append(folder)
            continue
        by_name.append(path)
        watch.append(path)
        notes.append(f"{flag} {path} lies in {folder}, which cannot be hidden whole ({why}): the file is hidden by "
                     "name, so one renamed over it or a symlink swapped to another is readable by the children "
                     "running then (the custom pool's and the benchmark's are restarted before their next task); "
                     "keep key and token files in a directory of their own")
    if config.db_path is not None:
        db = Path(config.db_path).absolute()
        why = unhideable(base, needed)
        if why is None:  # DuckDB's WAL comes and goes: only its directory hides it whenever it exists
            hide.append(base)
        else:
            hide.append(db.parent / f"{db.name}.journal")
            by_name += [db, db.with_name(db.name + ".wal")]
            notes.append(f"--db-path {db} lies in {base}, which cannot be hidden whole ({why}): the database is "
                         "hidden by name, and DuckDB's WAL beside it, which comes and goes as the worker writes, is "
                         "readable by a child started while it was absent; give --db-path a directory of its own")
    hide = [p.absolute() for p in hide]
    shown = sorted({n.resolve() for n in needed if any(n.resolve().is_relative_to(h.resolve())
                                                       and n.resolve() != h.resolve() for h in hide)})
    return Confinement(tuple(hide), scratch_root, show=tuple(shown), by_name=tuple(by_name),
                       watch=tuple(watch)), notes


def container() -> str | None:
    """The container engine this process runs under (``podman``, ``docker``, ``a container``), or None.

    Podman's marker file says so alone; Docker's (``/.dockerenv``) also lies in virtual machines
    made from a Docker image, so it counts only with a root filesystem that is no block device's
    (overlay, as Docker gives its containers)."""
    if os.path.exists("/run/.containerenv"):
        return "podman"
    try:
        root = next((line.split(" - ", 1)[1].split() for line in Path("/proc/self/mountinfo").read_text().splitlines()
                     if line.split()[4] == "/"), ["", ""])
        cgroup = Path("/proc/1/cgroup").read_text()
    except (OSError, IndexError):
        return None
    if os.path.exists("/.dockerenv") and not root[1].startswith("/dev/"):
        return "docker"
    return "a container" if any(w in cgroup for w in ("docker", "libpod", "kubepods", "containerd")) else None


# What lets bwrap make its namespaces in a container whose worker is not root (docs/operations.md,
# "Containers"): a /proc it may mount afresh, and (docker) the namespace and mount calls.
CONTAINER_OPTIONS = {
    "podman": "run it with --security-opt unmask=/proc/* (deploy/compose.podman.yaml)",
    "docker": "run it with --security-opt systempaths=unconfined and --security-opt seccomp=PROFILE (Docker's "
              "default with bwrap's calls allowed: deploy/seccomp_for_bwrap.py), and apparmor=unconfined on an "
              "AppArmor host (deploy/compose.docker.yaml)",
}


def describe(reason: str | None, sandbox: str = "bwrap") -> str:
    """One line for the start-up log: which confinement task children get here and why.

    ``reason`` is :func:`.sandbox.available`'s (None: bwrap works). It names the user the children
    run as (a root worker switches them to uid 65534; another keeps its own uid, in user namespaces
    it may make unprivileged), the container the worker runs in, and where bwrap fails in one, the
    engine's options that let it work."""
    where = container()
    inside = f" in {where if where == 'a container' else f'a {where} container'}" if where else ""
    if sandbox == "none":
        return f"confinement: none, the operator's --sandbox none{inside}"
    if reason is not None:
        hint = ""
        if where is not None:
            hint = "; " + (CONTAINER_OPTIONS.get(where) or "; or ".join(CONTAINER_OPTIONS.values()))
        return f"confinement: none{inside}: {reason}{hint}"
    uid = os.geteuid()
    who = (f"as root{inside}: task children switch to uid 65534 (setpriv), without capabilities" if uid == 0 else
           f"as uid {uid}{inside}: task children keep that uid, without capabilities, in user namespaces it makes "
           "unprivileged")
    return f"confinement: bubblewrap {who}"


def for_worker(config: Any, cache_dir: Path) -> Confinement | None:
    """The confinement of this worker's operator tasks, or None (unconfined), logged at start."""
    if config.sandbox == "none":
        log.warning("%s", describe(None, "none"))
        log.warning("--sandbox none: the children of every task run unconfined, with this worker's key file, state "
                    "directory and /proc/<pid>/environ in reach (the operator's explicit choice)")
        return None
    reason = available()
    log.log(logging.INFO if reason is None else logging.WARNING, "%s", describe(reason))
    if reason is not None:
        log.warning("no sandbox can be made here (%s): tasks without a bundle run unconfined as this worker's user "
                    "(the key file, state directory and /proc/<pid>/environ in their reach); shipped code is "
                    "refused", reason)
        return None
    confinement, notes = plan(config, cache_dir)
    for p in (confinement.scratch_root, *confinement.hide):  # a directory made later would not be hidden
        p.mkdir(parents=True, exist_ok=True, mode=0o700)
    for note in notes:
        log.warning("%s", note)
    hidden = [p for p, hide in _layers(confinement.hide, confinement.show) if hide]
    log.info("tasks without a bundle run in bwrap: the filesystem read-only, %s hidden%s, writes to their own "
             "scratch directory under %s", ", ".join(str(p) for p in [*hidden, *confinement.by_name]),
             "".join(f", {p} shown read-only" for p in confinement.show), confinement.scratch_root)
    return confinement


def remove(path: Path | None) -> None:
    """Delete a scratch directory (blocking; absent is fine)."""
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)

