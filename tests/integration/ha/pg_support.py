"""A private PostgreSQL database per test module on the shared server (127.0.0.1:5432, trust
auth, user postgres): created before, dropped after (connections to it are ended first)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator

import asyncpg

ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


async def _admin(sql: str) -> None:
    conn = await asyncpg.connect(ADMIN_DSN)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def private_database(prefix: str = "dt_ha") -> Iterator[str]:
    """Yield the DSN of a fresh database; drop it afterwards (a generator for a fixture)."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    try:
        yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    finally:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
