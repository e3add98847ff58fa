"""``--reset-state``: delete what a worker keeps on local disk between runs.

That is the outbox database (``--db-path``) with its DuckDB WAL, the outbox journal directory
beside it, and the worker's cache directory. Alone, unacknowledged results in them are lost, which
is the point: a clean start.

``--recover --reset-state`` (the worker guide's manual recovery) reports first and deletes after
(:func:`recover_then_reset`): a session with no task slots sends what ``--recover`` sends (the
unacknowledged results, and the tasks a crash interrupted as retryable errors), waits until the
coordinator has acknowledged every one of them, says goodbye, and only then resets. Whatever could
not be delivered keeps the local state as it was.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
from pathlib import Path

from ..config import WorkerConfig
from ..errors import ConfigError
from .agent import WorkerAgent
from .auth import Credentials
from .factory import cache_dir_for, open_storage

log = logging.getLogger(__name__)
POLL_S = 0.05


class RecoveryIncomplete(Exception):
    """``--recover --reset-state``: the coordinator did not acknowledge every reported result in
    time; nothing was deleted."""


async def recover_then_reset(config: WorkerConfig) -> list[Path]:
    """Report what ``--recover`` reports, then :func:`reset_local_state`; returns what was deleted.

    The reporting session registers with no task slots (the coordinator places nothing on it) and
    no executors. It waits up to ``drain_timeout_s`` after registering for the acknowledgements;
    raises :class:`RecoveryIncomplete` when some are missing, and lets the agent's own errors
    (``RetriesExhausted``: coordinator unreachable; ``SessionRejected``) through. In every failure
    the local state is kept."""
    local_state_paths(config)  # needs --db-path
    _check_not_in_use(config.db_path)
    reporter = dataclasses.replace(config, recover=True, reset_state=False, max_concurrent_tasks=0)
    outbox, _ = await open_storage(reporter)
    agent = WorkerAgent(reporter, {}, outbox, {}, [], Credentials(
        config.coordinator_url, api_key=config.api_key, token=config.token, token_file=config.token_file,
        ca_file=config.ca_file, others=config.urls))
    run = asyncio.create_task(agent.run(), name="worker-recovery-report")
    try:
        left = await _reported(agent, run, config.drain_timeout_s)
    finally:
        if not run.done():
            await agent.drain("recovery reported", 0)
        await run  # re-raises the agent's failure
    if left < 0:
        raise RecoveryIncomplete("--recover --reset-state: the worker stopped before it could report; local state "
                                 "kept, nothing deleted")
    if left:
        raise RecoveryIncomplete(f"--recover --reset-state: {left} result(s) not acknowledged by the coordinator "
                                 f"within {config.drain_timeout_s:g}s (--drain-timeout); local state kept, nothing deleted")
    log.warning("--recover --reset-state: every recovered result is acknowledged by the coordinator; resetting")
    return await asyncio.to_thread(reset_local_state, config)


async def _reported(agent: WorkerAgent, run: asyncio.Task[None], timeout_s: float) -> int:
    """Wait for registration, then for every result in the outbox to be acknowledged, at most
    ``timeout_s`` after registering; returns how many are still unacknowledged (0: all)."""
    registered = asyncio.create_task(agent.registered.wait())
    await asyncio.wait({registered, run}, return_when=asyncio.FIRST_COMPLETED)
    if not registered.done():
        registered.cancel()
        return -1  # the agent stopped before registering: ``await run`` raises why
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (left := len(await agent.result_store.unacked())) and asyncio.get_running_loop().time() < deadline:
        if run.done():
            return left
        await asyncio.sleep(POLL_S)
    return left


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

    from ..durable.duckfile import lock_holder

    try:
        duckdb.connect(str(db)).close()
    except duckdb.Error as exc:
        locked = lock_holder(exc)
        if locked is None:
            return  # not a DuckDB file we can open: deleting it is what was asked
        raise ConfigError(f"--reset-state: --db-path {db}: {locked}; stop that worker first") from exc
