"""``dt-coordinator`` / ``run_coordinator.py``: start the coordinator.

Variables (flags win): DT_COORDINATOR_HOST, DT_COORDINATOR_PORT, DT_COORDINATOR_DB, DT_ADMIN_KEY_FILE,
DT_HEADER_TIMEOUT, DT_MAX_CONNECTIONS, DT_MAX_WORKER_SESSIONS, DT_AUTH_FAIL_LIMIT, DT_AUTH_FAIL_WINDOW,
DT_JWT_SECRET_FILE, DT_MAX_SESSION_AGE, DT_TLS_CERT, DT_TLS_KEY, DT_METRICS, DT_METRICS_PORT,
DT_ADVERTISE_URL.

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

from .. import aio
from ..config import METRICS_MODES, CoordinatorConfig, env_pick, environ, normalize_url, positive
from ..coordinator.fast_http import FastSite
from ..coordinator.limits import connection_limits
from ..coordinator.runtime import RUNTIME
from ..coordinator.server import create_app, make_runner, nofile
from ..coordinator.supervisor import EXIT_FATAL, demoted
from ..errors import ConfigError, StoreError
from ..security import secret_file, tls
from .common import add_log_flag, metrics_port, setup_logging, tune_gc, wait_for_signal

log = logging.getLogger(__name__)
TERM_RETRY_S = 1.0  # a group member whose next term cannot start (database away) retries this often


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dt-coordinator", description="Run the distributed_testing coordinator.",
                                epilog=f"{aio.HELP} Exit status: 0 stopped by SIGTERM/SIGINT; 2 could not start "
                                       f"(one line on stderr); {EXIT_FATAL} stopped after a fatal failure such as "
                                       "a failed write (see docs/operations.md).")
    p.add_argument("--host", help="address to bind (default 127.0.0.1; env DT_COORDINATOR_HOST)")
    p.add_argument("--port", type=int, help="port to bind, 0 for any free one (default 8080; env DT_COORDINATOR_PORT)")
    p.add_argument("--db-path", help="DuckDB state file, memory://, or postgresql://user@host:port/db: several "
                                     "coordinators on one PostgreSQL database form an HA group, one leader and hot "
                                     "standbys (default state/coordinator.duckdb; env DT_COORDINATOR_DB)")
    p.add_argument("--advertise-url", metavar="URL",
                   help="the URL workers, clients and the other members reach this coordinator on, as GET "
                        "/api/v1/cluster lists it and standbys redirect to it (default: scheme://host:port as bound; "
                        "the machine's host name when bound to 0.0.0.0 or ::; env DT_ADVERTISE_URL)")
    p.add_argument("--admin-key-file", type=Path,
                   help="where the first start writes the admin key (default: admin.key beside the database; env DT_ADMIN_KEY_FILE)")
    p.add_argument("--jwt-secret-file", type=Path,
                   help="file holding the token-signing secret, created 0600 on the first start (default: jwt.secret "
                        "beside the database; with memory:// the secret lives in memory only; with PostgreSQL it is "
                        "shared in the database, unless this is given: then give every member the same file; env "
                        "DT_JWT_SECRET_FILE)")
    p.add_argument("--rotate-jwt-secret", action="store_true",
                   help="write a new token-signing secret to the secret file and exit; after the coordinator restarts, "
                        "JWTs signed with the old one are refused (API keys keep working). With PostgreSQL and no "
                        "--jwt-secret-file: replace the group's secret in the database; every member uses it within "
                        "a second, no restart")
    p.add_argument("--token-ttl", type=int, default=900, help="JWT lifetime in whole seconds, at least 1 (default 900)")
    p.add_argument("--max-session-age", type=int,
                   help="seconds after a JWT was first obtained with an API key during which it (and its renewals) may "
                        "be renewed; renewed JWTs never outlive it (default 86400; env DT_MAX_SESSION_AGE)")
    p.add_argument("--tls-cert", type=Path,
                   help="PEM certificate chain: serve https and wss (needs --tls-key; env DT_TLS_CERT)")
    p.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert (env DT_TLS_KEY)")
    p.add_argument("--heartbeat-interval", type=float, default=1.0,
                   help="seconds between heartbeats of workers that do not ask for an interval; "
                        "told to each worker at registration (default 1)")
    p.add_argument("--worker-ttl", type=float, default=3.0,
                   help="declare a worker dead after this many seconds without any frame from it, at least 2x "
                        "--heartbeat-interval; a worker asking for a longer interval gets a TTL of as many of its "
                        "intervals (default 3)")
    p.add_argument("--max-heartbeat-interval", type=float, default=60.0,
                   help="the longest heartbeat interval a worker may ask for; a longer one is refused at registration "
                        "(default 60)")
    p.add_argument("--worker-grace", type=float, default=10.0, help="seconds a disconnected worker has to reconnect before its tasks are requeued (default 10)")
    p.add_argument("--worker-retention", metavar="S",
                   help="forget a worker disconnected and not heard from for S seconds: it leaves dt workers and "
                        "its id is free again; the tasks and results it ran stay; 0 keeps every worker (default "
                        "86400, a day; env DT_WORKER_RETENTION)")
    p.add_argument("--batch-max", type=int, default=8, help="benchmark tasks sharing a model sent to one worker as one batch, at most (default 8; 1 disables batching)")
    p.add_argument("--batch-wait", type=float, default=0.2, help="seconds a benchmark task may wait for others to batch with (default 0.2)")
    p.add_argument("--gang-max-wait", type=float, default=60.0,
                   help="seconds a multi-node training task may wait while smaller tasks use the free slots; after "
                        "that its eligible workers take no new work of lower or equal priority until it fits (default 60)")
    p.add_argument("--gang-ports", default="29500-29999", metavar="LOW-HIGH",
                   help="rendezvous ports the coordinator hands to multi-node training tasks, one per running task "
                        "and master address (default 29500-29999)")
    p.add_argument("--strict", action="store_true", default=None,
                   help="refuse (400) a custom task whose handler no connected worker has, instead of letting it "
                        "wait for one (env DT_STRICT=1/0)")
    p.add_argument("--max-bundle-mb", metavar="MB",
                   help="largest bundle (shipped code) a manifest may describe; larger ones get 413 naming the "
                        "largest files (default 1024; env DT_MAX_BUNDLE_MB)")
    p.add_argument("--max-bundle-file-mb", metavar="MB",
                   help="largest single file of a bundle (default 100; env DT_MAX_BUNDLE_FILE_MB)")
    p.add_argument("--bundle-retention", metavar="S",
                   help="seconds a bundle's blobs stay after the last upload or task that used them; unfinished "
                        "tasks keep theirs (default 604800, a week; env DT_BUNDLE_RETENTION)")
    p.add_argument("--header-timeout", metavar="S",
                   help="close a connection that sends no complete request head within S seconds of opening or "
                        "of its last answer (idle keep-alive included) (default 10; env DT_HEADER_TIMEOUT)")
    p.add_argument("--max-connections", metavar="N",
                   help="HTTP connections open at once; more are answered 503 and closed at accept (default: "
                        "half of what RLIMIT_NOFILE leaves after a reserve; env DT_MAX_CONNECTIONS)")
    p.add_argument("--max-worker-sessions", metavar="N",
                   help="registered worker WebSocket sessions at once, counted apart from --max-connections; "
                        "handshakes beyond get 503 (default: the other half; env DT_MAX_WORKER_SESSIONS)")
    p.add_argument("--auth-fail-limit", metavar="N",
                   help="failed authentications from one client address (IPv6: its /64) within --auth-fail-window "
                        "before it gets 429 until they age out; 0 turns this off (default 20; env DT_AUTH_FAIL_LIMIT)")
    p.add_argument("--auth-fail-window", metavar="S",
                   help="the window of --auth-fail-limit in seconds (default 60; env DT_AUTH_FAIL_WINDOW)")
    p.add_argument("--max-queued-per-key", metavar="N",
                   help="tasks one API key may have queued or running at once; a submission past it gets 429 "
                        "with Retry-After; 0 turns this off (default 10000; env DT_MAX_QUEUED_PER_KEY)")
    p.add_argument("--max-payload-mb-per-key", metavar="MIB",
                   help="MiB of task specs (as JSON) one API key may have queued or running at once; a submission "
                        "past it gets 429 with Retry-After; 0 turns this off (default 64; env "
                        "DT_MAX_PAYLOAD_MB_PER_KEY)")
    p.add_argument("--metrics", choices=METRICS_MODES,
                   help="GET /metrics (Prometheus) on the main port: key = needs a credential with metrics:read "
                        "(admin, submitter, viewer), off = not served there (default key; env DT_METRICS)")
    p.add_argument("--metrics-port", metavar="PORT",
                   help="also serve GET /metrics with no credential on this port of --host (plain http; 0 for any "
                        "free one); for a scraper on a trusted network (env DT_METRICS_PORT)")
    p.add_argument("--dashboard", action="store_true",
                   help="also serve the web dashboard under /dashboard (sign in with any key that may read tasks)")
    p.add_argument("--port-file", type=Path, help="write the bound port to this file once listening (for scripts using "
                                                  "--port 0); a group member once it leads or stands by")
    add_log_flag(p)
    return p


def config_from_args(ns: argparse.Namespace, env: Mapping[str, str]) -> CoordinatorConfig:
    port, source = (ns.port, "--port") if ns.port is not None else (_env_port(env), "DT_COORDINATOR_PORT")
    if not 0 <= port <= 65535:
        raise ConfigError(f"{source}: must be 0..65535, got {port}")
    admin = ns.admin_key_file or (Path(env["DT_ADMIN_KEY_FILE"]) if env.get("DT_ADMIN_KEY_FILE") else None)
    advertise, adv_src = env_pick(ns.advertise_url, env, "DT_ADVERTISE_URL")
    return CoordinatorConfig(
        advertise_url=normalize_url(advertise, "--advertise-url" if adv_src == "flag" else adv_src) if advertise else None,
        jwt_secret_file=_path_flag(ns.jwt_secret_file, env, "DT_JWT_SECRET_FILE"),
        max_session_age_s=float(_int_flag(ns.max_session_age, env, "DT_MAX_SESSION_AGE", "--max-session-age", 86400)),
        tls_cert=_path_flag(ns.tls_cert, env, "DT_TLS_CERT"),
        tls_key=_path_flag(ns.tls_key, env, "DT_TLS_KEY"),
        host=ns.host or env.get("DT_COORDINATOR_HOST") or "127.0.0.1",
        port=port,
        db_path=ns.db_path or env.get("DT_COORDINATOR_DB") or "state/coordinator.duckdb",
        admin_key_file=admin,
        token_ttl_s=float(ns.token_ttl),
        heartbeat_interval_s=positive(ns.heartbeat_interval, "--heartbeat-interval"),
        worker_ttl_s=positive(ns.worker_ttl, "--worker-ttl"),
        max_heartbeat_interval_s=positive(ns.max_heartbeat_interval, "--max-heartbeat-interval"),
        worker_grace_s=positive(ns.worker_grace, "--worker-grace", allow_zero=True),
        worker_retention_s=_retention(ns.worker_retention, env),
        batch_max=int(positive(ns.batch_max, "--batch-max")),
        batch_wait_s=positive(ns.batch_wait, "--batch-wait", allow_zero=True),
        gang_max_wait_s=positive(ns.gang_max_wait, "--gang-max-wait", allow_zero=True),
        gang_ports=_port_range(ns.gang_ports, "--gang-ports"),
        dashboard=ns.dashboard,
        strict=ns.strict if ns.strict is not None else _env_bool(env, "DT_STRICT"),
        **_exhaustion_limits(ns, env),
        **_metrics_flags(ns, env),
        **_bundle_flags(ns, env),
    )


def _bundle_flags(ns: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    out = {
        "max_bundle_mb": _number(ns.max_bundle_mb, env, "DT_MAX_BUNDLE_MB", "--max-bundle-mb", 1024.0, float, 1 << 20),
        "max_bundle_file_mb": _number(ns.max_bundle_file_mb, env, "DT_MAX_BUNDLE_FILE_MB", "--max-bundle-file-mb",
                                      100.0, float, 1 << 20),
        "bundle_retention_s": _number(ns.bundle_retention, env, "DT_BUNDLE_RETENTION", "--bundle-retention",
                                      7 * 86400.0, float, 10 * 365 * 86400.0),
    }
    return out


def _retention(flag: str | None, env: Mapping[str, str]) -> float:
    """``--worker-retention`` / ``DT_WORKER_RETENTION``: seconds, 0 (never) up to ten years."""
    raw, source = env_pick(flag, env, "DT_WORKER_RETENTION")
    if raw is None:
        return 86400.0
    where = "--worker-retention" if source == "flag" else "DT_WORKER_RETENTION"
    try:
        value = float(raw)
    except ValueError as exc:
        raise ConfigError(f"{where}: expected a number of seconds, got {raw!r}") from exc
    if not 0 <= value <= 10 * 365 * 86400.0:
        raise ConfigError(f"{where}: must be 0 (never) or a number of seconds up to ten years, got {raw!r}")
    return value


def _metrics_flags(ns: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    mode, source = env_pick(ns.metrics, env, "DT_METRICS", "key")
    if mode not in METRICS_MODES:
        raise ConfigError(f"{'--metrics' if source == 'flag' else 'DT_METRICS'}: must be one of "
                          f"{', '.join(METRICS_MODES)}, got {mode!r}")
    port = metrics_port(ns.metrics_port, env)
    return {"metrics": mode, "metrics_port": port}


def _env_bool(env: Mapping[str, str], name: str) -> bool:
    value = env.get(name, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise ConfigError(f"{name}: must be 1/true/yes or 0/false/no, got {env[name]!r}")


def _exhaustion_limits(ns: argparse.Namespace, env: Mapping[str, str]) -> dict[str, Any]:
    """The caps on unauthenticated clients (docs/security.md), checked against RLIMIT_NOFILE."""
    out: dict[str, Any] = {
        "header_timeout_s": _number(ns.header_timeout, env, "DT_HEADER_TIMEOUT", "--header-timeout", 10.0, float, 3600),
        "max_connections": _number(ns.max_connections, env, "DT_MAX_CONNECTIONS", "--max-connections", 0, int),
        "max_worker_sessions": _number(ns.max_worker_sessions, env, "DT_MAX_WORKER_SESSIONS", "--max-worker-sessions",
                                       0, int),
        "auth_fail_limit": _number(ns.auth_fail_limit, env, "DT_AUTH_FAIL_LIMIT", "--auth-fail-limit", 20, int),
        "auth_fail_window_s": _number(ns.auth_fail_window, env, "DT_AUTH_FAIL_WINDOW", "--auth-fail-window", 60.0,
                                      float, 86400),
        "max_queued_per_key": _number(ns.max_queued_per_key, env, "DT_MAX_QUEUED_PER_KEY", "--max-queued-per-key",
                                      10000, int),
        "max_payload_mb_per_key": _number(ns.max_payload_mb_per_key, env, "DT_MAX_PAYLOAD_MB_PER_KEY",
                                          "--max-payload-mb-per-key", 64, int),
    }
    connection_limits(out["max_connections"], out["max_worker_sessions"], nofile())
    return out


def _number(flag: str | None, env: Mapping[str, str], var: str, name: str, default: float,
            kind: type[int] | type[float], seconds_max: float | None = None) -> Any:
    """A count (``int``: >= 0) or a number of seconds (``float``: > 0, at most ``seconds_max``)
    from the flag, else the variable, else ``default``; ConfigError naming the one it came from."""
    raw, source = env_pick(flag, env, var)
    if raw is None:
        return default
    where = name if source == "flag" else var
    try:
        value = kind(raw)
    except ValueError as exc:
        raise ConfigError(f"{where}: expected {'a whole number' if kind is int else 'a number'}, got {raw!r}") from exc
    if kind is int and value < 0:
        raise ConfigError(f"{where}: must be >= 0, got {raw!r}")
    if seconds_max is not None and not 0 < value <= seconds_max:
        raise ConfigError(f"{where}: must be > 0 and at most {seconds_max:g} seconds, got {raw!r}")
    return value
def _path_flag(flag: Path | None, env: Mapping[str, str], var: str) -> Path | None:
    return flag or (Path(env[var]) if env.get(var) else None)


def _int_flag(flag: int | None, env: Mapping[str, str], var: str, name: str, default: int) -> int:
    if flag is not None:
        return flag
    raw = env.get(var)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigError(f"{var}: expected whole seconds for {name}, got {raw!r}") from exc


def _port_range(raw: str, source: str) -> tuple[int, int]:
    lo, sep, hi = raw.partition("-")
    try:
        if not sep:
            raise ValueError(raw)
        return int(lo), int(hi)
    except ValueError as exc:
        raise ConfigError(f"{source}: expected LOW-HIGH such as 29500-29999, got {raw!r}") from exc


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
    address ``host`` resolves to, binding the way the server will (``SO_REUSEADDR``). Port 0
    always can."""
    if port == 0:
        return
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


def _env_port(env: Mapping[str, str]) -> int:
    raw = env.get("DT_COORDINATOR_PORT") or "8080"
    try:
        return int(raw)
    except ValueError as exc:
        raise ConfigError(f"DT_COORDINATOR_PORT: expected a whole port number, got {raw!r}") from exc


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
