"""``create_app(config)``: the coordinator as an aiohttp application.

The app owns its background work through ``cleanup_ctx``: the store (opened, its snapshot of the
active work restored into the state machine, closed with a final checkpoint) and the ticker that drives time-based transitions
(retry backoff, worker TTL and grace). On the first start with an empty store it creates an admin
key and writes it to ``admin_key_file`` (mode 0600); there are no built-in credentials.

Every background task runs under the runtime's ``Supervisor``: the ticker, and a watch on the
store's own background work. One that dies, like a write the store could not make, is fatal
(``supervisor``); so is a failed final checkpoint at shutdown.

With a PostgreSQL store the app is a member of the HA group (``group.py``, ``_member_ctx``): it
opens the store and its group connections, loads the keys and the group's token-signing secret,
and serves as a standby (``GET /api/v1/health`` and ``/api/v1/cluster``; the rest it forwards to the
leader, ``forward.py``)
until it holds the lease; then it loads the active work, fences the store with its epoch and
leads. Losing the lease ends the term (``LeadershipLost`` through the supervisor); the CLI starts
a new standby term in the same process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import resource
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol, runtime_checkable

from aiohttp import web

from ..config import CoordinatorConfig
from ..errors import ConfigError, StoreError
from ..security import bootstrap, tokens
from . import admission, bundles_api, forward
from .api import AUTH_THROTTLE, LIMITS, PROXY_SECRET, WORKER_ROUTE, add_routes, error_middleware, publish_openapi
from .core.rows import KeyRow, Snapshot
from .group import Group, LeadershipLost, is_postgres_url
from .metrics import serve_metrics
from .runtime import RUNTIME, Runtime, key_record
from .store.base import TERMINAL, Store, TaskQuery
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
    app[LIMITS] = admission.connection_limits(config.max_connections, config.max_worker_sessions, nofile())
    app[AUTH_THROTTLE] = admission.AuthThrottle(config.auth_fail_limit, config.auth_fail_window_s)
    add_routes(app, metrics_route=config.metrics == "key")
    app.router.add_get(WORKER_ROUTE, worker_endpoint, allow_head=False)
    publish_openapi(app)
    if config.dashboard:
        from ..dashboard.app import DashboardConfig, create_dashboard_app

        app[PROXY_SECRET] = secrets.token_urlsafe(32)
        app.add_subapp(DASHBOARD_PREFIX, create_dashboard_app(DashboardConfig(prefix=DASHBOARD_PREFIX,
                                                                              proxy_secret=app[PROXY_SECRET])))
    if is_postgres_url(config.db_path):
        # a standby forwards API requests to the leader
        app.cleanup_ctx.append(functools.partial(forward.http_ctx, ca_file=config.ca_file))
    app.cleanup_ctx.append(_member_ctx if is_postgres_url(config.db_path) else _runtime_ctx)
    if config.metrics_port is not None:
        app.cleanup_ctx.append(_metrics_port_ctx)
    app.on_shutdown.append(end_long_requests)
    return app


async def end_long_requests(app: web.Application) -> None:
    """Before the HTTP server waits for its handlers: end the ones that would wait longest (worker
    sessions, ``?wait`` requests, event streams, those a standby forwards among them). The lean
    front's ``FastSite.stop`` calls it before it waits for busy connections (aiohttp stops its
    sites before ``on_shutdown``); aiohttp's own sites get it from ``on_shutdown``. Idempotent."""
    if RUNTIME in app:
        app[RUNTIME].shutdown("coordinator shutting down")
    if forward.FORWARDER in app:
        app[forward.FORWARDER].end_long_requests()


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
        await _restore(rt, store, snap)
        await rt.ensure_secret(snap.meta)
        await _serve_restored(rt, snap)
        rt.supervisor.spawn(store.watch(), "store-watch")
        yield
    finally:
        await _stop(rt, store)


async def _restore(rt: Runtime, store: Store, snap: Snapshot) -> None:
    """Load a snapshot (a start, or a takeover): the keys, the active work, and what the start
    needs of the history."""
    rt.keys = {k.key_id: key_record(k) for k in snap.keys}
    now = rt.clock()
    rt.state.restore(snap, now)
    await _read_history(rt, store, now)


async def _serve_restored(rt: Runtime, snap: Snapshot) -> None:
    """After ``_restore`` and the secret: an admin key for an empty store, and the ticker."""
    if not rt.keys:
        await _bootstrap_admin(rt)
    log.info("coordinator state: %d active tasks restored (%d stored in all), %d workers known, %d keys",
             len(snap.tasks), sum(rt.state.counts.values()), len(rt.state.workers), len(rt.keys))
    rt.supervisor.spawn(_tick_loop(rt), "coordinator-ticker")
    rt.supervisor.spawn(_sweep_loop(rt), "bundle-sweep")


async def _stop(rt: Runtime, store: Store) -> None:
    """Stop the background work, close every worker session, then the store (a failed close is
    fatal: the records stay in the journal and the next start applies them)."""
    await rt.supervisor.stop()
    for s in list(rt.sessions.values()):
        s.close("coordinator shutting down")
    try:
        await store.close()
    except StoreError as exc:
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


