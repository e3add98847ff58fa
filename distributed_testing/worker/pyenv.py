"""Virtual environments for bundle tasks with Python requirements, one per requirements digest.

``PythonEnvs.ensure(entries, tree, manifest, scratch, isolated=...)`` returns the environment a
task's child runs in (:class:`PythonEnv`: its interpreter, whether it was cached, the build time).
The contract:

* **What.** The normalised entries (:func:`..tasks.pyreqs.normalise`; the submitter's captured
  environment, :mod:`..bundles.environment`, or their own ``requirements.txt`` / task list).
  An ``isolated`` environment (a ``test`` task's: :func:`plan`) holds that set alone, plus
  ``pytest`` where the set names none and the build requirements of its ``./dir`` packages
  (``[build-system] requires`` of their ``pyproject.toml``, else ``setuptools>=40.8.0``) where
  the set does not name them: no system site packages and nothing of the worker, so the run
  loads the plugins of its own set and no other, with the pytest the submitter had. Otherwise
  (the other kinds, whose children run this package's runner) the environment is made with
  ``--system-site-packages`` plus a ``.pth`` that adds the worker's own site directories after
  its own: torch, OpenVINO and this package are not installed again, and what the requirements
  install comes first.
* **Name.** The digest (SHA-256) of that list, whether it is isolated, the worker's interpreter
  (path and version) and, for each ``./dir`` entry, the paths and digests of the bundle's files
  under it: a changed local package makes a new environment.
* **Where.** ``<root>/<digest>``, complete once ``.dt-complete`` exists; a directory without it
  (a build that died) is removed and built again. Workers on one host share ``root`` (the
  worker's state folder, ``pyenvs/``).
* **Once.** Builds of one digest are serialised, in the worker by an asyncio lock and across the
  workers sharing ``root`` by ``flock`` on ``<root>/.locks/<digest>``: exclusive while one
  builds, shared while a task uses the environment. So two tasks, on one worker or two, that need
  the same environment build it once; the others wait and reuse it (``cached``). Lock files
  stay (empty): removing one safely would need every locker to check it again.
* **Confined.** pip (the worker's own, run by the environment's interpreter through pip's
  ``__pip-runner__.py``, the way ``pip --python`` runs it, so it sees only the environment's
  packages) runs under the task's sandbox (``worker/sandbox.py``): it sees the bundle and pip
  read-only and can write only the environment and the task's scratch directory. Package
  requirements are installed first with ``--only-binary=:all:`` (wheels only: installing a wheel
  runs none of its code), on the host network and with the operator's pip settings
  (:mod:`.pipconf`: config files, the local index and wheel paths they name, ``PIP_*``). Then the
  bundle's ``./dir`` packages, copied into the scratch directory (builds write beside their
  sources), are built with ``--no-build-isolation --no-index`` on the task's own network
  (``--task-network``) and without the pip settings: their build backend is the submitter's
  code, and their dependencies must be listed as requirements or already present.
* **Kept.** At most ``max_envs`` complete environments (``MAX_ENVS``) are kept; after a build,
  the least recently used beyond that are deleted, never one a running task holds (``ensure``
  holds the environment it returns until ``release(digest)``; a task of another worker holds it
  by its shared lock).
* **Failure.** :class:`~distributed_testing.errors.ExecutionError` with pip's exit status and the
  tail of its output; the half-built environment is removed. pip runs at most ``PIP_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import site
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from ..bundles import manifest as mf
from ..errors import ExecutionError
from ..tasks import pyreqs
from .pipconf import PipAccess
from .sandbox import Sandbox, take_back, task_environ

log = logging.getLogger(__name__)

PIP_TIMEOUT_S = 1800.0
MAX_ENVS = 16
COMPLETE = ".dt-complete"
LOCKS = ".locks"
DEFAULT_BUILD_REQUIRES = ["setuptools>=40.8.0"]  # pip's own for a package without [build-system]
_LOCK_POLL_S = 0.1
_TAIL_CHARS = 3000
_PIP = ["install", "--disable-pip-version-check", "--no-input", "--no-cache-dir",
        "--progress-bar", "off", "--no-warn-script-location"]


@dataclass(frozen=True)
class PythonEnv:
    """A ready environment: ``python`` runs in it; ``cached`` when no build was needed."""

    digest: str
    path: Path
    cached: bool
    build_s: float
    requirements: list[str]
    isolated: bool = False

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"  # not resolved: the link's place makes it this environment's

    def report(self) -> dict[str, Any]:
        """The ``python_env`` field of the task's result output."""
        return {"digest": self.digest, "cached": self.cached, "build_s": round(self.build_s, 3),
                "requirements": self.requirements, "isolated": self.isolated}


