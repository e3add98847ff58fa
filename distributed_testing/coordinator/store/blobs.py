"""Where the coordinator keeps bundle blobs (file contents and manifests), by digest.

One protocol, three homes: :class:`DirBlobs` (a directory beside a DuckDB file, ``<db>.blobs/``),
:class:`MemoryBlobs` (``memory://`` and tests) and :class:`PgBlobs` (the table ``dt_blobs`` of a
PostgreSQL store, so every member of an HA group sees every blob). A blob is stored once however
many bundles hold it. Each blob carries ``used_at`` (unix seconds): set when it is stored and
whenever a manifest or task that refers to it arrives (``touch``); ``sweep(before)`` deletes the
blobs not used since ``before`` (``--bundle-retention``). Storing the same digest twice at once
is safe everywhere: a directory store writes to a temporary file and renames it (the bytes are the
same whichever wins), PostgreSQL upserts. Callers check the digest before ``put``.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol


class BlobStore(Protocol):
    async def missing(self, digests: Iterable[str]) -> list[str]:
        """The digests not stored, in the order given."""

    async def put(self, digest: str, data: bytes, now: float) -> bool:
        """Store ``data`` under ``digest``; False when it was already there (then only touched)."""

    async def put_many(self, blobs: list[tuple[str, bytes]], now: float) -> int:
        """``put`` each (digest, data) pair, durably as one batch; how many were new."""

    async def get(self, digest: str) -> bytes | None: ...

    async def touch(self, digests: Iterable[str], now: float) -> None: ...

    async def sweep(self, before: float) -> int:
        """Delete blobs last used before ``before``; how many were deleted."""


class MemoryBlobs:
    def __init__(self) -> None:
        self.blobs: dict[str, tuple[bytes, float]] = {}

    async def missing(self, digests: Iterable[str]) -> list[str]:
        return [d for d in digests if d not in self.blobs]

    async def put(self, digest: str, data: bytes, now: float) -> bool:
        new = digest not in self.blobs
        self.blobs[digest] = (data, now)
        return new

    async def put_many(self, blobs: list[tuple[str, bytes]], now: float) -> int:
        return sum([await self.put(d, data, now) for d, data in blobs])

    async def get(self, digest: str) -> bytes | None:
        found = self.blobs.get(digest)
        return None if found is None else found[0]

    async def touch(self, digests: Iterable[str], now: float) -> None:
        for d in digests:
            if d in self.blobs:
                self.blobs[d] = (self.blobs[d][0], now)

    async def sweep(self, before: float) -> int:
        old = [d for d, (_, used) in self.blobs.items() if used < before]
        for d in old:
            del self.blobs[d]
        return len(old)


class DirBlobs:
    """``<root>/<d[:2]>/<d>``; ``used_at`` is the file's mtime. Blocking work runs in a thread."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, digest: str) -> Path:
        return self.root / digest[:2] / digest

    async def missing(self, digests: Iterable[str]) -> list[str]:
        wanted = list(digests)
        return await asyncio.to_thread(lambda: [d for d in wanted if not self._path(d).exists()])

    async def put(self, digest: str, data: bytes, now: float) -> bool:
        return await asyncio.to_thread(self._put, digest, data, now)

    def _put(self, digest: str, data: bytes, now: float) -> bool:
        return self._put_many([(digest, data)], now) == 1

    async def put_many(self, blobs: list[tuple[str, bytes]], now: float) -> int:
        return await asyncio.to_thread(self._put_many, blobs, now)

    def _put_many(self, blobs: list[tuple[str, bytes]], now: float) -> int:
        """Write every new blob to a temporary file, make them all durable with one ``syncfs``
        (an fsync per file costs ~7 ms each on a loaded disk: 70 s for 10,000 small files), then
        rename each into place, so a name never points at bytes a crash could lose."""
        staged: list[tuple[str, Path]] = []
        seen: set[str] = set()
        try:
            for digest, data in blobs:
                dest = self._path(digest)
                if dest.exists():
                    os.utime(dest, (now, now))
                    continue
                if digest in seen:
                    continue
                seen.add(digest)
                dest.parent.mkdir(parents=True, exist_ok=True)
                fd, name = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-")
                staged.append((digest, Path(name)))
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.utime(name, (now, now))
            _sync([p for _, p in staged])
            for digest, path in staged:
                os.replace(path, self._path(digest))  # a concurrent upload of the same digest wrote the same bytes
        except BaseException:
            for _, path in staged:
                path.unlink(missing_ok=True)
            raise
        return len(staged)

    async def get(self, digest: str) -> bytes | None:
        def read() -> bytes | None:
            try:
                return self._path(digest).read_bytes()
            except FileNotFoundError:
                return None
        return await asyncio.to_thread(read)

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
            for p in self.root.glob("??/*"):
                try:
                    if p.stat().st_mtime < before and (not p.name.startswith(".tmp-") or
                                                       p.stat().st_mtime < time.time() - 3600):
                        p.unlink()
                        gone += 1
                except FileNotFoundError:
                    continue
            return gone
        return await asyncio.to_thread(run)


