"""``--reset-state``: delete what a worker keeps on local disk between runs.

That is the outbox database (``--db-path``) with its DuckDB WAL, the outbox journal directory
beside it, and the worker's cache directory. Unacknowledged results in them are lost, which is
the point: a clean start.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from ..config import WorkerConfig
from ..errors import ConfigError
from .factory import cache_dir_for

log = logging.getLogger(__name__)


def local_state_paths(config: WorkerConfig) -> list[Path]:
    if config.db_path is None:
        raise ConfigError("--reset-state: needs --db-path (without it the worker keeps no local state)")
    db = config.db_path
    return [db, db.with_name(db.name + ".wal"), db.parent / f"{db.name}.journal", cache_dir_for(config)]


def reset_local_state(config: WorkerConfig) -> list[Path]:
    """Delete the worker's local state; returns what existed and was deleted (blocking I/O).
    Refuses (``ConfigError``) while another process holds the database: it would delete a
    running worker's state from under it."""
    _check_not_in_use(config.db_path)
    deleted = []
    for p in local_state_paths(config):
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
        else:
            continue
        deleted.append(p)
    log.warning("--reset-state: deleted %s", ", ".join(map(str, deleted)) if deleted else "nothing (no local state found)")
    return deleted


def _check_not_in_use(db: Path | None) -> None:
    if db is None or not db.exists():
        return
    import duckdb

    from ..duckfile import lock_holder

    try:
        duckdb.connect(str(db)).close()
    except duckdb.Error as exc:
        locked = lock_holder(exc)
        if locked is None:
            return  # not a DuckDB file we can open: deleting it is what was asked
        raise ConfigError(f"--reset-state: --db-path {db}: {locked}; stop that worker first") from exc