def plan(entries: list[str], tree: Path, isolated: bool) -> list[str]:
    """What the environment is built from: the normalised ``entries`` and, ``isolated``, pytest
    and the ``./dir`` packages' build requirements where the entries do not name them (module
    docstring). ExecutionError names a build requirement the grammar refuses."""
    normal = pyreqs.normalise(entries)
    if not isolated:
        return normal
    named = {_name(e) for e in normal if not pyreqs.is_local(e)}
    extra = [] if "pytest" in named else ["pytest"]
    for e in normal:
        if pyreqs.is_local(e):
            for req in _build_requires(tree / pyreqs.local_path(e), e):
                if _name(req) not in named:
                    extra.append(req)
    return pyreqs.normalise([*normal, *extra])


def _name(entry: str) -> str:
    try:
        return canonicalize_name(Requirement(entry).name)
    except InvalidRequirement:
        return entry


def _build_requires(pkg: Path, entry: str) -> list[str]:
    try:
        doc = tomllib.loads((pkg / "pyproject.toml").read_text(errors="replace"))
    except FileNotFoundError:
        return DEFAULT_BUILD_REQUIRES
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ExecutionError(f"Python requirement {entry!r}: its pyproject.toml cannot be read: {exc}") from exc
    requires = (doc.get("build-system") or {}).get("requires", DEFAULT_BUILD_REQUIRES)
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        raise ExecutionError(f"Python requirement {entry!r}: [build-system] requires is not a list of strings")
    for r in requires:
        if (reason := pyreqs.check(r)) is not None:
            raise ExecutionError(f"Python requirement {entry!r}: build requirement {r!r}: {reason}")
    return requires


def env_digest(entries: list[str], manifest: mf.Manifest, isolated: bool = False) -> str:
    """The name of the environment ``entries`` make for this bundle on this interpreter."""
    normal = pyreqs.normalise(entries)
    local: dict[str, list[list[str]]] = {}
    for e in normal:
        if pyreqs.is_local(e):
            prefix = pyreqs.local_path(e)  # "" for "./": the whole bundle is the package
            local[e] = [[f.path, f.digest] for f in manifest.files  # a run's state: not the package's (below)
                        if (not prefix or f.path == prefix or f.path.startswith(prefix + "/"))
                        and not mf.in_run_state(f.path)]
    doc: dict[str, Any] = {"python": [sys.executable, sys.version], "requirements": normal, "local": local}
    if isolated:
        doc["isolated"] = True
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


