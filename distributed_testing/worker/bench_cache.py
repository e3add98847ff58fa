"""The worker's benchmark result cache (tasks with ``"cache": true``).

A cached result is found by :func:`cache_key`: a SHA-256 over the canonical JSON of the task's
benchmark config as the worker's child receives it (the worker's ``--optimize-for`` and
``--cuda-streams`` defaults applied, the free-text ``name`` left out), the worker settings that
change a measurement without appearing in the config (``--mixed-precision``), and the
environment fingerprint hash (``bench/env.py``) that the benchmark child reports for the task's
backend and device. Equal keys mean the same measurement on the same software, hardware and
thread settings.

:class:`ResultCache` is what the benchmark executor needs; :class:`MemoryResultCache` lives as
long as the worker process, :class:`~.result_store_duckdb.DuckDBResultCache` keeps entries in the ``bench_cache`` table
of the worker's ``--db-path`` file through the outbox's connection (one writer per file). Cache
implementations raise :class:`~distributed_testing.errors.StoreError` when storage fails.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

UNKEYED_CONFIG_KEYS = frozenset({"name"})
"""Config keys echoed in the result that do not change what is measured."""


@dataclass(frozen=True)
class CacheEntry:
    """One stored benchmark result and where it came from."""

    key: str
    fingerprint_hash: str
    config: dict[str, Any]
    result: dict[str, Any]
    task_id: str
    created_at: float


def keyed_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` without the keys that do not change the measurement."""
    return {k: v for k, v in config.items() if k not in UNKEYED_CONFIG_KEYS}


def cache_key(config: dict[str, Any], fingerprint_hash: str, runner: dict[str, Any]) -> str:
    """Hex SHA-256 identifying one measurement: effective config + runner settings + fingerprint."""
    doc = {"config": keyed_config(config), "runner": runner, "fingerprint_hash": fingerprint_hash}
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


class ResultCache(Protocol):
    async def get(self, keys: Sequence[str]) -> dict[str, CacheEntry]:
        """The stored entries among ``keys`` (absent keys are left out)."""

    async def put(self, entries: Sequence[CacheEntry]) -> None:
        """Store ``entries``, replacing older entries with the same key."""


class MemoryResultCache:
    """Entries held in this process; gone when the worker exits."""

    def __init__(self) -> None:
        self._entries: dict[str, CacheEntry] = {}

    async def get(self, keys: Sequence[str]) -> dict[str, CacheEntry]:
        return {k: self._entries[k] for k in keys if k in self._entries}

    async def put(self, entries: Sequence[CacheEntry]) -> None:
        for entry in entries:
            self._entries[entry.key] = entry

    def __len__(self) -> int:
        return len(self._entries)
