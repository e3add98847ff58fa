"""The worker's side of bundles: fetch what the cache lacks, build a fresh tree per task.

``BundleProvider.prepare(url, credential, digest, dest)`` reads the manifest (its digest checked),
fetches the blobs not in the cache over the worker's own credential (each digest checked on
arrival by ``BlobCache.put``), builds the read-only tree at ``dest`` from hard links (copies with
``--sandbox none``, :mod:`..bundles.tree`) and evicts the
least recently used blobs beyond ``--cache-max-gb``. Blocking file work runs in a thread. Fetches
of different tasks may overlap; a blob fetched twice is stored twice under the same name (the
rename keeps one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import ssl
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from ..bundles import digest as dg
from ..bundles import manifest as mf
from ..bundles.cache import BlobCache
from ..bundles.tree import build_tree, remove_tree
from ..errors import ExecutionError
from ..tasks import pyreqs
from .confine import state_base
from .pyenv import PythonEnvs

log = logging.getLogger(__name__)
FETCH_CONCURRENCY = 16


class BundleProvider:
    def __init__(self, cache_dir: Path, max_bytes: int, ssl_context: ssl.SSLContext | None = None, *,
                 copy: bool = False) -> None:
        self.cache = BlobCache(cache_dir, max_bytes)
        self.copy = copy  # trees of copies, not links (--sandbox none: bundles/tree.py says why)
        self._ssl = ssl_context
        self._lock = asyncio.Lock()  # the cache is used from one thread at a time

    async def prepare(self, base_url: str, credential: str, digest: str, dest: Path) -> mf.Manifest:
        headers = {"Authorization": f"Bearer {credential}"}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._ssl or True),
                                         timeout=aiohttp.ClientTimeout(total=600)) as http:
            data = await _get(http, f"{base_url}/api/v1/bundles/{digest}", headers, f"bundle {digest}")
            if dg.of_bytes(data) != digest:
                raise ExecutionError(f"bundle {digest}: the manifest received does not match its digest")
            m = mf.decode(data)
            wanted = m.digests()
            async with self._lock:
                missing = await asyncio.to_thread(self.cache.missing, wanted)
            sem = asyncio.Semaphore(FETCH_CONCURRENCY)

            async def fetch(d: str) -> None:
                async with sem:
                    blob = await _get(http, f"{base_url}/api/v1/blobs/{d}", headers, f"blob {d}")
                async with self._lock:
                    await asyncio.to_thread(self.cache.put, d, blob)
            await asyncio.gather(*(fetch(d) for d in sorted(missing)))
        async with self._lock:
            await asyncio.to_thread(self._build, m, wanted, dest)
        return m

    def _build(self, m: mf.Manifest, wanted: set[str], dest: Path) -> None:
        self.cache.touch(wanted)
        build_tree(self.cache, m, dest, copy=self.copy)
        self.cache.evict(keep=wanted)


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
                 work_root: Path, envs: PythonEnvs | None = None) -> None:
        self.accepting = accept and refusal is None
        self.sandbox = sandbox
        self.refusal = refusal
        self.provider = provider
        self.work_root = work_root
        self.envs = envs

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
        return cls(True, box, refusal, provider, root / "tasks", PythonEnvs(root / "pyenvs", box))

    @contextlib.asynccontextmanager
    async def task(self, task_type: str, task_id: str, base_url: str, credential: str,
                   digest: str, python: Sequence[str] = ()) -> AsyncIterator[dict[str, Any]]:
        """The TaskContext fields of a bundle task (tree, scratch, sandbox and, with Python
        requirements, the environment: the task's ``python`` list and the bundle's root
        ``requirements.txt``, see :mod:`.pyenv`); removed afterwards. ExecutionError names what is
        missing when this worker may not run it, or why its requirements could not be installed."""
        if not self.accepting or self.provider is None:
            raise ExecutionError("this worker does not run shipped code: " + (
                self.refusal or "it was not started with --accept-bundles"))
        if task_type not in SHIPPED_KINDS:
            raise ExecutionError(f"a bundle runs in {', '.join(sorted(SHIPPED_KINDS))} tasks only, not {task_type!r}")
        top = Path(tempfile.mkdtemp(prefix=f"{_safe(task_id)}-", dir=self.work_root))
        held: str | None = None  # the Python environment this task holds while it runs
        try:
            tree, scratch = top / "bundle", top / "scratch"
            scratch.mkdir()
            m = await self.provider.prepare(base_url, credential, digest, tree)
            fields: dict[str, Any] = {"bundle_root": tree, "scratch_dir": scratch, "sandbox": self.sandbox}
            wanted = [*_bundle_requirements(tree, m), *python]
            if wanted and self.envs is not None:
                env = await self.envs.ensure(wanted, tree, m, scratch)
                held = env.digest
                fields.update(python=env.python, python_env=env.report())
            yield fields
        finally:
            if held is not None and self.envs is not None:
                self.envs.release(held)
            await asyncio.to_thread(_remove, top)


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
    shutil.rmtree(top, ignore_errors=True)
