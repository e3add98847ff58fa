"""The PostgreSQL store's schema migrations: upgrades from schema version N to N + 1 (coroutine
functions), run by ``PostgresStore.open`` with the version bump in the schema transaction, under
its advisory lock. Version 2 is the first this backend has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import asyncpg

from ..core.rows import RunRow
from .pgblobs import BLOB_REFS_DDL, BLOB_REFS_INDEX, BLOBS_DDL
from .pgsql import RUN_INDEXES, TABLES

Migration = Callable[[asyncpg.Connection], Any]


async def _keys_allow_code_and_blobs(con: asyncpg.Connection) -> None:
    """2 -> 3: ``api_keys.allow_code`` (existing keys may not ship code) and the blob table."""
    await con.execute("ALTER TABLE api_keys ADD COLUMN allow_code json NOT NULL DEFAULT 'false'")
    await con.execute(BLOBS_DDL)


async def _blob_holds(con: asyncpg.Connection) -> None:
    """3 -> 4: ``dt_blob_refs``, which keys hold which blobs (existing blobs are held by none: a
    key that wants one uploads it again, store/pgblobs.py)."""
    await con.execute(BLOB_REFS_DDL)
    await con.execute(BLOB_REFS_INDEX)


async def _runs(con: asyncpg.Connection) -> None:
    """4 -> 5: runs (``runs``, ``tasks.run_id``; existing tasks belong to none)."""
    await con.execute("ALTER TABLE tasks ADD COLUMN IF NOT EXISTS run_id text")
    await con.execute(TABLES[RunRow].ddl().replace("CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1))
    for ddl in RUN_INDEXES:
        await con.execute(ddl)


MIGRATIONS: dict[int, Migration] = {2: _keys_allow_code_and_blobs, 3: _blob_holds, 4: _runs}
