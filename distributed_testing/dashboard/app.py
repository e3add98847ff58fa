"""``create_dashboard_app(config)``: the dashboard as an aiohttp application.

It serves on its own port (``dashboard_server.py`` / ``dt-dashboard``) or under ``/dashboard`` of
the coordinator (``dt-coordinator --dashboard``; it then talks to its own coordinator over the
loopback). Every page is server-rendered HTML plus one small script that reads ``data/...`` (the
coordinator's REST API, called with the signed-in user's key) and redraws in place on each event
of ``events`` (the coordinator's change feed, proxied). Charts are Chart.js, shipped in
``static/vendor``: nothing is fetched from outside.

Routes (relative to where the app is mounted) and who may use them: ``login`` (anyone), every page
and ``data/*`` and ``events`` (a signed-in session of a role with read access: viewer, submitter,
admin), ``actions/*`` and ``logout`` (a session whose ``X-CSRF-Token`` matches; the coordinator
then applies its own permission check, so a viewer's cancel or drain gets its 403, and a run's
cancel or re-run is for the key that created the run or an admin). Pages: the overview, ``runs``
and ``runs/{id}``, ``workers``, ``tasks`` and ``tasks/{id}``, ``benchmarks``, ``training``.

Sign-in (``POST login``): refused (403) when the browser says the form came from another site
(``Sec-Fetch-Site``, else ``Origin``: login CSRF). Wrong keys count per browser address (IPv6:
its /64) as the dashboard sees it: ``SIGNIN_FAIL_LIMIT`` within ``SIGNIN_FAIL_WINDOW_S`` and that
address gets 429 with ``Retry-After`` until they age out; mounted in a coordinator, the
coordinator counts them against the same browser address too (``client``), never against the
loopback the dashboard reaches it on. ``events``: at most ``sessions.MAX_STREAMS_PER_SESSION``
per session and ``MAX_STREAMS_PER_KEY`` per key (429 past them). An action whose body is not
JSON gets 400.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import msgspec
from aiohttp import web

from ..errors import DTError, PermissionDenied, http_body, http_headers, http_status
from ..process.httpstream import ClientGone, chunks_while_connected, end_after_broken_body, unreadable
from ..security.throttle import AuthThrottle, address_key
from . import data
from .client import CoordinatorClient
from .sessions import COOKIE, CSRF_HEADER, READ_ROLES, Session, SessionStore

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"
PAGES = {"": ("overview", "Overview"), "runs": ("runs", "Runs"), "workers": ("workers", "Workers"),
         "tasks": ("tasks", "Tasks"), "benchmarks": ("benchmarks", "Benchmarks"), "training": ("training", "Training")}
DETAIL_PAGES = {"task": ("task_id", "Task"), "run": ("run_id", "Run")}  # page: (its id in the path, title)


@dataclass(frozen=True)
class DashboardConfig:
    """``coordinator_urls``: tried in order (see ``client``); empty when mounted in a coordinator,
    which then fills in its own address. ``prefix``: the path the app is mounted at ("" or
    "/dashboard"). ``session_ttl_s``: how long a sign-in lasts. ``proxy_secret``: the secret of
    the coordinator this app is mounted in (``client``), None when standalone."""

    coordinator_urls: tuple[str, ...] = ()
    prefix: str = ""
    session_ttl_s: float = 8 * 3600.0
    ca_file: Path | None = None
    proxy_secret: str | None = None


CONFIG = web.AppKey("dashboard_config", DashboardConfig)
CLIENT = web.AppKey("dashboard_client", CoordinatorClient)
SESSIONS = web.AppKey("dashboard_sessions", SessionStore)
SESSION = web.RequestKey("dashboard_session", Session)
SIGNIN_THROTTLE = web.AppKey("dashboard_signin_throttle", AuthThrottle)
STREAMS: web.AppKey[set[aiohttp.ClientResponse]] = web.AppKey("dashboard_streams")  # the event streams relayed now
STOPPING = web.AppKey("dashboard_stopping", asyncio.Event)  # set by _end_streams
# Below the coordinator's default --auth-fail-limit (20 a minute): a standalone dashboard's
# guesser is refused here before the coordinator would refuse the dashboard's own address.
SIGNIN_FAIL_LIMIT = 10
SIGNIN_FAIL_WINDOW_S = 60.0
STREAM_RETRY_AFTER_S = 5
GONE_CHECK_S = 0.5
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def create_dashboard_app(config: DashboardConfig, client: CoordinatorClient | None = None) -> web.Application:
    app = web.Application(middlewares=[_session_middleware])
    app[CONFIG] = config
    app[SESSIONS] = SessionStore(config.session_ttl_s)
    app[SIGNIN_THROTTLE] = AuthThrottle(SIGNIN_FAIL_LIMIT, SIGNIN_FAIL_WINDOW_S)
    if client is None:
        import ssl as _ssl

        context: _ssl.SSLContext | bool = _ssl.create_default_context(cafile=str(config.ca_file)) if config.ca_file else True
        client = CoordinatorClient(config.coordinator_urls, context, config.proxy_secret)
    app[CLIENT] = client
    app[STREAMS] = set()
    app[STOPPING] = asyncio.Event()
    app.cleanup_ctx.append(_client_ctx)
    app.on_shutdown.append(_end_streams)
    r = app.router
    r.add_get("/login", login_page)
    r.add_post("/login", login)
    r.add_post("/logout", logout)
    for path, (page, _) in PAGES.items():
        r.add_get(f"/{path}", _page_handler(page))
    r.add_get("/tasks/{task_id}", _page_handler("task"))
    r.add_get("/runs/{run_id}", _page_handler("run"))
    r.add_get("/data/overview", data_overview)
    r.add_get("/data/workers", _proxy("/api/v1/workers"))
    r.add_get("/data/tasks", _proxy("/api/v1/tasks"))
    r.add_get("/data/tasks/{task_id}", _proxy("/api/v1/tasks/{task_id}"))
    r.add_get("/data/tasks/{task_id}/logs", _proxy("/api/v1/tasks/{task_id}/logs"))  # task.js follows it (wait < 5 s)
    r.add_get("/data/results", _proxy("/api/v1/results"))
    r.add_get("/data/benchmark-models", data_benchmark_models)
    r.add_get("/data/runs", _proxy("/api/v1/runs"))
    r.add_get("/data/runs/{run_id}", _proxy("/api/v1/runs/{run_id}"))
    r.add_get("/events", events)
    r.add_post("/actions/tasks/{task_id}/cancel", _action("/api/v1/tasks/{task_id}/cancel"))
    r.add_post("/actions/workers/{worker_id}/drain", _action("/api/v1/workers/{worker_id}/drain"))
    r.add_post("/actions/runs/{run_id}/cancel", _action("/api/v1/runs/{run_id}/cancel"))
    r.add_post("/actions/runs/{run_id}/rerun", _action("/api/v1/runs/{run_id}/rerun"))
    r.add_static("/static/", STATIC, append_version=True)
    return app


async def _client_ctx(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[CLIENT].close()


async def _end_streams(app: web.Application) -> None:
    """The dashboard is stopping: end the event streams it relays, each of which would hold the
    server's shutdown (60 s) until its browser tab went away; the browsers reconnect elsewhere
    or later."""
    app[STOPPING].set()
    streams = app[STREAMS]
    for upstream in list(streams):
        upstream.close()


def _url(request: web.Request, path: str) -> str:
    return f"{request.app[CONFIG].prefix}/{path}"


# ----------------------------------------------------------------- sessions

_OPEN = ("/login", "/static")


@web.middleware
async def _session_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every route but the login and static files needs a live session; one that is missing
    gets the login page (pages) or 401 (data, events, actions). Domain errors become JSON."""
    return end_after_broken_body(request, await _in_session(request, handler))


