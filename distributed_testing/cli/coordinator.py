"""``dt-coordinator`` / ``run_coordinator.py``: start the coordinator.

Variables (flags win): DT_COORDINATOR_HOST, DT_COORDINATOR_PORT, DT_COORDINATOR_DB, DT_ADMIN_KEY_FILE,
DT_JWT_SECRET_FILE, DT_MAX_SESSION_AGE, DT_TLS_CERT, DT_TLS_KEY.

The process runs with umask 077: every file it creates (the database, its WAL, the journal, the
admin key, the token-signing secret, the port file) is readable by its own user only.
"""

from __future__ import annotations

import argparse
import logging
import os
import ssl
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from aiohttp import web

from .. import aio
from ..config import CoordinatorConfig, environ, positive
from ..coordinator.fast_http import FastSite
from ..coordinator.server import create_app
from ..errors import ConfigError
from ..security import secret_file, tls
from .common import add_log_flag, setup_logging, tune_gc, wait_for_signal

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dt-coordinator", description="Run the distributed_testing coordinator.",
                                epilog=aio.HELP)
    p.add_argument("--host", help="address to bind (default 127.0.0.1; env DT_COORDINATOR_HOST)")
    p.add_argument("--port", type=int, help="port to bind, 0 for any free one (default 8080; env DT_COORDINATOR_PORT)")
    p.add_argument("--db-path", help="DuckDB state file, or memory:// (default state/coordinator.duckdb; env DT_COORDINATOR_DB)")
    p.add_argument("--admin-key-file", type=Path,
                   help="where the first start writes the admin key (default: admin.key beside the database; env DT_ADMIN_KEY_FILE)")
    p.add_argument("--jwt-secret-file", type=Path,
                   help="file holding the token-signing secret, created 0600 on the first start (default: jwt.secret "
                        "beside the database; with memory:// the secret lives in memory only; env DT_JWT_SECRET_FILE)")
    p.add_argument("--rotate-jwt-secret", action="store_true",
                   help="write a new token-signing secret to the secret file and exit; after the coordinator restarts, "
                        "JWTs signed with the old one are refused (API keys keep working)")
    p.add_argument("--token-ttl", type=int, default=900, help="JWT lifetime in whole seconds, at least 1 (default 900)")
    p.add_argument("--max-session-age", type=int,
                   help="seconds after a JWT was first obtained with an API key during which it (and its renewals) may "
                        "be renewed; renewed JWTs never outlive it (default 86400; env DT_MAX_SESSION_AGE)")
    p.add_argument("--tls-cert", type=Path,
                   help="PEM certificate chain: serve https and wss (needs --tls-key; env DT_TLS_CERT)")
    p.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert (env DT_TLS_KEY)")
    p.add_argument("--heartbeat-interval", type=float, default=1.0, help="WebSocket ping to a worker after this many seconds without a frame from it; no pong within half of it and the worker is disconnected (default 1)")
    p.add_argument("--worker-ttl", type=float, default=3.0, help="declare a worker dead after this many seconds without a heartbeat (default 3; keep it above 2x the workers' --heartbeat-interval)")
    p.add_argument("--worker-grace", type=float, default=10.0, help="seconds a disconnected worker has to reconnect before its tasks are requeued (default 10)")
    p.add_argument("--batch-max", type=int, default=8, help="benchmark tasks sharing a model sent to one worker as one batch, at most (default 8; 1 disables batching)")
    p.add_argument("--batch-wait", type=float, default=0.2, help="seconds a benchmark task may wait for others to batch with (default 0.2)")
    p.add_argument("--gang-max-wait", type=float, default=60.0,
                   help="seconds a multi-node training task may wait while smaller tasks use the free slots; after "
                        "that its eligible workers take no new work of lower or equal priority until it fits (default 60)")
    p.add_argument("--gang-ports", default="29500-29999", metavar="LOW-HIGH",
                   help="rendezvous ports the coordinator hands to multi-node training tasks, one per running task "
                        "and master address (default 29500-29999)")
    p.add_argument("--port-file", type=Path, help="write the bound port to this file once listening (for scripts using --port 0)")
    add_log_flag(p)
    return p


def config_from_args(ns: argparse.Namespace, env: Mapping[str, str]) -> CoordinatorConfig:
    port, source = (ns.port, "--port") if ns.port is not None else (_env_port(env), "DT_COORDINATOR_PORT")
    if not 0 <= port <= 65535:
        raise ConfigError(f"{source}: must be 0..65535, got {port}")
    admin = ns.admin_key_file or (Path(env["DT_ADMIN_KEY_FILE"]) if env.get("DT_ADMIN_KEY_FILE") else None)
    return CoordinatorConfig(
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
        worker_grace_s=positive(ns.worker_grace, "--worker-grace", allow_zero=True),
        batch_max=int(positive(ns.batch_max, "--batch-max")),
        batch_wait_s=positive(ns.batch_wait, "--batch-wait", allow_zero=True),
        gang_max_wait_s=positive(ns.gang_max_wait, "--gang-max-wait", allow_zero=True),
        gang_ports=_port_range(ns.gang_ports, "--gang-ports"),
    )


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


async def serve(config: CoordinatorConfig, port_file: Path | None, ssl_context: ssl.SSLContext | None = None) -> None:
    """Run until SIGINT/SIGTERM; write the bound port to ``port_file`` once listening."""
    runner = web.AppRunner(create_app(config), access_log=None)
    await runner.setup()
    try:
        site = FastSite(runner, config.host, config.port, reuse_address=True, ssl_context=ssl_context)
        await site.start()
        port = int(runner.addresses[0][1])
        log.info("coordinator listening on %s://%s:%d", config.scheme, config.host, port)
        if port_file is not None:
            tmp = port_file.with_suffix(".tmp")
            tmp.write_text(f"{port}\n")
            tmp.replace(port_file)
        await wait_for_signal()
    finally:
        await runner.cleanup()


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
    except ConfigError as exc:
        print(f"dt-coordinator: {exc}", file=sys.stderr)
        return 2
    os.umask(0o077)  # state files and directories: this user only (see the module docstring)
    tune_gc()
    aio.run(serve(config, ns.port_file, ssl_context), loop)
    return 0


def _rotate(config: CoordinatorConfig) -> int:
    path = config.jwt_secret_path
    if path is None:
        raise ConfigError("--rotate-jwt-secret: a memory:// store keeps its secret in memory only; "
                          "give --jwt-secret-file to rotate a secret file")
    secret_file.rotate(path)
    print(f"rotated the token-signing secret in {path}; restart the coordinator to use it", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
