"""``dt-dashboard`` / ``dashboard_server.py``: serve the web dashboard on its own port.

Flags and their DT_* variables (flags win) are the rows of ``DASHBOARD_SETTINGS`` below.

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

from aiohttp import web

from ..config import environ, parse_urls
from ..dashboard.app import DashboardConfig, create_dashboard_app
from ..errors import ConfigError
from .common import add_log_flag, setup_logging, wait_for_signal
from .options import Setting, add_settings, resolve

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dt-dashboard", description="Serve the distributed_testing web dashboard.",
                                epilog="Exit status: 0 stopped by SIGTERM/SIGINT; 2 could not start.")
    add_settings(p, DASHBOARD_SETTINGS)
    add_log_flag(p)
    return p


def config_from_args(ns: argparse.Namespace, env: Mapping[str, str]) -> tuple[DashboardConfig, str, int]:
    """(dashboard config, host, port); ConfigError naming the flag or variable that is wrong."""
    v = resolve(DASHBOARD_SETTINGS, ns, env)
    config = DashboardConfig(coordinator_urls=v["coordinator"], session_ttl_s=v["session_ttl"], ca_file=v["ca_file"])
    return config, v["host"], v["port"]


def _readable(path: Path, source: str) -> Path:
    if not path.is_file():
        raise ConfigError(f"{source}: {path} is not a readable file")
    return path


DASHBOARD_SETTINGS: tuple[Setting, ...] = (
    Setting("--coordinator", env="DT_COORDINATOR_URL", metavar="URL[,URL...]", default=("http://127.0.0.1:8080",),
            check=parse_urls, shown="--coordinator URL[,URL...]",
            help="coordinator base URL(s); with several, the first that answers /healthz is used "
                 "(default http://127.0.0.1:8080)",
            doc="the first that answers `/healthz` is used", shown_default="`http://127.0.0.1:8080`"),
    Setting("--host", env="DT_DASHBOARD_HOST", default="127.0.0.1", help="address to bind (default 127.0.0.1)",
            doc="", shown_default="`127.0.0.1`"),
    Setting("--port", type=int, env="DT_DASHBOARD_PORT", lo=0, hi=65535, default=8081,
            help="port to bind, 0 for any free one (default 8081)", doc="0: any free port", shown_default="`8081`"),
    Setting("--session-ttl", type=float, env="DT_DASHBOARD_SESSION_TTL", lo=0, lo_open=True, hi=30 * 86400,
            default=28800.0, metavar="S", help="seconds a sign-in lasts (default 28800)",
            doc="how long a sign-in lasts", shown="--session-ttl S", shown_default="`28800`"),
    Setting("--ca-file", type=Path, env="DT_CA_FILE", check=_readable,
            help="CA bundle to trust for an https coordinator", doc="CA bundle for an https coordinator",
            shown_default="system CAs"),
    Setting("--port-file", type=Path, read=False, help="write the bound port to this file once listening", doc=""),
)


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