async def _in_session(request: web.Request, handler: Handler) -> web.StreamResponse:
    resource = request.match_info.route.resource
    canonical = (resource.canonical if resource else "").removeprefix(request.app[CONFIG].prefix)
    client = request.app[CLIENT]
    if not client.urls:  # mounted in a coordinator: talk to it over the socket this request came in on
        client.adopt_local(request.transport.get_extra_info("sockname") if request.transport else None,
                           request.secure)
    if not any(canonical.startswith(p) for p in _OPEN):
        session = request.app[SESSIONS].get(request.cookies.get(COOKIE), time.time())
        if session is None:
            if request.method == "GET" and not canonical.startswith(("/data", "/events")):
                raise web.HTTPSeeOther(_url(request, "login"))
            return _json({"error": "AuthError", "message": "sign in first"}, 401)
        request[SESSION] = session
    try:
        return await handler(request)
    except DTError as exc:
        status = http_status(exc)
        if status == 500:
            log.error("unexpected error on dashboard %s %s", request.method, request.path, exc_info=exc)
        return _json(http_body(exc), status, http_headers(exc, status))


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), status=status, headers=headers,
                        content_type="application/json")


async def login_page(request: web.Request) -> web.Response:
    return _html(request, "login", "Sign in", "", session=None)


async def login(request: web.Request) -> web.StreamResponse:
    """Form field ``key``: an API key of a role with read access. The coordinator checks it (by
    minting a token with it); the session keeps the key, the browser gets only the cookie.
    403 for a form posted from another site, 429 while the browser's address is refused for
    wrong keys (module docstring)."""
    cross = _cross_site(request)
    if cross is not None:
        log.warning("refused a cross-site sign-in from %s (%s)", request.remote, cross)
        return _login_refused(request, 403, "Sign in from the dashboard's own page.")
    throttle, addr = request.app[SIGNIN_THROTTLE], address_key(request.remote or "")
    wait = throttle.retry_after(addr, time.monotonic())
    if wait is not None:
        return _too_many(request, wait)
    try:
        form = await request.post()
    except web.RequestPayloadError:  # not what its Content-Encoding says
        return _login_refused(request, 400, "The sign-in form could not be read.")  # the middleware ends the connection
    key = str(form.get("key", "")).strip()
    client = request.app[CLIENT]
    status, body, headers = (await client.call("POST", "/api/v1/auth/token", key, client=request.remote) if key
                             else (401, None, {}))
    if status == 429:  # the coordinator refuses this browser's address already
        return _too_many(request, float(headers.get("Retry-After") or SIGNIN_FAIL_WINDOW_S))
    role, key_id = (body.get("role"), body.get("key_id")) if status == 200 and isinstance(body, dict) else (None, None)
    if role not in READ_ROLES:
        if key and status == 401 and throttle.failed(addr, time.monotonic()):
            log.warning("dashboard: %d failed sign-ins from %s within %gs; refusing it (429) until they age out",
                        throttle.limit, addr, throttle.window_s)
        return _login_refused(request, 403 if role else 401,
                              "That key has no read access." if role else "That key was not accepted.")
    session = request.app[SESSIONS].create(key, str(key_id), str(role), time.time())
    log.info("dashboard sign-in: key %s (%s)", session.key_id, role)
    resp = web.Response(status=303, headers={"Location": _url(request, "")})
    resp.set_cookie(COOKIE, session.session_id, path=request.app[CONFIG].prefix or "/", httponly=True,
                    samesite="Strict", secure=request.secure, max_age=max(1, int(request.app[SESSIONS].ttl_s)))
    return resp


