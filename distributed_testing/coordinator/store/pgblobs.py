"""Bundle blobs in PostgreSQL (``blobs.BlobStore``): every member of an HA group sees every blob.

``dt_blobs`` holds the bytes by digest, ``dt_blob_refs`` which keys hold each (a row per key and
digest; ``bundle``: stored through the manifest route). Deleting a blob deletes its holds
(``ON DELETE CASCADE``). A put by a key takes a transaction-scoped advisory lock on that key, so
its quota check and its insert are one step across the group.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .blobs import OverQuota, _check_owner, take_file

BLOBS_DDL = ("CREATE TABLE IF NOT EXISTS dt_blobs (digest text PRIMARY KEY, data bytea NOT NULL, "
             "used_at double precision NOT NULL)")
BLOB_REFS_DDL = ("CREATE TABLE IF NOT EXISTS dt_blob_refs (key_id text NOT NULL, digest text NOT NULL "
                 "REFERENCES dt_blobs (digest) ON DELETE CASCADE, bundle boolean NOT NULL DEFAULT false, "
                 "PRIMARY KEY (key_id, digest))")
BLOB_REFS_INDEX = "CREATE INDEX IF NOT EXISTS dt_blob_refs_digest ON dt_blob_refs (digest)"
LOCK_CLASS = 4040  # the first half of the two-key advisory lock a put by a key takes (the key's hash the second)
_USAGE = ("SELECT coalesce(sum(octet_length(b.data)), 0) FROM dt_blob_refs r JOIN dt_blobs b USING (digest) "
          "WHERE r.key_id = $1")


class PgBlobs:
    """The ``dt_blobs`` and ``dt_blob_refs`` tables, through the store's read pool (blob writes
    are not fenced: a blob is named by its content, so any member may store it)."""

    def __init__(self, store: Any) -> None:
        self._store = store  # a PostgresStore (typed loosely: importing it would load asyncpg)

    async def missing(self, digests: Iterable[str], owner: str | None = None) -> list[str]:
        wanted = list(digests)
        async with self._store.pool.acquire() as con:
            if owner is None:
                rows = await con.fetch("SELECT digest FROM dt_blobs WHERE digest = ANY($1::text[])", wanted)
            else:
                rows = await con.fetch("SELECT digest FROM dt_blob_refs WHERE key_id = $1 AND "
                                       "digest = ANY($2::text[])", owner, wanted)
        have = {r[0] for r in rows}
        return [d for d in wanted if d not in have]

    async def put(self, digest: str, data: bytes, now: float, owner: str | None = None, *, limit: int = 0,
                  bundle: bool = False) -> bool:
        return await self._put([(digest, data)], now, owner, limit, bundle) == 1

    async def put_many(self, blobs: list[tuple[str, bytes]], now: float, owner: str | None = None, *,
                       limit: int = 0) -> int:
        return await self._put(blobs, now, owner, limit, False)

    async def _put(self, blobs: list[tuple[str, bytes]], now: float, owner: str | None, limit: int,
                   bundle: bool) -> int:
        _check_owner(owner)
        unique = dict(blobs)
        async with self._store.pool.acquire() as con, con.transaction():
            if owner is not None:
                await con.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", LOCK_CLASS, owner)
            if owner is not None and limit > 0:
                held = {r[0] for r in await con.fetch("SELECT digest FROM dt_blob_refs WHERE key_id = $1 AND "
                                                      "digest = ANY($2::text[])", owner, list(unique))}
                adding = sum(len(b) for d, b in unique.items() if d not in held)
                used = int(await con.fetchval(_USAGE, owner))
                if adding and used + adding > limit:
                    raise OverQuota(used, adding, limit)
            rows = await con.fetch(
                "INSERT INTO dt_blobs (digest, data, used_at) SELECT d, b, $3 FROM unnest($1::text[], $2::bytea[]) "
                "AS t(d, b) ON CONFLICT (digest) DO UPDATE SET used_at = excluded.used_at RETURNING (xmax = 0)",
                list(unique), list(unique.values()), now)
            if owner is not None:
                await con.execute(
                    "INSERT INTO dt_blob_refs (key_id, digest, bundle) SELECT $1, d, $3 FROM unnest($2::text[]) "
                    "AS t(d) ON CONFLICT (key_id, digest) DO UPDATE SET bundle = dt_blob_refs.bundle OR "
                    "excluded.bundle", owner, list(unique), bundle)
        return sum(1 for r in rows if r[0])

    def staging(self, digest: str) -> Path | None:
        return None

    async def put_file(self, digest: str, path: Path, now: float, owner: str | None = None, *,
                       limit: int = 0) -> bool:
        """Reads the file into memory: a PostgreSQL store holds one blob of up to
        ``--max-bundle-file-mb`` in memory per upload in progress."""
        return await self.put(digest, await take_file(path), now, owner, limit=limit)

    async def get(self, digest: str) -> bytes | None:
        async with self._store.pool.acquire() as con:
            data = await con.fetchval("SELECT data FROM dt_blobs WHERE digest = $1", digest)
        return None if data is None else bytes(data)

    async def sizes(self, digests: Iterable[str], owner: str | None = None) -> dict[str, int]:
        wanted = list(digests)
        async with self._store.pool.acquire() as con:
            if owner is None:
                rows = await con.fetch("SELECT digest, octet_length(data) FROM dt_blobs WHERE "
                                       "digest = ANY($1::text[])", wanted)
            else:
                rows = await con.fetch("SELECT b.digest, octet_length(b.data) FROM dt_blob_refs r JOIN dt_blobs b "
                                       "USING (digest) WHERE r.key_id = $1 AND r.digest = ANY($2::text[])",
                                       owner, wanted)
        return {r[0]: int(r[1]) for r in rows}

    async def usage(self, owner: str) -> int:
        async with self._store.pool.acquire() as con:
            return int(await con.fetchval(_USAGE, owner))

    async def holders(self, digest: str) -> dict[str, bool]:
        async with self._store.pool.acquire() as con:
            rows = await con.fetch("SELECT key_id, bundle FROM dt_blob_refs WHERE digest = $1", digest)
        return {r[0]: bool(r[1]) for r in rows}

    async def touch(self, digests: Iterable[str], now: float) -> None:
        async with self._store.pool.acquire() as con:
            await con.execute("UPDATE dt_blobs SET used_at = $2 WHERE digest = ANY($1::text[]) AND used_at < $2",
                              list(digests), now)

    async def sweep(self, before: float) -> int:
        async with self._store.pool.acquire() as con:
            status = await con.execute("DELETE FROM dt_blobs WHERE used_at < $1", before)
        return int(status.split()[-1])
