"""``dt-coordinator`` / ``run_coordinator.py``: start the coordinator.

Flags and their DT_* variables (flags win) are the rows of ``cli/coordinator_options.py``.

With a PostgreSQL ``--db-path`` the coordinator is a member of an HA group (coordinator/group.py):
a standby until it holds the leader lease. A leader that loses the lease stops acting at once and
starts a new standby term in the same process, on the same port (it logs "ending this term"); the
exit status stays as below.

Exit status: 0 after SIGINT/SIGTERM; 2 when it cannot start (a bad flag or variable, the port in
use, the database locked by another coordinator or not openable), with one line on stderr and
nothing created; 3 (``EXIT_FATAL``) when it stopped itself after a fatal failure while running (a
write the store could not make, a background task that died; see ``coordinator/supervisor.py``).

The process runs with umask 077: every file it creates (the database, its WAL, the journal, the
admin key, the token-signing secret, the port file) is readable by its own user only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import errno
import logging
import os
import socket
import ssl
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import asyncpg

from ..config import CoordinatorConfig, environ
from ..coordinator.admission import connection_limits
from ..coordinator.fast_http import FastSite
from ..coordinator.runtime import RUNTIME
from ..coordinator.server import create_app, make_runner, nofile
from ..coordinator.supervisor import EXIT_FATAL, demoted
from ..errors import ConfigError, StoreError
from ..process import aio
from ..security import secret_file, tls
from .common import add_log_flag, setup_logging, tune_gc, wait_for_signal
from .coordinator_options import COORDINATOR_SETTINGS
from .options import add_settings, resolve

log = logging.getLogger(__name__)
TERM_RETRY_S = 1.0  # a group member whose next term cannot start (database away) retries this often


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dt-coordinator", description="Run the distributed_testing coordinator.",
                                epilog=f"{aio.HELP} Exit status: 0 stopped by SIGTERM/SIGINT; 2 could not start "
                                       f"(one line on stderr); {EXIT_FATAL} stopped after a fatal failure such as "
                                       "a failed write (see docs/operations.md).")
    add_settings(p, COORDINATOR_SETTINGS)
    add_log_flag(p)
    return p


def config_from_args(ns: argparse.Namespace, env: Mapping[str, str]) -> CoordinatorConfig:
    """The table's values (flag > variable > default, each checked once); the connection caps
    are checked against RLIMIT_NOFILE, the rules between settings by CoordinatorConfig."""
    values = resolve(COORDINATOR_SETTINGS, ns, env)
    connection_limits(values["max_connections"], values["max_worker_sessions"], nofile())
    return CoordinatorConfig(**values)


async def serve(config: CoordinatorConfig, port_file: Path | None, ssl_context: ssl.SSLContext | None = None) -> int:
    """Run until SIGINT/SIGTERM (0) or a fatal failure (``EXIT_FATAL``); write the bound port to
    ``port_file`` once listening. Raises ``ConfigError`` or ``StoreError`` if it cannot start.

    A group member that loses the leadership ends its term and starts a new standby term at once,
    in this process and on the same port (clients are refused for those moments and try another
    member), with nothing carried over: the new term loads what it needs from the database."""
    check_listen(config.host, config.port)  # before the store and the admin key file are created
    for path, source in state_files(config):
        check_writable(path, source)
    code, port = await _term(config, port_file, ssl_context)
    while code is None:
        log.warning("lost the leadership: rejoining the group as a standby on port %d", port)
        config = dataclasses.replace(config, port=port)  # a restarted term keeps the advertised port
        try:
            code, port = await _term(config, port_file, ssl_context)
        except (ConfigError, StoreError) as exc:  # the database is away (restarting?): try again
            log.warning("cannot start the next term: %s; retrying in %gs", exc, TERM_RETRY_S)
            if await _signalled_within(TERM_RETRY_S):
                return 0
    return code


async def _signalled_within(seconds: float) -> bool:
    """Wait ``seconds``; True if SIGINT/SIGTERM came first."""
    pause: asyncio.Future[None] = asyncio.ensure_future(asyncio.sleep(seconds))
    try:
        await _until_signal_or(pause)
        return not pause.done()
    finally:
        pause.cancel()


async def _term(config: CoordinatorConfig, port_file: Path | None,
                ssl_context: ssl.SSLContext | None) -> tuple[int | None, int]:
    """One term of the server: (exit status, port), or (None, port) when it lost the leadership."""
    runner = make_runner(create_app(config))
    port = config.port
    try:
        await runner.setup()
        site = FastSite(runner, config.host, config.port, reuse_address=True, ssl_context=ssl_context)
        try:
            await site.start()
        except OSError as exc:  # taken since check_listen
            raise ConfigError(_listen_error(config.host, config.port, exc)) from exc
        port = int(runner.addresses[0][1])
        log.info("coordinator listening on %s://%s:%d", config.scheme, config.host, port)
        rt = runner.app[RUNTIME]
        rt.bind(config.scheme, config.host, port)
        supervisor = rt.supervisor
        if rt.group is not None:  # a group member announces its port once it leads or knows it stands by
            settled: asyncio.Future[Any] = asyncio.ensure_future(rt.group.settled.wait())
            await asyncio.wait([settled, supervisor.failed], return_when=asyncio.FIRST_COMPLETED)
            settled.cancel()
        if port_file is not None:
            tmp = port_file.with_suffix(".tmp")
            tmp.write_text(f"{port}\n")
            tmp.replace(port_file)
        await _until_signal_or(supervisor.failed)
    finally:
        await runner.cleanup()
    failure = supervisor.failure
    if demoted(failure):
        return None, port
    if failure is not None:
        log.error("coordinator stopped after a fatal failure (exit status %d): %s", EXIT_FATAL, failure)
        return EXIT_FATAL, port
    return 0, port


async def _until_signal_or(failed: asyncio.Future[Any]) -> None:
    signal = asyncio.ensure_future(wait_for_signal())
    try:
        await asyncio.wait([signal, failed], return_when=asyncio.FIRST_COMPLETED)
    finally:
        signal.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await signal


def check_listen(host: str, port: int) -> None:
    """``ConfigError`` if ``host:port`` cannot be bound (in use, address not local) for every
    address ``host`` resolves to, binding the way the server will (``SO_REUSEADDR``). Port 0 is
    checked too: any port will do, but ``host`` must still resolve to an address of this machine."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(f"--host {host!r}: cannot resolve it: {exc.strerror}") from exc
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind(addr)
            except OSError as exc:
                raise ConfigError(_listen_error(host, port, exc)) from exc