def _cross_site(request: web.Request) -> str | None:
    """Why the sign-in form was posted from another site, or None. ``Sec-Fetch-Site`` when the
    browser sends it (same-origin, or none: typed by the user); else ``Origin``, whose host must be
    the one this request was sent to (the scheme is not compared: a TLS proxy in front changes it).
    A client sending neither (curl, a script) is no browser to forge a request with."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        return None if site in ("same-origin", "none") else f"Sec-Fetch-Site: {site}"
    origin = request.headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc.lower() != request.host.lower():
        return f"Origin: {origin}"
    return None


def _login_refused(request: web.Request, status: int, message: str,
                   headers: dict[str, str] | None = None) -> web.Response:
    resp = _html(request, "login", "Sign in", f'<p class="error" role="alert">{html.escape(message)}</p>', session=None)
    resp.set_status(status)
    resp.headers.update(headers or {})
    return resp


def _too_many(request: web.Request, wait: float) -> web.Response:
    seconds = max(1, math.ceil(wait))
    return _login_refused(request, 429, f"Too many failed sign-ins from this address; try again in {seconds} s.",
                          {"Retry-After": str(seconds)})


async def logout(request: web.Request) -> web.StreamResponse:
    session = _checked(request)
    request.app[SESSIONS].end(session.session_id)
    resp = _json({"signed_out": True})
    resp.del_cookie(COOKIE, path=request.app[CONFIG].prefix or "/")
    return resp


def _checked(request: web.Request) -> Session:
    """The session, if the request carries its CSRF token; PermissionDenied otherwise."""
    session = request[SESSION]
    if not session.csrf_ok(request.headers.get(CSRF_HEADER)):
        raise PermissionDenied(f"missing or wrong {CSRF_HEADER}")
    return session


# ----------------------------------------------------------------- pages

def _page_handler(page: str) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        extra, title = "", next((label for name, label in PAGES.values() if name == page), "")
        if page in DETAIL_PAGES:
            field, title = DETAIL_PAGES[page]
            extra = f' data-{field.replace("_", "-")}="{html.escape(request.match_info[field])}"'

        return _html(request, page, title, extra, session=request[SESSION])
    return handler


def _html(request: web.Request, page: str, title: str, extra: str, session: Session | None) -> web.Response:
    """The page shell: navigation, the main element the page's script fills, its script."""
    base = html.escape(request.app[CONFIG].prefix + "/")
    nav = "".join(f'<a href="{p}"{" class=on" if name in (page, page + "s") else ""}>{label}</a>'
                  for p, (name, label) in PAGES.items()) if session else ""
    user = (f'<span class="who">{html.escape(session.role)} · key {html.escape(session.key_id)}</span>'
            '<button id="signout" type="button">Sign out</button>') if session else ""
    if session is None:
        body = (f'{extra}<form method="post" action="login" class="login"><label>API key '
                '<input type="password" name="key" autocomplete="off" required autofocus></label>'
                '<button type="submit">Sign in</button></form>'
                '<p class="hint">Any key with read access (viewer, submitter or admin). It stays on the '
                'dashboard server; your browser keeps only a session cookie.</p>')
        scripts = ""
    else:
        body = ""
        scripts = (f'<script src="static/vendor/chart.umd.min.js"></script>'
                   f'<script type="module" src="static/{page}.js"></script>')
    csrf = f'<meta name="csrf-token" content="{html.escape(session.csrf)}">' if session else ""
    can = (f' data-role="{html.escape(session.role)}" data-key-id="{html.escape(session.key_id)}"'
           f' data-can-cancel="{int(session.can_cancel)}" data-can-rerun="{int(session.can_rerun)}"'
           f' data-can-drain="{int(session.can_drain)}"') if session else ""
    doc = (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><base href="{base}">'
           f'<meta name="viewport" content="width=device-width, initial-scale=1">{csrf}'
           f'<title>{html.escape(title)} · distributed_testing</title><link rel="stylesheet" href="static/dashboard.css">'
           f'</head><body><header><strong>distributed_testing</strong><nav>{nav}</nav>'
           f'<span id="live" class="live">●</span>{user}</header>'
           f'<main id="app" data-page="{page}"{can}{extra if session else ""}><h1>{html.escape(title)}</h1>{body}</main>'
           f'{scripts}</body></html>')
    # the sign-in page says same-origin so that the browser sends its real Origin with the form
    # (under no-referrer a form post carries "Origin: null", which the CSRF check must refuse)
    referrer = "same-origin" if session is None else "no-referrer"
    return web.Response(text=doc, content_type="text/html", headers={"Cache-Control": "no-store",
                        "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'",
                        "X-Frame-Options": "DENY", "Referrer-Policy": referrer})


