"""DuckDB file helpers shared by the coordinator's store and the worker's outbox (both open one
DuckDB file per process and must say who holds it when they cannot)."""

from __future__ import annotations

import re

import duckdb


def lock_holder(exc: BaseException) -> str | None:
    """For DuckDB's "could not set lock" error (another process has the file open): a one-line
    reason naming the holder's PID when DuckDB gives it; None for any other error."""
    text = str(exc)
    if not isinstance(exc, duckdb.IOException) or "Could not set lock" not in text:
        return None
    pid = re.search(r"\(PID (\d+)\)", text)
    return f"it is locked by another process{f' (PID {pid.group(1)})' if pid else ''}"
