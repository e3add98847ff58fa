"""``create_app(config)``: the coordinator as an aiohttp application.

The app owns its background work through ``cleanup_ctx``: the store (opened, its snapshot of the
active work restored into the state machine, closed with a final checkpoint) and the ticker that drives time-based transitions
(retry backoff, worker TTL and grace). On the first start with an empty store it creates an admin
key and writes it to ``admin_key_file`` (mode 0600); there are no built-in credentials.

Every background task runs under the runtime's ``Supervisor``: the ticker, and a watch on the
store's own background work. One that dies, like a write the store could not make, is fatal
(``supervisor``); so is a failed final checkpoint at shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import AsyncIterator

from aiohttp import web

from ..config import CoordinatorConfig
from ..errors import StoreError
from ..security import bootstrap
from . import limits
from .api import AUTH_THROTTLE, LIMITS, WORKER_ROUTE, add_routes, error_middleware, publish_openapi
from .metrics import serve_metrics
from .runtime import RUNTIME, Runtime, key_record
from .store.base import Store, TaskQuery
from .ws import worker_endpoint

log = logging.getLogger(__name__)
TICK_S = 0.25
BASELINE_ROWS = 1000  # the newest succeeded training tasks read at start for scaling baselines
LINGER_S = 2.0  # how long an unread body is dropped before closing (aiohttp's default: 10 s)
DASHBOARD_PREFIX = "/dashboard"
CONFIG = web.AppKey("config", CoordinatorConfig)
STORE: web.AppKey[Store | None] = web.AppKey("store")
METRICS_PORT = web.AppKey("metrics_port", int)


def create_app(config: CoordinatorConfig, store: Store | None = None) -> web.Application:
    """The coordinator's app. ConfigError when the connection caps do not fit RLIMIT_NOFILE."""
    app = web.Application(middlewares=[error_middleware], client_max_size=config.max_frame_bytes)
    app[CONFIG] = config
    app[STORE] = store
    app[LIMITS] = limits.connection_limits(config.max_connections, config.max_worker_sessions, nofile())
    app[AUTH_THROTTLE] = limits.AuthThrottle(config.auth_fail_limit, config.auth_fail_window_s)
    add_routes(app, metrics_route=config.metrics == "key")
    app.router.add_get(WORKER_ROUTE, worker_endpoint, allow_head=False)
    publish_openapi(app)
    if config.dashboard:
        from ..dashboard.app import DashboardConfig, create_dashboard_app

        app.add_subapp(DASHBOARD_PREFIX, create_dashboard_app(DashboardConfig(prefix=DASHBOARD_PREFIX)))
    app.cleanup_ctx.append(_runtime_ctx)
    if config.metrics_port is not None:
        app.cleanup_ctx.append(_metrics_port_ctx)
    app.on_shutdown.append(_close_sessions)
    return app


async def _close_sessions(app: web.Application) -> None:
    """Before the HTTP server waits for its handlers: end the ones that would wait longest."""
    if RUNTIME in app:
        app[RUNTIME].shutdown("coordinator shutting down")


def make_runner(app: web.Application) -> web.AppRunner:
    """The runner to serve ``app`` with (``FastSite`` on it): aiohttp closes a connection that has
    not sent a complete request head within ``--header-timeout`` of being handed to it or of its
    last answer (its keep-alive timer runs from the connection's start and covers both). A body
    its handler did not read (a refused request) is dropped for at most ``LINGER_S`` before the
    connection is closed, as on the lean front."""
    return web.AppRunner(app, access_log=None, keepalive_timeout=app[CONFIG].header_timeout_s,
                         lingering_time=LINGER_S)


def nofile() -> int:
    """This process's soft limit on open file descriptors."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


async def _runtime_ctx(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG]
    store = app[STORE]
    if store is None:
        from .store import open_store

        store = open_store(config.db_path)
    rt = Runtime(config, store)
    app[RUNTIME] = rt
    snap = await store.open()
    try:
        rt.keys = {k.key_id: key_record(k) for k in snap.keys}
        now = rt.clock()
        rt.state.restore(snap, now)
        await _read_history(rt, store, now)
        await rt.ensure_secret(snap.meta)
        if not rt.keys:
            await _bootstrap_admin(rt)
        log.info("coordinator state: %d active tasks restored (%d stored in all), %d workers known, %d keys",
                 len(snap.tasks), sum(rt.state.counts.values()), len(rt.state.workers), len(rt.keys))
        rt.supervisor.spawn(_tick_loop(rt), "coordinator-ticker")
        rt.supervisor.spawn(store.watch(), "store-watch")
        yield
    finally:
        await rt.supervisor.stop()
        for s in list(rt.sessions.values()):
            s.close("coordinator shutting down")
        try:
            await store.close()
        except StoreError as exc:  # the records stay in the journal; the next start applies them
            rt.supervisor.fail("closing the store failed", exc)


async def _read_history(rt: Runtime, store: Store, now: float) -> None:
    """What the start needs of the history beyond the snapshot, each a bounded query: the
    overview's last hour and latest failures, and the single-node training runs that multi-node
    runs are compared with."""
    activity = rt.activity
    since = activity.since(now)
    activity.seed(await store.task_stats(since, activity.bucket_s, activity.n, activity.failures_kept), since)
    page = await store.query_tasks(TaskQuery(type="training", state="succeeded", limit=BASELINE_ROWS))
    rt.state.note_baselines(page.tasks)


async def _metrics_port_ctx(app: web.Application) -> AsyncIterator[None]:
    """``--metrics-port``: ``GET /metrics`` without a credential on its own port; its bound port
    goes to ``app[METRICS_PORT]``."""
    config = app[CONFIG]
    assert config.metrics_port is not None
    runner, port = await serve_metrics(app[RUNTIME].metrics.render, config.host, config.metrics_port)
    app[METRICS_PORT] = port
    log.info("metrics on http://%s:%d/metrics (no credential)", config.host, port)
    try:
        yield
    finally:
        await runner.cleanup()


async def _bootstrap_admin(rt: Runtime) -> None:
    plaintext, rec = bootstrap.bootstrap_admin_key(rt.clock())
    path = rt.config.admin_key_path
    bootstrap.write_secret_file(path, plaintext + "\n")
    await rt.save_key(rec)
    log.warning("empty store: created admin key %s and wrote it to %s (mode 0600)", rec.key_id, path)


async def _tick_loop(rt: Runtime) -> None:
    while True:
        await asyncio.sleep(TICK_S)
        rt.tick()
