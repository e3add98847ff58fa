"""Where the coordinator keeps bundle blobs (file contents and manifests), by digest, and which
keys hold each.

One protocol, three homes: :class:`DirBlobs` (a directory beside a DuckDB file, ``<db>.blobs/``),
:class:`MemoryBlobs` (``memory://`` and tests) and ``pgblobs.PgBlobs`` (the tables ``dt_blobs`` and
``dt_blob_refs`` of a PostgreSQL store, so every member of an HA group sees every blob). A blob is
stored once however many bundles or keys hold it. Each blob carries ``used_at`` (unix seconds):
set when it is stored and whenever a manifest or task that refers to it arrives (``touch``);
``sweep(before)`` deletes the blobs not used since ``before`` (``--bundle-retention``), and with
them every key's hold on them. Storing the same digest twice at once is safe everywhere: a
directory store writes to a temporary file and renames it (the bytes are the same whichever
wins), PostgreSQL upserts. Callers check the digest before ``put``.

Holds (``owner``: an API key id): a key that stores a blob holds it, and one that stores a manifest
through the manifest route holds it as a bundle (``bundle=True``). What a key holds is what it may
read back and name in a task (``coordinator/bundle_access.py``), and the bytes of the blobs it
holds count against its stored-bytes quota: a put with ``limit`` > 0 that would take the key's
held bytes past it stores nothing and raises :class:`OverQuota`, checked and stored as one step
(under a lock here, an advisory lock per key in PostgreSQL), so concurrent uploads cannot pass it
together. A blob another key stored costs a key its size once it stores it too.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol


class OverQuota(Exception):
    """Storing ``adding`` more bytes would take a key holding ``used`` bytes past ``limit``."""

    def __init__(self, used: int, adding: int, limit: int) -> None:
        super().__init__(f"{used} bytes held, {adding} more, limit {limit}")
        self.used, self.adding, self.limit = used, adding, limit


class BlobStore(Protocol):
    async def missing(self, digests: Iterable[str], owner: str | None = None) -> list[str]:
        """The digests not stored (with ``owner``: not held by that key), in the order given."""

    async def put(self, digest: str, data: bytes, now: float, owner: str | None = None, *, limit: int = 0,
                  bundle: bool = False) -> bool:
        """Store ``data`` under ``digest``, held by ``owner`` (as a bundle with ``bundle``); False
        when it was already there (then only touched). OverQuota past ``limit`` (0: none)."""

    async def put_many(self, blobs: list[tuple[str, bytes]], now: float, owner: str | None = None, *,
                       limit: int = 0) -> int:
        """``put`` each (digest, data) pair, durably as one batch, all or none; how many were new."""

    def staging(self, digest: str) -> Path | None:
        """The directory to write ``digest``'s bytes to before :meth:`put_file` (None: anywhere)."""

    async def put_file(self, digest: str, path: Path, now: float, owner: str | None = None, *,
                       limit: int = 0) -> bool:
        """``put`` the bytes of the file at ``path``, which is moved in or removed."""

    async def get(self, digest: str) -> bytes | None: ...

    async def sizes(self, digests: Iterable[str], owner: str | None = None) -> dict[str, int]:
        """The size of each of ``digests`` stored (with ``owner``: held by that key)."""

    async def usage(self, owner: str) -> int:
        """The bytes of the blobs ``owner`` holds."""

    async def holders(self, digest: str) -> dict[str, bool]:
        """The keys that hold ``digest``, each with whether it holds it as a bundle."""

    async def touch(self, digests: Iterable[str], now: float) -> None: ...

    async def sweep(self, before: float) -> int:
        """Delete blobs last used before ``before``, and the holds on them; how many were deleted."""


_OWNER = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def _check_owner(owner: str | None) -> None:
    if owner is not None and not _OWNER.match(owner):  # it names a directory of DirBlobs
        raise ValueError(f"not a key id: {owner!r}")