# ----------------------------------------------------------------- data, events, actions

def _proxy(path: str) -> Handler:
    """A GET on the coordinator's ``path`` (its ``{names}`` filled from the route) with the
    request's query, as the session's key; the coordinator's status and body pass through."""
    async def handler(request: web.Request) -> web.Response:
        target = path.format(**{k: _quote(v) for k, v in request.match_info.items()})
        status, body = await request.app[CLIENT].request("GET", target, request[SESSION].credential,
                                                         params=dict(request.query), client=request.remote)
        return _json(body, status)
    return handler


def _quote(v: str) -> str:
    from urllib.parse import quote

    return quote(v, safe="")


async def data_overview(request: web.Request) -> web.Response:
    """The coordinator's overview plus ``coordinators``: every group member and configured URL
    with its health (``data.coordinators``)."""
    client, credential = request.app[CLIENT], request[SESSION].credential
    status, body = await client.request("GET", "/api/v1/overview", credential, client=request.remote)
    if status == 200:
        body["coordinators"] = await data.coordinators(client, credential, request.remote,
                                                       mounted=not request.app[CONFIG].coordinator_urls)
    return _json(body, status)


async def data_benchmark_models(request: web.Request) -> web.Response:
    """The models that have benchmark results (``data.benchmark_models``), newest first."""
    status, body = await data.benchmark_models(request.app[CLIENT], request[SESSION].credential, request.remote)
    return _json(body, status)