BLOBS_DDL = "CREATE TABLE IF NOT EXISTS dt_blobs (digest text PRIMARY KEY, data bytea NOT NULL, used_at double precision NOT NULL)"


class PgBlobs:
    """The ``dt_blobs`` table, through the store's read pool (blob writes are not fenced: a blob
    is named by its content, so any member may store it)."""

    def __init__(self, store: Any) -> None:
        self._store = store  # a PostgresStore (typed loosely: importing it would load asyncpg)

    async def missing(self, digests: Iterable[str]) -> list[str]:
        wanted = list(digests)
        async with self._store.pool.acquire() as con:
            have = {r[0] for r in await con.fetch("SELECT digest FROM dt_blobs WHERE digest = ANY($1::text[])", wanted)}
        return [d for d in wanted if d not in have]

    async def put(self, digest: str, data: bytes, now: float) -> bool:
        async with self._store.pool.acquire() as con:
            inserted = await con.fetchval(
                "INSERT INTO dt_blobs (digest, data, used_at) VALUES ($1, $2, $3) ON CONFLICT (digest) "
                "DO UPDATE SET used_at = excluded.used_at RETURNING (xmax = 0)", digest, data, now)
        return bool(inserted)

    async def put_many(self, blobs: list[tuple[str, bytes]], now: float) -> int:
        async with self._store.pool.acquire() as con:
            rows = await con.fetch(
                "INSERT INTO dt_blobs (digest, data, used_at) SELECT d, b, $3 FROM unnest($1::text[], $2::bytea[]) "
                "AS t(d, b) ON CONFLICT (digest) DO UPDATE SET used_at = excluded.used_at RETURNING (xmax = 0)",
                [d for d, _ in blobs], [b for _, b in blobs], now)
        return sum(1 for r in rows if r[0])

    async def get(self, digest: str) -> bytes | None:
        async with self._store.pool.acquire() as con:
            data = await con.fetchval("SELECT data FROM dt_blobs WHERE digest = $1", digest)
        return None if data is None else bytes(data)

    async def touch(self, digests: Iterable[str], now: float) -> None:
        async with self._store.pool.acquire() as con:
            await con.execute("UPDATE dt_blobs SET used_at = $2 WHERE digest = ANY($1::text[]) AND used_at < $2",
                              list(digests), now)

    async def sweep(self, before: float) -> int:
        async with self._store.pool.acquire() as con:
            status = await con.execute("DELETE FROM dt_blobs WHERE used_at < $1", before)
        return int(status.split()[-1])


def _sync(paths: list[Path]) -> None:
    """Make the data of ``paths`` durable: one ``syncfs`` of their filesystem where Linux has it,
    an fsync of each otherwise."""
    if not paths:
        return
    libc = _libc()
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


def blobs_for(store: Any) -> BlobStore:
    """The blob home that goes with ``store`` (see the module docstring)."""
    kind = type(store).__name__
    if kind == "PostgresStore":
        return PgBlobs(store)
    if kind == "DuckDBStore":
        return DirBlobs(store.path.with_name(store.path.name + ".blobs"))
    return MemoryBlobs()
