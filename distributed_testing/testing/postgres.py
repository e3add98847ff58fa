"""PostgreSQL for tests and scripts: throwaway databases and schemas on the server every test
machine runs (re-exported by :mod:`distributed_testing.testing`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import secrets
import urllib.parse
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

# The server every test machine runs (trust authentication for user postgres); tests make their
# own databases on it and drop them, never touching any other.
PG_SERVER = "postgresql://postgres@127.0.0.1:5432"


def _pg_split(url: str) -> tuple[str, str]:
    """``(server URL without a database, database name)`` of a ``postgresql://`` URL."""
    parts = urllib.parse.urlsplit(url)
    name = parts.path.strip("/")
    if not name:
        raise ValueError(f"{url!r} names no database")
    return urllib.parse.urlunsplit(parts._replace(path="", query="")), name


async def create_pg_database(server: str = PG_SERVER, prefix: str = "dt_test") -> str:
    """Create an empty database ``<prefix>_<pid>_<random>`` on ``server``; returns its URL."""
    import asyncpg

    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
    con = await asyncpg.connect(f"{server}/postgres")
    try:
        await con.execute(f'CREATE DATABASE "{name}"')
    finally:
        await con.close()
    return f"{server}/{name}"


async def drop_pg_database(url: str) -> None:
    """Drop the database of ``url``, ending its sessions first (no error if it is gone)."""
    import asyncpg

    server, name = _pg_split(url)
    con = await asyncpg.connect(f"{server}/postgres")
    try:
        await con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await con.close()


@contextlib.asynccontextmanager
async def pg_database(server: str = PG_SERVER, prefix: str = "dt_test") -> AsyncIterator[str]:
    """A new empty database for the block (its URL), dropped afterwards."""
    url = await create_pg_database(server, prefix)
    try:
        yield url
    finally:
        await drop_pg_database(url)


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a new event loop in a thread of its own, so this works
    whether or not the caller runs an event loop (which it blocks meanwhile)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


@contextlib.contextmanager
def pg_database_sync(server: str = PG_SERVER, prefix: str = "dt_test") -> Iterator[str]:
    """Blocking :func:`pg_database`, for session fixtures and scripts."""
    url = run_sync(create_pg_database(server, prefix))
    try:
        yield url
    finally:
        run_sync(drop_pg_database(url))


async def pg_schema_url(database_url: str, schema: str) -> str:
    """Create ``schema`` in the database (empty) and return a URL whose sessions use only it
    (``?search_path=``): a fresh namespace for one test, much cheaper than a database."""
    import asyncpg

    if not schema.isidentifier():
        raise ValueError(f"invalid schema name {schema!r}")
    con = await asyncpg.connect(database_url)
    try:
        await con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE; CREATE SCHEMA "{schema}"')
    finally:
        await con.close()
    return f"{database_url}?search_path={schema}"