class _Holds:
    """Which keys hold which blobs, and the bytes each key holds (kept in memory; DirBlobs keeps
    it on disk too). Not locked: callers serialize."""

    def __init__(self) -> None:
        self.by_digest: dict[str, dict[str, bool]] = {}
        self.size: dict[str, int] = {}
        self.used: Counter[str] = Counter()

    def adding(self, owner: str, items: Iterable[tuple[str, int]]) -> int:
        """The bytes ``owner`` would newly hold by holding ``items`` (digest, size)."""
        new = {d: n for d, n in items if owner not in self.by_digest.get(d, {})}
        return sum(new.values())

    def check(self, owner: str | None, items: Iterable[tuple[str, int]], limit: int) -> None:
        if owner is not None and limit > 0:
            adding = self.adding(owner, items)
            if adding and self.used[owner] + adding > limit:
                raise OverQuota(self.used[owner], adding, limit)

    def add(self, owner: str, digest: str, size: int, bundle: bool) -> bool:
        """Record the hold; True when it is new (or newly a bundle)."""
        keys = self.by_digest.setdefault(digest, {})
        self.size[digest] = size
        if owner not in keys:
            self.used[owner] += size
        elif keys[owner] or not bundle:
            return False
        keys[owner] = keys.get(owner, False) or bundle
        return True

    def drop(self, digest: str) -> list[str]:
        """Forget every hold on ``digest``; the keys that held it."""
        keys = self.by_digest.pop(digest, {})
        size = self.size.pop(digest, 0)
        for k in keys:
            self.used[k] -= size
            if self.used[k] <= 0:
                del self.used[k]
        return list(keys)


async def take_file(path: Path) -> bytes:
    """The bytes of an upload staged at ``path``, which is removed: what a store that keeps blobs
    in memory or in a database (not as files) does with one."""
    try:
        return await asyncio.to_thread(Path(path).read_bytes)
    finally:
        Path(path).unlink(missing_ok=True)


class MemoryBlobs:
    def __init__(self) -> None:
        self.blobs: dict[str, tuple[bytes, float]] = {}
        self.holds = _Holds()

    async def missing(self, digests: Iterable[str], owner: str | None = None) -> list[str]:
        if owner is None:
            return [d for d in digests if d not in self.blobs]
        return [d for d in digests if owner not in self.holds.by_digest.get(d, {})]

    async def put(self, digest: str, data: bytes, now: float, owner: str | None = None, *, limit: int = 0,
                  bundle: bool = False) -> bool:
        _check_owner(owner)
        self.holds.check(owner, [(digest, len(data))], limit)
        new = digest not in self.blobs
        self.blobs[digest] = (data, now)
        if owner is not None:
            self.holds.add(owner, digest, len(data), bundle)
        return new

    async def put_many(self, blobs: list[tuple[str, bytes]], now: float, owner: str | None = None, *,
                       limit: int = 0) -> int:
        _check_owner(owner)
        self.holds.check(owner, {d: len(b) for d, b in blobs}.items(), limit)
        return sum([await self.put(d, data, now, owner) for d, data in blobs])

    def staging(self, digest: str) -> Path | None:
        return None

    async def put_file(self, digest: str, path: Path, now: float, owner: str | None = None, *,
                       limit: int = 0) -> bool:
        return await self.put(digest, await take_file(path), now, owner, limit=limit)

    async def get(self, digest: str) -> bytes | None:
        found = self.blobs.get(digest)
        return None if found is None else found[0]

    async def sizes(self, digests: Iterable[str], owner: str | None = None) -> dict[str, int]:
        return {d: len(self.blobs[d][0]) for d in digests
                if d in self.blobs and (owner is None or owner in self.holds.by_digest.get(d, {}))}

    async def usage(self, owner: str) -> int:
        return self.holds.used.get(owner, 0)

    async def holders(self, digest: str) -> dict[str, bool]:
        return dict(self.holds.by_digest.get(digest, {}))

    async def touch(self, digests: Iterable[str], now: float) -> None:
        for d in digests:
            if d in self.blobs:
                self.blobs[d] = (self.blobs[d][0], now)

    async def sweep(self, before: float) -> int:
        old = [d for d, (_, used) in self.blobs.items() if used < before]
        for d in old:
            del self.blobs[d]
            self.holds.drop(d)
        return len(old)


