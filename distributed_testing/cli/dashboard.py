"""``dt-dashboard`` / ``dashboard_server.py``: serve the web dashboard on its own port.

Variables (flags win): DT_COORDINATOR_URL (comma-separated coordinator URLs; the first healthy one
is used), DT_DASHBOARD_HOST, DT_DASHBOARD_PORT, DT_DASHBOARD_SESSION_TTL, DT_CA_FILE.

Exit status: 0 after SIGINT/SIGTERM; 2 when it cannot start (a bad flag or variable, the port in
use), with one line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web

from ..config import env_pick, environ
from ..dashboard.app import DashboardConfig, create_dashboard_app
from ..errors import ConfigError
from .common import add_log_flag, setup_logging, wait_for_signal

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dt-dashboard", description="Serve the distributed_testing web dashboard.",
                                epilog="Exit status: 0 stopped by SIGTERM/SIGINT; 2 could not start.")
    p.add_argument("--coordinator", metavar="URL[,URL...]",
                   help="coordinator base URL(s); with several, the first that answers /healthz is used "
                        "(env DT_COORDINATOR_URL; default http://127.0.0.1:8080)")
    p.add_argument("--host", help="address to bind (default 127.0.0.1; env DT_DASHBOARD_HOST)")
    p.add_argument("--port", help="port to bind, 0 for any free one (default 8081; env DT_DASHBOARD_PORT)")
    p.add_argument("--session-ttl", metavar="S",
                   help="seconds a sign-in lasts (default 28800; env DT_DASHBOARD_SESSION_TTL)")
    p.add_argument("--ca-file", type=Path, help="CA bundle to trust for an https coordinator (env DT_CA_FILE)")
    p.add_argument("--port-file", type=Path, help="write the bound port to this file once listening")
    add_log_flag(p)
    return p


def config_from_args(ns: argparse.Namespace, env: Mapping[str, str]) -> tuple[DashboardConfig, str, int]:
    """(dashboard config, host, port); ConfigError naming the flag or variable that is wrong."""
    raw, source = env_pick(ns.coordinator, env, "DT_COORDINATOR_URL", "http://127.0.0.1:8080")
    where = "--coordinator" if source == "flag" else source
    urls = tuple(u.strip() for u in (raw or "").split(",") if u.strip())
    if not urls:
        raise ConfigError(f"{where}: give at least one coordinator URL")
    for u in urls:
        parts = urlsplit(u)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"{where}: {u!r} is not an http(s)://host[:port] URL")
    port_raw, port_src = env_pick(ns.port, env, "DT_DASHBOARD_PORT", "8081")
    try:
        port = int(port_raw or "")
    except ValueError as exc:
        raise ConfigError(f"{'--port' if port_src == 'flag' else port_src}: expected a port number, got {port_raw!r}") from exc
    if not 0 <= port <= 65535:
        raise ConfigError(f"{'--port' if port_src == 'flag' else port_src}: must be 0..65535, got {port}")
    ttl_raw, ttl_src = env_pick(ns.session_ttl, env, "DT_DASHBOARD_SESSION_TTL", "28800")
    try:
        ttl = float(ttl_raw or "")
    except ValueError:
        ttl = -1.0
    if not 0 < ttl <= 30 * 86400:
        raise ConfigError(f"{'--session-ttl' if ttl_src == 'flag' else ttl_src}: must be 1..2592000 seconds, got {ttl_raw!r}")
    ca = ns.ca_file or (Path(env["DT_CA_FILE"]) if env.get("DT_CA_FILE") else None)
    if ca is not None and not ca.is_file():
        raise ConfigError(f"{'--ca-file' if ns.ca_file else 'DT_CA_FILE'}: {ca} is not a readable file")
    host = ns.host or env.get("DT_DASHBOARD_HOST") or "127.0.0.1"
    return DashboardConfig(coordinator_urls=urls, session_ttl_s=ttl, ca_file=ca), host, port


async def serve(config: DashboardConfig, host: str, port: int, port_file: Path | None) -> None:
    runner = web.AppRunner(create_dashboard_app(config), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(f"--host/--port: cannot listen on {host}:{port}: {exc.strerror}") from exc
        bound = int(runner.addresses[0][1])
        log.info("dashboard on http://%s:%d for %s", host, bound, ", ".join(config.coordinator_urls))
        if port_file is not None:
            tmp = port_file.with_suffix(".tmp")
            tmp.write_text(f"{bound}\n")
            tmp.replace(port_file)
        await wait_for_signal()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    setup_logging(ns.log_level)
    try:
        config, host, port = config_from_args(ns, environ())
        asyncio.run(serve(config, host, port, ns.port_file))
    except ConfigError as exc:
        print(f"dt-dashboard: {exc}", file=sys.stderr)
        return 2
    return 0