def state_files(config: CoordinatorConfig) -> list[tuple[Path, str]]:
    """The files a start may create, each with the flag that names it: the DuckDB file (unless
    the store is in memory) and the admin key file."""
    files = [(config.admin_key_path, "--admin-key-file")]
    if config.postgres:
        return files
    scheme, sep, rest = config.db_path.partition("://")
    if not sep or scheme.lower() == "duckdb":
        files.insert(0, (Path(rest if sep else config.db_path), "--db-path"))
    return files


def check_writable(path: Path, source: str) -> None:
    """``ConfigError`` naming ``source`` unless the directory that holds (or will hold) ``path``
    can be written: its nearest existing ancestor must be a directory this process may write in.
    Creates nothing."""
    where = path.absolute().parent
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir():
        raise ConfigError(f"{source} {path}: {where} is not a directory")
    if not os.access(where, os.W_OK | os.X_OK):
        raise ConfigError(f"{source} {path}: cannot write in {where} (read-only or no permission)")


def _listen_error(host: str, port: int, exc: OSError) -> str:
    hint = " (is another coordinator running? choose another --port)" if exc.errno == errno.EADDRINUSE else ""
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}{hint}"


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    setup_logging(ns.log_level)
    try:
        config = config_from_args(ns, environ())
        if ns.rotate_jwt_secret:
            os.umask(0o077)
            return _rotate(config)
        ssl_context = tls.server_context(config.tls_cert, config.tls_key) if config.tls_cert and config.tls_key else None
        loop = aio.loop_choice()
        os.umask(0o077)  # state files and directories: this user only (see the module docstring)
        tune_gc()
        return aio.run(serve(config, ns.port_file, ssl_context), loop)
    except (ConfigError, StoreError) as exc:  # serve raises these only while starting
        print(f"dt-coordinator: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2


def _rotate(config: CoordinatorConfig) -> int:
    path = config.jwt_secret_path
    if path is None and config.postgres:
        from ..coordinator.group import rotate_secret
        from ..security.tokens import generate_secret

        try:
            asyncio.run(rotate_secret(config.db_path, generate_secret()))
        except (OSError, asyncpg.PostgresError) as exc:
            raise ConfigError(f"--rotate-jwt-secret: cannot reach the database {config.db_path!r}: {exc}") from exc
        print("rotated the group's token-signing secret in the database; every member uses it within a second",
              file=sys.stderr)
        return 0
    if path is None:
        raise ConfigError("--rotate-jwt-secret: a memory:// store keeps its secret in memory only; "
                          "give --jwt-secret-file to rotate a secret file")
    secret_file.rotate(path)
    print(f"rotated the token-signing secret in {path}; restart the coordinator to use it", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
