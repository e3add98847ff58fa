"""Coordinator persistence: the ``Store`` protocol (``base``) and its backends. The records they
keep are ``coordinator/core/rows.py``.

``open_store`` picks the backend from a URL or path. ``DuckDBStore`` and ``PostgresStore`` are
imported only when asked for, so importing the record types loads neither DuckDB and Arrow nor
asyncpg.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ...errors import StoreError
from .base import SCHEMA_VERSION, ResultQuery, Store
from .blobs import BlobStore, DirBlobs, MemoryBlobs
from .memory import MemoryStore

__all__ = ["SCHEMA_VERSION", "MemoryStore", "ResultQuery", "Store", "blobs_for", "open_store"]


def open_store(url_or_path: str | Path) -> Store:
    """The store for ``url_or_path`` (not yet opened: call ``await store.open()``).

    - ``memory://`` (anything after it is ignored): a new :class:`MemoryStore`.
    - ``duckdb:///abs/path.duckdb``, ``duckdb://rel/path.duckdb`` or a plain filesystem path:
      a :class:`~.duckdb.DuckDBStore` on that file (its journal is ``<file>.journal/``).
    - ``postgresql://user[:password]@host[:port]/database`` (or ``postgres://``; no host: the
      local socket): a :class:`~.postgres.PostgresStore` on that database (its schema is created
      on open). The database must be named.

    Any other ``scheme://`` raises ``StoreError`` naming the schemes understood.
    """
    if isinstance(url_or_path, Path):
        return _duckdb_store(url_or_path)
    text = url_or_path.strip()
    if not text:
        raise StoreError("empty store URL or path")
    scheme, sep, rest = text.partition("://")
    if not sep:
        return _duckdb_store(Path(text))
    scheme = scheme.lower()
    if scheme == "memory":
        return MemoryStore()
    if scheme == "duckdb":
        if not rest:
            raise StoreError(f"store URL {text!r} names no file")
        return _duckdb_store(Path(rest))
    if scheme in ("postgresql", "postgres"):
        return _postgres_store(text)
    raise StoreError(f"unknown store URL scheme {scheme!r} in {text!r}: use memory://, duckdb:///path, "
                     "postgresql://user@host:port/db or a path")


def _postgres_store(url: str) -> Store:
    from .postgres import PostgresStore, redact

    parts = urlsplit(url)
    if not parts.path.strip("/") and "dbname=" not in parts.query:
        raise StoreError(f"store URL {redact(url)!r} names no database: use postgresql://user@host:port/db")
    return PostgresStore(url)


def _duckdb_store(path: Path) -> Store:
    from .duckdb import DuckDBStore

    return DuckDBStore(path)


def blobs_for(store: Any) -> BlobStore:
    """The home of bundle blobs that goes with ``store`` (``blobs.py``): a directory beside a
    DuckDB file, PostgreSQL's tables, or memory."""
    kind = type(store).__name__
    if kind == "PostgresStore":
        from .pgblobs import PgBlobs

        return PgBlobs(store)
    if kind == "DuckDBStore":
        return DirBlobs(store.path.with_name(store.path.name + ".blobs"))
    return MemoryBlobs()