@runtime_checkable
class GroupStore(Store, Protocol):
    """What a group member needs of its store beyond ``Store`` (``PostgresStore``)."""

    def set_fence(self, holder: str, epoch: int) -> None:
        """From now on, a write commits only while ``holder`` holds the lease at ``epoch``."""

    async def snapshot(self) -> Snapshot:
        """The active work as committed now (the store is open)."""

    async def load_keys(self) -> Sequence[KeyRow]:
        """Every key as committed now."""

    async def listen(self, channel: str, callback: Callable[[str], None]) -> None:
        """Call ``callback`` for every notification on ``channel`` (and with "" whenever it
        (re)starts listening) until cancelled."""


async def _member_ctx(app: web.Application) -> AsyncIterator[None]:
    """A group member's term: standby until it holds the lease, then leader (module docstring)."""
    config = app[CONFIG]
    store = app[STORE]
    if store is None:
        from .store import open_store

        store = open_store(config.db_path)
    if not isinstance(store, GroupStore):
        raise ConfigError(f"--db-path {config.db_path!r}: this store cannot be shared by a group of coordinators")
    rt = Runtime(config, store)
    app[RUNTIME] = rt
    group = rt.group = Group(config.db_path, config.advertise_url or "", config.member_id)
    try:
        snap = await store.open()  # the standby keeps its connections and schema ready for a takeover
        await group.connect()
        rt.keys = {k.key_id: key_record(k) for k in snap.keys}
        await _load_secret(rt, group)
        rt.supervisor.spawn(_refresh_keys(rt, store, group), "group-keys")
        rt.supervisor.spawn(_member(rt, store, group), "group-member")
        rt.supervisor.spawn(store.watch(), "store-watch")
        yield
    finally:
        await _stop(rt, store)
        await group.close()  # releases the lease once nothing acts any more: a standby takes over at once


async def _load_secret(rt: Runtime, group: Group) -> None:
    """``--jwt-secret-file`` if given (every member must get the same file), else the group's
    secret in the database (created by the first member)."""
    if rt.config.jwt_secret_file is not None:
        await rt.ensure_secret({})
    else:
        rt.jwt_secret = await group.secret(tokens.generate_secret)


async def _refresh_keys(rt: Runtime, store: GroupStore, group: Group) -> None:
    """On every ``NOTIFY dt_keys``: a standby reloads every key (a leader's own are current: every
    key change goes through it) and every member the group's secret (``--rotate-jwt-secret``)."""
    changed = asyncio.Event()
    listening = asyncio.create_task(store.listen("dt_keys", lambda _payload: changed.set()), name="keys-listen")
    try:
        while True:
            waiter = asyncio.ensure_future(changed.wait())
            done, _ = await asyncio.wait([waiter, listening], return_when=asyncio.FIRST_COMPLETED)
            if listening in done:
                waiter.cancel()
                listening.result()  # raises why it stopped
                raise StoreError("listening for key changes stopped")
            changed.clear()
            try:
                if not group.took_lease:
                    keys = {k.key_id: key_record(k) for k in await store.load_keys()}
                    if not group.took_lease:  # a takeover meanwhile loaded (and may have made) newer ones
                        rt.keys = keys
                await _load_secret(rt, group)
            except (StoreError, ConfigError, OSError) as exc:  # the next notification or term reloads them
                log.warning("reloading keys after a change notification failed: %s", exc)
    finally:
        listening.cancel()
        with contextlib.suppress(asyncio.CancelledError, StoreError):
            await listening


async def _member(rt: Runtime, store: GroupStore, group: Group) -> None:
    await rt.bound.wait()  # the advertised URL needs the bound port
    group.url = rt.advertise_url or ""
    try:
        await group.run(functools.partial(_take_over, rt, store, group))
    except LeadershipLost as exc:
        rt.lost_leadership(str(exc))
        await asyncio.Event().wait()  # until the supervisor stops this term


async def _take_over(rt: Runtime, store: GroupStore, group: Group, epoch: int) -> None:
    """Elected: fence the store with this epoch, then load the active work as committed now (the
    old leader can commit nothing more), the keys, and start the ticker."""
    store.set_fence(group.member_id, epoch)
    snap = await store.snapshot()
    await _restore(rt, store, snap)
    await _serve_restored(rt, snap)


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


async def _sweep_loop(rt: Runtime) -> None:
    """Delete bundle blobs unused for ``--bundle-retention``, checking a tenth as often (at most
    hourly). The leader only: it alone knows every unfinished task, whose bundles stay."""
    period = min(3600.0, max(0.2, rt.config.bundle_retention_s / 10))
    while True:
        await asyncio.sleep(period)
        if not rt.leading():
            continue
        active = [t.spec.bundle for t in list(rt.state.tasks.values()) if t.spec.bundle and t.state not in TERMINAL]
        try:
            await bundles_api.sweep(rt, active)
        except Exception as exc:  # a failed sweep deletes nothing; the next one tries again
            log.warning("bundle sweep failed: %s", exc)


async def _tick_loop(rt: Runtime) -> None:
    while True:
        await asyncio.sleep(TICK_S)
        rt.tick()
