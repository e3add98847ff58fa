"""Virtual environments for bundle tasks with Python requirements, one per requirements digest.

``PythonEnvs.ensure(entries, tree, manifest, scratch)`` returns the environment a task's child
runs in (:class:`PythonEnv`: its interpreter, whether it was cached, the build time). The
contract:

* **Name.** The digest (SHA-256) of the normalised entries (:func:`..tasks.pyreqs.normalise`),
  the worker's interpreter (path and version) and, for each ``./dir`` entry, the paths and digests
  of the bundle's files under it: a changed local package makes a new environment.
* **Where.** ``<root>/<digest>`` (the worker's bundle cache, beside the blobs), made by
  ``python -m venv --without-pip --system-site-packages`` plus a ``.pth`` that adds the worker's
  own site directories after the environment's: torch, OpenVINO and pip itself are not installed
  again, and what the requirements install comes first. Complete once ``.dt-complete`` exists;
  a directory without it (a build that died) is removed and built again.
* **Once.** Builds of one digest are serialised (a lock per digest), so two tasks that need the same
  environment build it once; the second waits and reuses it (``cached``).
* **Confined.** pip runs under the task's sandbox (``worker/sandbox.py``): it sees the system, the
  worker's Python, the bundle read-only, and can write only the environment and the task's scratch
  directory. Package requirements are installed first with ``--only-binary=:all:`` (wheels only:
  installing a wheel runs none of its code) and the host network (pip must reach the operator's
  index, configured in ``/etc/pip.conf``). Then the bundle's ``./dir`` packages, copied into the
  scratch directory (builds write beside their sources), are built with ``--no-build-isolation
  --no-index`` on the task's own network (``--task-network``): their build backend is the
  submitter's code, and their dependencies must be listed as requirements or already present.
* **Kept.** At most ``max_envs`` complete environments (``MAX_ENVS``) are kept; after a build,
  the least recently used beyond that are deleted, never one a running task holds (``ensure``
  holds the environment it returns until ``release(digest)``).
* **Failure.** :class:`~distributed_testing.errors.ExecutionError` with pip's exit status and the
  tail of its output; the half-built environment is removed. pip runs at most ``PIP_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import site
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..bundles import manifest as mf
from ..errors import ExecutionError
from ..tasks import pyreqs
from .sandbox import Sandbox, task_environ

log = logging.getLogger(__name__)

PIP_TIMEOUT_S = 1800.0
MAX_ENVS = 16
COMPLETE = ".dt-complete"
_TAIL_CHARS = 3000
_PIP = ["-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--no-cache-dir",
        "--progress-bar", "off", "--no-warn-script-location"]


@dataclass(frozen=True)
class PythonEnv:
    """A ready environment: ``python`` runs in it; ``cached`` when no build was needed."""

    digest: str
    path: Path
    cached: bool
    build_s: float
    requirements: list[str]

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"  # not resolved: the link's place makes it this environment's

    def report(self) -> dict[str, Any]:
        """The ``python_env`` field of the task's result output."""
        return {"digest": self.digest, "cached": self.cached, "build_s": round(self.build_s, 3),
                "requirements": self.requirements}


def env_digest(entries: list[str], manifest: mf.Manifest) -> str:
    """The name of the environment ``entries`` make for this bundle on this interpreter."""
    normal = pyreqs.normalise(entries)
    local: dict[str, list[list[str]]] = {}
    for e in normal:
        if pyreqs.is_local(e):
            prefix = pyreqs.local_path(e)  # "" for "./": the whole bundle is the package
            local[e] = [[f.path, f.digest] for f in manifest.files
                        if not prefix or f.path == prefix or f.path.startswith(prefix + "/")]
    doc = {"python": [sys.executable, sys.version], "requirements": normal, "local": local}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


