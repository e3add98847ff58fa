"""The worker's side of bundles: fetch what the cache lacks, build the read-only tree a task runs.

``BundleProvider.prepare(url, credential, digest, dest)`` reads the manifest (its digest checked),
fetches the blobs not in the cache over the worker's own credential (each digest checked on
arrival by ``BlobCache.put``), builds the tree at ``dest`` (the task's own writable copies: ``prepare`` serves
``--sandbox none``, :mod:`..bundles.tree`) and evicts the
least recently used blobs beyond ``--cache-max-gb``. Blocking file work runs in a thread. Fetches
of different tasks may overlap; a blob fetched twice is stored twice under the same name (the
rename keeps one).

``BundleProvider.shared(url, credential, digest)`` gives a task the tree of a bundle that is kept
for reuse: built once, then handed to every later task of the same bundle at no cost (no fetch, no
link), and removed, least recently used first, once more than ``MAX_TREES`` are kept and unused.
A task never runs in it: under the sandbox each task gets its own writable view of it
(:func:`..bundles.tree.writable_view`: fresh directories and copies of the files that the task
may rewrite, ``chmod`` and ``touch``; on a root worker files over 16 MiB are hard links its
unprivileged user reads but cannot change), thrown away after the task, so tests that write
beside themselves or change their own fixtures work as in a checkout and the kept tree stays as
shipped. A worker with ``--sandbox none`` builds a fresh writable tree of copies per task
(``prepare``). A validated
manifest is remembered by its digest (``MAX_MANIFESTS``), so a task of a known bundle asks the
coordinator for nothing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import os
import shutil
import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from ..bundles import digest as dg
from ..bundles import manifest as mf
from ..bundles.bytecode import BytecodeStore, entry_key
from ..bundles.cache import BlobCache
from ..bundles.tree import build_tree, remove_tree, writable_view
from ..errors import ExecutionError
from ..process.aio import thread_to_end
from ..tasks import pyreqs
from .confine import state_base
from .pipconf import PipAccess
from .pyenv import PythonEnvs
from .sandbox import SCRATCH_NAME, task_uid

log = logging.getLogger(__name__)
FETCH_CONCURRENCY = 16
MAX_TREES = 8  # unused shared trees kept beyond this are removed, least recently used first
MAX_MANIFESTS = 64


@dataclass
class _Tree:
    path: Path
    manifest: mf.Manifest
    users: int = 0
    last_used: float = 0.0


class BundleProvider:
    def __init__(self, cache_dir: Path, max_bytes: int, ssl_context: ssl.SSLContext | None = None, *,
                 trees_dir: Path | None = None, copy: bool = False) -> None:
        self.cache = BlobCache(cache_dir, max_bytes)
        self.copy = copy  # trees of copies, not links (--sandbox none: bundles/tree.py says why)
        self._ssl = ssl_context
        self._lock = asyncio.Lock()  # the cache is used from one thread at a time
        self._manifests: collections.OrderedDict[str, mf.Manifest] = collections.OrderedDict()
        self.trees_dir = Path(trees_dir) if trees_dir is not None else Path(cache_dir).parent / "trees"
        _clear(self.trees_dir)  # what an earlier run of this worker left
        self._trees: dict[str, _Tree] = {}
        self._building: dict[str, asyncio.Lock] = {}
        self.builds = 0  # trees built so far (shared and fresh)

    async def prepare(self, base_url: str, credential: str, digest: str, dest: Path) -> mf.Manifest:
        """A fresh tree of bundle ``digest`` at ``dest`` (the caller removes it)."""
        m = await self._fetch(base_url, credential, digest)
        async with self._lock:
            await thread_to_end(self._build, m, m.digests(), dest)
        return m

    @contextlib.asynccontextmanager
    async def shared(self, base_url: str, credential: str, digest: str) -> AsyncIterator[tuple[Path, mf.Manifest]]:
        """The kept tree of bundle ``digest`` (built on first use) and its manifest, held while
        the block runs; see the module docstring for when this is sound."""
        async with self._building.setdefault(digest, asyncio.Lock()):
            t = self._trees.get(digest)
            if t is None:
                m = await self._fetch(base_url, credential, digest)
                path = self.trees_dir / digest
                async with self._lock:
                    await thread_to_end(self._build, m, m.digests() | self._kept_digests(), path)
                t = self._trees[digest] = _Tree(path, m)
            t.users += 1
        try:
            yield t.path, t.manifest
        finally:
            t.users -= 1
            t.last_used = time.monotonic()
            await self._trim()

    async def _fetch(self, base_url: str, credential: str, digest: str) -> mf.Manifest:
        """The manifest of ``digest`` with every blob it names in the cache."""
        m = self._manifests.get(digest)
        if m is not None:
            self._manifests.move_to_end(digest)
            if not self.cache.missing(m.digests()):
                return m
        headers = {"Authorization": f"Bearer {credential}"}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._ssl or True),
                                         timeout=aiohttp.ClientTimeout(total=600)) as http:
            if m is None:
                data = await _get(http, f"{base_url}/api/v1/bundles/{digest}", headers, f"bundle {digest}")
                if dg.of_bytes(data) != digest:
                    raise ExecutionError(f"bundle {digest}: the manifest received does not match its digest")
                m = mf.decode(data)
                self._manifests[digest] = m
                while len(self._manifests) > MAX_MANIFESTS:
                    self._manifests.popitem(last=False)
            async with self._lock:
                missing = self.cache.missing(m.digests())
            sem = asyncio.Semaphore(FETCH_CONCURRENCY)

            async def fetch(d: str) -> None:
                async with sem:
                    blob = await _get(http, f"{base_url}/api/v1/blobs/{d}", headers, f"blob {d}")
                async with self._lock:
                    await asyncio.to_thread(self.cache.put, d, blob)
            await asyncio.gather(*(fetch(d) for d in sorted(missing)))
        return m

    def _build(self, m: mf.Manifest, keep: set[str], dest: Path) -> None:
        remove_tree(dest)  # a shared tree's leftover from a build that failed midway
        self.cache.touch(m.digests())
        build_tree(self.cache, m, dest, copy=self.copy)
        self.cache.evict(keep=keep)
        self.builds += 1

    def _kept_digests(self) -> set[str]:
        return set().union(*(t.manifest.digests() for t in self._trees.values()))

    async def _trim(self) -> None:
        idle = sorted((t.last_used, d) for d, t in self._trees.items() if t.users == 0)
        for _, d in idle[:max(0, len(self._trees) - MAX_TREES)]:
            gone = self._trees.pop(d).path
            trash = gone.with_name(f".{d}-{time.monotonic_ns()}")
            os.rename(gone, trash)  # the name is free at once for a task that wants the bundle again
            await asyncio.to_thread(remove_tree, trash)


def _clear(trees: Path) -> None:
    if trees.exists():
        for p in trees.iterdir():
            remove_tree(p)
    trees.mkdir(parents=True, exist_ok=True)


async def _get(http: aiohttp.ClientSession, url: str, headers: dict[str, str], what: str) -> bytes:
    try:
        async with http.get(url, headers=headers) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise ExecutionError(f"fetching {what}: HTTP {resp.status}: {body[:300].decode(errors='replace')}")
            return body
    except aiohttp.ClientError as exc:
        raise ExecutionError(f"fetching {what}: {exc}") from exc


SHIPPED_KINDS = frozenset({"test", "custom", "benchmark", "training"})  # kinds whose executor runs a bundle inside the sandbox


class ShippedCode:
    """Whether this worker runs shipped code, decided once at start, and each such task's dirs.

    ``--accept-bundles`` with ``--sandbox bwrap`` where bwrap cannot make a sandbox: shipped code
    is refused (fail closed) and ``refusal`` says why; ``--sandbox none`` runs it unconfined, an
    operator's explicit choice logged as a warning at every start."""

    def __init__(self, accept: bool, sandbox: Any, refusal: str | None, provider: BundleProvider | None,
                 work_root: Path, envs: PythonEnvs | None = None, bytecode: BytecodeStore | None = None) -> None:
        self.accepting = accept and refusal is None
        self.sandbox = sandbox
        self.refusal = refusal
        self.provider = provider
        self.work_root = work_root
        self.envs = envs
        self.bytecode = bytecode  # kept between a submitter's pytest sessions of one tree (bundles/bytecode.py)

    @classmethod
    def at_start(cls, config: Any, ssl_context: ssl.SSLContext | None) -> ShippedCode:
        from . import sandbox as sb

        box = sb.Sandbox(mode=config.sandbox, network=config.task_network)
        if not config.accept_bundles:
            return cls(False, box, None, None, Path())
        refusal = sb.available() if config.sandbox == "bwrap" else None
        if refusal is not None:
            log.error("--accept-bundles: refusing shipped code, no sandbox can be made: %s", refusal)
        elif config.sandbox == "none":
            log.warning("--sandbox none: tasks with shipped code run unconfined, with this worker's files and "
                        "environment in reach (the operator's explicit choice)")
        root = state_base(config) / f"bundles-{config.worker_id}"  # task paths go to bwrap and pytest's cwd
        provider = BundleProvider(root / "cache", int(config.cache_max_gb * 1024 ** 3), ssl_context,
                                  copy=config.sandbox == "none")
        (root / "tasks").mkdir(parents=True, exist_ok=True)
        envs = PythonEnvs(state_base(config) / "pyenvs", box,  # shared by this host's workers: built once
                          pip=PipAccess.of_host(os.environ))  # the operator's pip settings, for the wheels step
        return cls(True, box, refusal, provider, root / "tasks", envs, BytecodeStore(root / "bytecode"))

    @contextlib.asynccontextmanager
    async def task(self, task_type: str, task_id: str, base_url: str, credential: str, digest: str,
                   python: Sequence[str] = (), session_of: str | None = None) -> AsyncIterator[dict[str, Any]]:
        """The TaskContext fields of a bundle task (tree, scratch, sandbox and, with Python
        requirements, the environment: the task's ``python`` list, else the bundle's root
        ``requirements.txt``, see :mod:`.pyenv`); removed afterwards. ExecutionError names what is
        missing when this worker may not run it, or why its requirements could not be installed.
        ``session_of``: the key id of the submitter whose pytest session this is: in a sandbox its
        view is seeded with the byte code that key's last session of the tree and environment
        kept, and what this one compiled is kept when it ends (:mod:`..bundles.bytecode`); the
        fields' ``keep_bytecode`` keeps it earlier (the session, once it has collected)."""
        if not self.accepting or self.provider is None:
            raise ExecutionError("this worker does not run shipped code: " + (
                self.refusal or "it was not started with --accept-bundles"))
        if task_type not in SHIPPED_KINDS:
            raise ExecutionError(f"a bundle runs in {', '.join(sorted(SHIPPED_KINDS))} tasks only, not {task_type!r}")
        top = Path(tempfile.mkdtemp(prefix=f"{_safe(task_id)}-", dir=self.work_root))
        held: str | None = None  # the Python environment this task holds while it runs
        kept_as: str | None = None  # the byte code store's entry for this session's view
        try:
            async with contextlib.AsyncExitStack() as stack:
                scratch = top / SCRATCH_NAME  # the sandbox shows top at /task: HOME /task/home
                scratch.mkdir()
                if self.sandbox.mode == "none":  # the task could write to its tree: a fresh one
                    tree = top / "bundle"
                    m = await self.provider.prepare(base_url, credential, digest, tree)
                else:  # the kept tree of this bundle, and the task's own writable view of it
                    kept, m = await stack.enter_async_context(self.provider.shared(base_url, credential, digest))
                    tree = top / "tree"
                    await thread_to_end(writable_view, kept, m, tree, link_large=task_uid() is not None)
                fields: dict[str, Any] = {"bundle_root": tree, "scratch_dir": scratch, "sandbox": self.sandbox}
                # the task's own list (the plugin's captured environment) replaces the bundle's file
                wanted = list(python) if python else _bundle_requirements(tree, m)
                if wanted and self.envs is not None:
                    # a test run's environment is its set alone: no worker plugin loads into it
                    env = await self.envs.ensure(wanted, tree, m, scratch, isolated=task_type == "test")
                    held = env.digest
                    fields.update(python=env.python, python_env=env.report())
                if session_of is not None and self.bytecode is not None and self.sandbox.mode != "none":
                    kept_as = entry_key(session_of, mf.code_digest(m), held or "")
                    await thread_to_end(self.bytecode.seed, kept_as, tree)
                    fields["keep_bytecode"] = functools.partial(self._keep_bytecode, kept_as, tree)
                yield fields
        finally:
            if held is not None and self.envs is not None:
                self.envs.release(held)
            if kept_as is not None:  # what the session compiled after its collection, too
                await self._keep_bytecode(kept_as, top / "tree")
            await asyncio.to_thread(_remove, top)

    async def _keep_bytecode(self, key: str, tree: Path) -> None:
        """Keep the byte code under a session's view ``tree`` as entry ``key`` (:mod:`..bundles.bytecode`)."""
        assert self.bytecode is not None
        try:
            await asyncio.to_thread(self.bytecode.keep, key, tree)
        except OSError as exc:
            log.warning("byte code of a pytest session in %s not kept: %s", tree, exc)


def _bundle_requirements(tree: Path, m: mf.Manifest) -> list[str]:
    """The entries of the bundle's root ``requirements.txt`` (none without one); ExecutionError
    naming each refused line (the grammar of :mod:`..tasks.pyreqs`, as at submit)."""
    if not any(f.path == "requirements.txt" for f in m.files):
        return []
    entries, problems = pyreqs.parse_file((tree / "requirements.txt").read_text(errors="replace"))
    if problems:
        raise ExecutionError("the bundle's requirements.txt: " + "; ".join(problems[:10]))
    return entries


def _safe(task_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in task_id)[:40]


def _remove(top: Path) -> None:
    remove_tree(top / "bundle")
    remove_tree(top / "tree")
    shutil.rmtree(top, ignore_errors=True)