def _action(path: str) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        session = _checked(request)
        target = path.format(**{k: _quote(v) for k, v in request.match_info.items()})
        try:
            body = await request.read()
        except web.RequestPayloadError as exc:  # not what its Content-Encoding says: a 400, the connection ends
            raise unreadable(exc) from exc
        try:
            doc = msgspec.json.decode(body) if body else None
        except msgspec.DecodeError as exc:
            return _json({"error": "ValidationError", "message": f"the body is not JSON: {exc}",
                          "errors": [{"field": "(body)", "error": f"not JSON: {exc}"}]}, 400)
        status, answer = await request.app[CLIENT].request("POST", target, session.credential, json=doc,
                                                           client=request.remote)
        log.info("dashboard action %s by key %s: HTTP %d", target, session.key_id, status)
        return _json(answer, status)
    return handler


async def events(request: web.Request) -> web.StreamResponse:
    """The coordinator's change feed, passed through as it arrives; ``Last-Event-ID`` from the
    browser's reconnect goes along, so nothing is missed across a reconnect. 429 with
    ``Retry-After`` past the session's or its key's stream cap (``sessions``). The stream ends
    when the coordinator ends it (the key revoked, the token expired, a shutdown)."""
    session, sessions = request[SESSION], request.app[SESSIONS]
    if not sessions.open_stream(session):
        return _json({"error": "RateLimited", "message": "too many event streams open for this session or key"},
                     429, {"Retry-After": str(STREAM_RETRY_AFTER_S)})
    try:
        return await _relay_events(request, session)
    finally:
        sessions.close_stream(session)


async def _relay_events(request: web.Request, session: Session) -> web.StreamResponse:
    upstream = await request.app[CLIENT].open_events(session.credential, request.headers.get("Last-Event-ID"),
                                                     client=request.remote)
    streams = request.app[STREAMS]
    streams.add(upstream)
    if request.app[STOPPING].is_set():  # opened while _end_streams ran: ended as those were
        upstream.close()
    try:
        if upstream.status != 200:
            try:
                return _json(await upstream.json(content_type=None), upstream.status)
            except aiohttp.ClientError as exc:
                return _json({"error": "Unavailable", "message": f"the coordinator's answer broke off: {exc}"}, 502)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
        await resp.prepare(request)
        try:
            await _pass_through(request, upstream, resp)
        except ConnectionResetError:  # the browser went away (aiohttp's ClientConnectionResetError is one too)
            pass
        except aiohttp.ClientError as exc:  # upstream ended (or closed by _end_streams); the browser reconnects
            log.info("event stream from the coordinator ended: %s", exc)
        return resp
    finally:
        streams.discard(upstream)
        upstream.release()


async def _pass_through(request: web.Request, upstream: aiohttp.ClientResponse, resp: web.StreamResponse) -> None:
    """Copy ``upstream`` to ``resp`` until either side ends. The browser's side is looked at every
    ``GONE_CHECK_S`` (aiohttp tells a handler nothing when its client goes away; the stream's
    place under the caps would otherwise stay taken until the next keepalive fails to write)."""
    try:
        async with contextlib.aclosing(chunks_while_connected(request, upstream, GONE_CHECK_S)) as chunks:
            async for chunk in chunks:
                await resp.write(chunk)
    except ClientGone:
        return