class PythonEnvs:
    """The worker's environments under ``root``; ``sandbox`` confines pip as it does task children."""

    def __init__(self, root: Path, sandbox: Sandbox, timeout_s: float = PIP_TIMEOUT_S,
                 max_envs: int = MAX_ENVS) -> None:
        self.root = Path(root).absolute()  # bwrap binds and runs absolute paths only
        self.root.mkdir(parents=True, exist_ok=True)
        self.sandbox = sandbox
        self.timeout_s = timeout_s
        self.max_envs = max_envs
        self._locks: dict[str, asyncio.Lock] = {}
        self._held: collections.Counter[str] = collections.Counter()

    def release(self, digest: str) -> None:
        """A task that ``ensure`` gave this environment no longer uses it."""
        self._held[digest] -= 1
        if self._held[digest] <= 0:
            del self._held[digest]

    async def ensure(self, entries: list[str], tree: Path, manifest: mf.Manifest, scratch: Path) -> PythonEnv:
        """The environment for ``entries`` (see the module docstring); built at most once."""
        normal = pyreqs.normalise(entries)
        tree, scratch = tree.absolute(), scratch.absolute()
        local = [e for e in normal if pyreqs.is_local(e)]
        for e in local:
            _check_local(tree, e)
        digest = env_digest(normal, manifest)
        path = self.root / digest
        async with self._locks.setdefault(digest, asyncio.Lock()):
            if (path / COMPLETE).exists():
                os.utime(path / COMPLETE)  # its last use: eviction removes the least recently used
                self._held[digest] += 1
                return PythonEnv(digest, path, True, 0.0, normal)
            started = time.monotonic()
            try:
                await self._build(path, normal, local, tree, scratch)
            except ExecutionError as exc:
                await asyncio.to_thread(shutil.rmtree, path, True)
                raise ExecutionError(f"{exc}\n(after {time.monotonic() - started:.1f} s)") from exc
            except BaseException:  # a cancel: the removal runs on even if the worker is stopping too
                await asyncio.shield(asyncio.to_thread(shutil.rmtree, path, True))
                raise
            took = time.monotonic() - started
            (path / COMPLETE).write_text(json.dumps({"requirements": normal, "build_s": took}))
            log.info("python environment %s built in %.1f s (%d requirements)", digest[:12], took, len(normal))
            self._held[digest] += 1
        keep = set(self._held) | {d for d, lock in self._locks.items() if lock.locked()}  # read on the loop
        await asyncio.to_thread(self._evict, keep)
        return PythonEnv(digest, path, False, took, normal)

    def _evict(self, keep: set[str]) -> None:
        """Delete the least recently used complete environments beyond ``max_envs``, none in ``keep``
        (held by a task or being built)."""
        done = sorted(((p / COMPLETE).stat().st_mtime, p) for p in self.root.iterdir() if (p / COMPLETE).exists())
        extra = len(done) - self.max_envs
        for _, p in done:
            if extra <= 0:
                break
            if p.name in keep:
                continue
            (p / COMPLETE).unlink()  # incomplete first: a crash midway leaves a directory that is rebuilt
            shutil.rmtree(p, ignore_errors=True)
            log.info("python environment %s removed (least recently used beyond %d)", p.name[:12], self.max_envs)
            extra -= 1

    async def _build(self, path: Path, normal: list[str], local: list[str], tree: Path, scratch: Path) -> None:
        if path.exists():
            await asyncio.to_thread(shutil.rmtree, path)
        await _run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(path)],
                   self.timeout_s, "python -m venv")
        _add_worker_sites(path)
        python = str(path / "bin" / "python")
        env = {**task_environ({}, scratch), "PIP_NO_INPUT": "1"}
        packages = [e for e in normal if not pyreqs.is_local(e)]
        if packages:  # wheels only, from the operator's index: no package code runs here
            argv = [python, *_PIP, "--only-binary=:all:", "--", *packages]
            host = dataclasses.replace(self.sandbox, network="host")
            await _run(host.wrap(argv, ro=[tree], rw=[path, scratch], cwd=scratch, env=env),
                       self.timeout_s, "pip install", env)
        if local:  # the bundle's own packages: their build backend is the submitter's code
            copies = await asyncio.to_thread(_copy_local, tree, local, scratch / "pip-src")
            argv = [python, *_PIP, "--no-build-isolation", "--no-index", "--", *copies]
            await _run(self.sandbox.wrap(argv, ro=[tree], rw=[path, scratch], cwd=scratch, env=env),
                       self.timeout_s, "pip install", env)


def _check_local(tree: Path, entry: str) -> None:
    root = tree.resolve()
    target = (root / entry).resolve()
    if not target.is_relative_to(root) or not target.is_dir():
        raise ExecutionError(f"Python requirement {entry!r}: not a directory of the bundle")


def _add_worker_sites(path: Path) -> None:
    """A ``.pth`` in the new environment that adds the worker's site directories (their own
    ``.pth`` files, editable installs included, are processed too) after the environment's own."""
    purelib = next((path / "lib").glob("python*/site-packages"))
    sites = [p for p in site.getsitepackages() if Path(p).is_dir()]
    lines = "".join(f"import site; site.addsitedir({p!r})\n" for p in sites)
    (purelib / "_dt_worker_site.pth").write_text(lines)


def _copy_local(tree: Path, local: list[str], dest: Path) -> list[str]:
    """Writable copies of the bundle's ``./dir`` packages under ``dest``; their paths."""
    out = []
    for e in local:
        src = tree / e
        target = dest / pyreqs.local_path(e)
        shutil.copytree(src, target, copy_function=shutil.copyfile, dirs_exist_ok=True)
        for dirpath, _, _ in os.walk(target):
            os.chmod(dirpath, 0o755)
        out.append(str(target))
    return out


async def _run(argv: list[str], timeout_s: float, what: str, env: dict[str, str] | None = None) -> None:
    """Run ``argv`` in its own process group; ExecutionError with the tail of its output when it
    fails or outlives ``timeout_s``. The group is killed on a timeout or a cancel."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        start_new_session=True, env=env if env is not None else {"PATH": os.defpath})
    try:
        async with asyncio.timeout(timeout_s):
            out, _ = await proc.communicate()
    except TimeoutError:
        _kill(proc.pid)
        await proc.wait()
        raise ExecutionError(f"installing the task's Python requirements: {what} ran past {timeout_s:g} s") from None
    except BaseException:
        _kill(proc.pid)
        await proc.wait()
        raise
    finally:
        _kill(proc.pid)  # strays of a finished pip
    if proc.returncode != 0:
        text = out.decode(errors="replace").strip()[-_TAIL_CHARS:]
        raise ExecutionError(f"installing the task's Python requirements failed ({what} exit code "
                             f"{proc.returncode}):\n{text}")


def _kill(pgid: int) -> None:
    try:
        os.killpg(pgid, 9)
    except ProcessLookupError:
        pass