class PythonEnvs:
    """The environments under ``root``; ``sandbox`` confines pip as it does task children, and
    ``pip`` (:mod:`.pipconf`) is what its wheels step may see of the host's pip settings."""

    def __init__(self, root: Path, sandbox: Sandbox, timeout_s: float = PIP_TIMEOUT_S,
                 max_envs: int = MAX_ENVS, pip: PipAccess | None = None) -> None:
        self.root = Path(root).absolute()  # bwrap binds and runs absolute paths only
        (self.root / LOCKS).mkdir(parents=True, exist_ok=True)
        self.sandbox = sandbox
        self.timeout_s = timeout_s
        self.max_envs = max_envs
        self.pip = pip or PipAccess()
        self._locks: dict[str, asyncio.Lock] = {}
        self._held: collections.defaultdict[str, list[int]] = collections.defaultdict(list)  # digest: lock fds

    def release(self, digest: str) -> None:
        """A task that ``ensure`` gave this environment no longer uses it."""
        fds = self._held.get(digest)
        if fds:
            os.close(fds.pop())  # its shared lock goes with it
        if not fds:
            self._held.pop(digest, None)

    async def ensure(self, entries: list[str], tree: Path, manifest: mf.Manifest, scratch: Path, *,
                     isolated: bool = False) -> PythonEnv:
        """The environment for ``entries`` (see the module docstring); built at most once."""
        tree, scratch = tree.absolute(), scratch.absolute()
        for e in pyreqs.normalise(entries):
            if pyreqs.is_local(e):
                _check_local(tree, e)
        normal = plan(entries, tree, isolated)
        local = [e for e in normal if pyreqs.is_local(e)]
        digest = env_digest(normal, manifest, isolated)
        path = self.root / digest
        async with self._locks.setdefault(digest, asyncio.Lock()):
            fd = os.open(self.root / LOCKS / digest, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                await _flock(fd, fcntl.LOCK_SH)
                if not (path / COMPLETE).exists():  # build it, unless another worker does first
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    await _flock(fd, fcntl.LOCK_EX)
                if (path / COMPLETE).exists():
                    fcntl.flock(fd, fcntl.LOCK_SH)
                    os.utime(path / COMPLETE)  # its last use: eviction removes the least recently used
                    self._held[digest].append(fd)
                    return PythonEnv(digest, path, True, 0.0, normal, isolated)
                took = await self._timed_build(path, normal, local, tree, scratch, isolated)
                # shared again; not atomic, but the environment just built is the last eviction takes
                fcntl.flock(fd, fcntl.LOCK_SH)
            except BaseException:
                os.close(fd)
                raise
            self._held[digest].append(fd)
        await asyncio.to_thread(self._evict, set(self._held))
        return PythonEnv(digest, path, False, took, normal, isolated)

    async def _timed_build(self, path: Path, normal: list[str], local: list[str], tree: Path, scratch: Path,
                           isolated: bool) -> float:
        started = time.monotonic()
        try:
            await self._build(path, normal, local, tree, scratch, isolated)
        except ExecutionError as exc:
            await asyncio.to_thread(shutil.rmtree, path, True)
            raise ExecutionError(f"{exc}\n(after {time.monotonic() - started:.1f} s)") from exc
        except BaseException:  # a cancel: the removal runs on even if the worker is stopping too
            await asyncio.shield(asyncio.to_thread(shutil.rmtree, path, True))
            raise
        took = time.monotonic() - started
        await asyncio.to_thread(take_back, path)  # pip ran as the task's user: the shared result is the worker's
        (path / COMPLETE).write_text(json.dumps({"requirements": normal, "build_s": took, "isolated": isolated}))
        log.info("python environment %s built in %.1f s (%d requirements%s)", path.name[:12], took, len(normal),
                 ", isolated" if isolated else "")
        return took

    def _evict(self, keep: set[str]) -> None:
        """Delete the least recently used complete environments beyond ``max_envs``, none in ``keep``
        (held here) and none another worker holds or builds (its lock is taken)."""
        done = sorted(((p / COMPLETE).stat().st_mtime, p) for p in self.root.iterdir() if (p / COMPLETE).exists())
        extra = len(done) - self.max_envs
        for _, p in done:
            if extra <= 0:
                break
            if p.name in keep:
                continue
            fd = os.open(self.root / LOCKS / p.name, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                (p / COMPLETE).unlink()  # incomplete first: a crash midway leaves a directory that is rebuilt
                shutil.rmtree(p, ignore_errors=True)
            finally:
                os.close(fd)
            log.info("python environment %s removed (least recently used beyond %d)", p.name[:12], self.max_envs)
            extra -= 1

    async def _build(self, path: Path, normal: list[str], local: list[str], tree: Path, scratch: Path,
                     isolated: bool) -> None:
        if path.exists():
            await asyncio.to_thread(shutil.rmtree, path)
        venv = [sys.executable, "-m", "venv", "--without-pip", *([] if isolated else ["--system-site-packages"])]
        await _run([*venv, str(path)], self.timeout_s, "python -m venv")
        if not isolated:
            _add_worker_sites(path)
        runner = _pip_runner()
        pip = [str(path / "bin" / "python"), str(runner), *_PIP]
        env = {**task_environ({}, scratch), "PIP_NO_INPUT": "1"}
        packages = [e for e in normal if not pyreqs.is_local(e)]
        ro = [tree, runner.parent]
        if packages:  # wheels only, from the operator's index: no package code runs here
            argv = [*pip, "--only-binary=:all:", "--", *packages]
            host = dataclasses.replace(self.sandbox, network="host")
            merged = scratch / "pip-settings.conf"  # removed before any submitter code runs here
            try:
                step = {**env, **self.pip.write_merged(merged)}
                await _run(host.wrap(argv, ro=[*ro, *self.pip.ro], rw=[path, scratch], cwd=scratch, env=step),
                           self.timeout_s, "pip install", step)
            finally:
                merged.unlink(missing_ok=True)
        if local:  # the bundle's own packages: their build backend is the submitter's code
            copies = await asyncio.to_thread(_copy_local, tree, local, scratch / "pip-src")
            argv = [*pip, "--no-build-isolation", "--no-index", "--", *copies]
            step = {**env, "PIP_CONFIG_FILE": os.devnull}  # none of the operator's settings
            await _run(self.sandbox.wrap(argv, ro=ro, rw=[path, scratch], cwd=scratch, env=step),
                       self.timeout_s, "pip install", step)
        if packages or local:
            await self._keep_plugin_pyc(path, scratch, env)

    async def _keep_plugin_pyc(self, path: Path, scratch: Path, env: dict[str, str]) -> None:
        """Write the assert-rewritten byte code of the environment's pytest plugins while it is
        still writable (:mod:`.plugin_pyc`: the environment's own pytest does it, in the build's
        sandbox, with no network). A failure costs the sessions time, not the build."""
        sites = [str(p) for p in (path / "lib").glob("python*/site-packages")]
        argv = [str(path / "bin" / "python"), str(Path(__file__).with_name("plugin_pyc.py")), *sites]
        box = dataclasses.replace(self.sandbox, network="none") if self.sandbox.mode != "none" else self.sandbox
        try:
            await _run(box.wrap(argv, ro=[], rw=[path, scratch], cwd=scratch, env=env), self.timeout_s,
                       "writing the plugins' rewritten byte code", env)
        except ExecutionError as exc:
            log.warning("python environment %s: %s", path.name[:12], exc)


async def _flock(fd: int, how: int) -> None:
    """Take ``flock(fd, how)``, polling so that a cancel never leaves a thread blocked on it."""
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            await asyncio.sleep(_LOCK_POLL_S)


def _pip_runner() -> Path:
    """pip's ``__pip-runner__.py`` (pip 22.3 and later), beside the worker's pip package."""
    spec = importlib.util.find_spec("pip")
    runner = Path(spec.origin).parent / "__pip-runner__.py" if spec is not None and spec.origin else None
    if runner is None or not runner.is_file():
        raise ExecutionError("installing the task's Python requirements needs pip 22.3 or later beside the worker")
    return runner


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
    """Writable copies of the bundle's ``./dir`` packages under ``dest``; their paths. A run's state
    (``.hypothesis/``, which each local run changes) is not copied: no build reads it, and the
    environment's name does not count it (:func:`env_digest`), so a local run leaves it be."""
    out = []
    for e in local:
        src = tree / e
        target = dest / pyreqs.local_path(e)
        shutil.copytree(src, target, copy_function=shutil.copyfile, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(*mf.RUN_STATE_DIRS))
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