class DirBlobs:
    """``<root>/<d[:2]>/<d>``; ``used_at`` is the file's mtime. A key's hold is the empty file
    ``<root>/refs/<key id>/<d>`` (``<d>.bundle`` beside it: held as a bundle), read once into
    memory at first use; a hold is not made durable (a crash may lose one: the key uploads the
    blob again). Blocking work runs in a thread; ``_lock`` makes each check-and-store one step."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()
        self._holds: _Holds | None = None

    def _path(self, digest: str) -> Path:
        return self.root / digest[:2] / digest

    def _loaded(self) -> _Holds:
        """The holds, read from ``refs/`` on first use (call with ``_lock`` held)."""
        if self._holds is None:
            holds = _Holds()
            refs = self.root / "refs"
            for key_dir in refs.iterdir() if refs.is_dir() else ():
                names = {p.name for p in key_dir.iterdir()}
                for name in sorted(n for n in names if not n.endswith(".bundle")):
                    try:
                        size = self._path(name).stat().st_size
                    except FileNotFoundError:  # swept while a hold was being written
                        (key_dir / name).unlink(missing_ok=True)
                        continue
                    holds.add(key_dir.name, name, size, f"{name}.bundle" in names)
            self._holds = holds
        return self._holds

    def _hold(self, owner: str, digest: str, size: int, bundle: bool) -> None:
        """Record a hold in memory and on disk (``_lock`` held)."""
        if self._loaded().add(owner, digest, size, bundle):
            key_dir = self.root / "refs" / owner
            key_dir.mkdir(parents=True, exist_ok=True)
            (key_dir / digest).touch()
            if bundle:
                (key_dir / f"{digest}.bundle").touch()

    async def missing(self, digests: Iterable[str], owner: str | None = None) -> list[str]:
        wanted = list(digests)
        if owner is None:
            return await asyncio.to_thread(lambda: [d for d in wanted if not self._path(d).exists()])

        def run() -> list[str]:
            with self._lock:
                held = self._loaded().by_digest
                return [d for d in wanted if owner not in held.get(d, {})]
        return await asyncio.to_thread(run)

    async def put(self, digest: str, data: bytes, now: float, owner: str | None = None, *, limit: int = 0,
                  bundle: bool = False) -> bool:
        return await asyncio.to_thread(self._put_many, [(digest, data)], now, owner, limit, bundle) == 1

    async def put_many(self, blobs: list[tuple[str, bytes]], now: float, owner: str | None = None, *,
                       limit: int = 0) -> int:
        return await asyncio.to_thread(self._put_many, blobs, now, owner, limit, False)

    def _put_many(self, blobs: list[tuple[str, bytes]], now: float, owner: str | None, limit: int,
                  bundle: bool) -> int:
        """Write every blob not stored yet to a temporary file, make them all durable with one
        ``syncfs`` (an fsync per file costs ~7 ms each on a loaded disk: 70 s for 10,000 small
        files), then, with the quota checked, rename each into place, so a name never points at
        bytes a crash could lose."""
        _check_owner(owner)
        staged: list[tuple[str, Path]] = []
        seen: set[str] = set()
        try:
            for digest, data in blobs:
                if digest in seen or self._path(digest).exists():
                    continue
                seen.add(digest)
                staged.append((digest, self._stage(digest, data)))
            _sync([p for _, p in staged])
            return self._commit(staged, {d: len(b) for d, b in blobs}, now, owner, limit, bundle)
        finally:
            for _, path in staged:
                path.unlink(missing_ok=True)

    def _stage(self, digest: str, data: bytes) -> Path:
        dest = self._path(digest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return Path(name)

    def _commit(self, staged: list[tuple[str, Path]], sizes: dict[str, int], now: float, owner: str | None,
                limit: int, bundle: bool) -> int:
        """With the quota checked: rename the ``staged`` files into place (a concurrent upload of
        the same digest wrote the same bytes), touch the rest, record ``owner``'s holds."""
        with self._lock:
            self._loaded().check(owner, sizes.items(), limit)
            for digest, path in staged:
                os.replace(path, self._path(digest))
            fresh = {d for d, _ in staged}
            staged.clear()  # moved: nothing left for the caller to remove
            for digest, size in sizes.items():
                try:
                    os.utime(self._path(digest), (now, now))
                except FileNotFoundError:  # stored before, and swept since it was looked at
                    if digest in fresh:
                        raise
                    raise FileNotFoundError(f"blob {digest} was deleted by the retention sweep while it was "
                                            "stored again; send it again") from None
                if owner is not None:
                    self._hold(owner, digest, size, bundle)
            return len(fresh)

    def staging(self, digest: str) -> Path | None:
        where = self._path(digest).parent
        where.mkdir(parents=True, exist_ok=True)
        return where

    async def put_file(self, digest: str, path: Path, now: float, owner: str | None = None, *,
                       limit: int = 0) -> bool:
        def run() -> bool:
            _check_owner(owner)
            try:
                size = Path(path).stat().st_size
                staged = [] if self._path(digest).exists() else [(digest, Path(path))]
                _sync([p for _, p in staged])
                return self._commit(staged, {digest: size}, now, owner, limit, False) == 1
            finally:
                Path(path).unlink(missing_ok=True)
        return await asyncio.to_thread(run)

    async def get(self, digest: str) -> bytes | None:
        def read() -> bytes | None:
            try:
                return self._path(digest).read_bytes()
            except FileNotFoundError:
                return None
        return await asyncio.to_thread(read)

    async def sizes(self, digests: Iterable[str], owner: str | None = None) -> dict[str, int]:
        wanted = list(digests)

        def run() -> dict[str, int]:
            if owner is not None:
                with self._lock:
                    holds = self._loaded()
                    return {d: holds.size[d] for d in wanted if owner in holds.by_digest.get(d, {})}
            out = {}
            for d in wanted:
                try:
                    out[d] = self._path(d).stat().st_size
                except FileNotFoundError:
                    continue
            return out
        return await asyncio.to_thread(run)

    async def usage(self, owner: str) -> int:
        def run() -> int:
            with self._lock:
                return self._loaded().used.get(owner, 0)
        return await asyncio.to_thread(run)

    async def holders(self, digest: str) -> dict[str, bool]:
        def run() -> dict[str, bool]:
            with self._lock:
                return dict(self._loaded().by_digest.get(digest, {}))
        return await asyncio.to_thread(run)

    async def touch(self, digests: Iterable[str], now: float) -> None:
        wanted = list(digests)

        def run() -> None:
            for d in wanted:
                try:
                    os.utime(self._path(d), (now, now))
                except FileNotFoundError:
                    continue
        await asyncio.to_thread(run)

    async def sweep(self, before: float) -> int:
        def run() -> int:
            gone = 0
            with self._lock:
                holds = self._loaded()
                for p in self.root.glob("??/*"):
                    try:
                        if p.stat().st_mtime >= before or (p.name.startswith(".tmp-") and
                                                           p.stat().st_mtime >= time.time() - 3600):
                            continue
                        p.unlink()
                        gone += 1
                    except FileNotFoundError:
                        continue
                    for key in holds.drop(p.name):
                        (self.root / "refs" / key / p.name).unlink(missing_ok=True)
                        (self.root / "refs" / key / f"{p.name}.bundle").unlink(missing_ok=True)
            return gone
        return await asyncio.to_thread(run)


def _sync(paths: list[Path]) -> None:
    """Make the data of ``paths`` durable: one ``syncfs`` of their filesystem where Linux has it
    and there are several, an fsync of each otherwise."""
    if not paths:
        return
    libc = _libc() if len(paths) > 1 else None
    if libc is not None:
        fd = os.open(paths[0], os.O_RDONLY)
        try:
            if libc.syncfs(fd) == 0:
                return
        finally:
            os.close(fd)
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@functools.cache
def _libc() -> Any:
    if sys.platform != "linux":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc if hasattr(libc, "syncfs") else None
    except OSError:
        return None
