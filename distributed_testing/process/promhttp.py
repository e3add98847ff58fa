"""``serve_metrics``: a bare HTTP server for ``GET /metrics``, shared by the coordinator's
``--metrics-port`` and the worker's. No credential: bind it where only the scraper reaches it."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from ..errors import ConfigError

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # the Prometheus text format


async def serve_metrics(render: Callable[[], bytes], host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve ``GET /metrics`` (``render()``) on ``host:port`` (0: any free port); the caller
    cleans the runner up. Returns it and the bound port. ConfigError naming ``--metrics-port``
    when the port cannot be bound."""

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=render(), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", handler, allow_head=False)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, reuse_address=True).start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(f"--metrics-port: cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return runner, int(runner.addresses[0][1])
