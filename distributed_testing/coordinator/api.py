"""REST API under ``/api/v1``. One middleware authenticates and maps domain errors to JSON.

Every route declares the permission it needs in ``ROUTES``; the middleware checks it from the
request's headers before the handler runs (and so before any body is read), so a handler never
forgets. A client address with too many failed authentications is refused first (429, see
``admission.AuthThrottle``), and a worker handshake beyond ``--max-worker-sessions`` gets 503.
Errors: 400 ValidationError (``errors`` lists each bad field; also a body that cannot be decoded
per its ``Content-Encoding``), 401 AuthError, 403 PermissionDenied, 404 NotFound, 409 Conflict,
429 RateLimited, 503 Unavailable; aiohttp's own errors (no such route, wrong method, body over the
size limit) get the same JSON shape.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec
from aiohttp import web

from ..errors import (
    AuthError,
    DTError,
    PermissionDenied,
    RateLimited,
    Unavailable,
    ValidationError,
    http_body,
    http_headers,
    http_status,
)
from ..process.httpstream import end_after_broken_body
from ..security import auth as sa
from ..security import keys as sk
from ..security import roles, throttle
from ..tasks import spec as specs
from . import admission, bundles_api, events, forward, keys_api, logs_api, openapi, runs_api, views
from .core.rows import ResultRow
from .group import NotLeader
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .rest import AUTHENTICATED, PRINCIPAL, json_body, json_response, positive_seconds, read_body
from .runtime import RUNTIME, Runtime
from .store.base import ResultQuery
from .store.filters import parse_query
from .submission import MAX_WAIT_S, submit

log = logging.getLogger(__name__)
EVENTS_KEEPALIVE_S = 15.0
INT64_MAX = 2**63 - 1
DEFAULT_DRAIN_DEADLINE_S = 30.0  # as the worker's own --drain-timeout
MAX_DRAIN_DEADLINE_S = 86400.0
WORKER_ROUTE = "/ws/worker"
METRICS_ROUTE = "/metrics"
AUTH_THROTTLE = web.AppKey("auth_throttle", admission.AuthThrottle)
LIMITS = web.AppKey("connection_limits", admission.ConnectionLimits)
# The secret the dashboard mounted in this process shows to name the browser it speaks for
# (security/throttle.py); random per process, never leaves it.
PROXY_SECRET = web.AppKey("proxy_secret", str)
_failure_log = admission.RateLimitedLog(log, logging.WARNING)


def error_parts(exc: DTError, where: str) -> tuple[int, dict[str, Any], dict[str, str] | None]:
    """A domain error as (status, JSON body, extra headers) (``errors.HTTP_STATUS``); ``where``
    names the request in the log when the error is unexpected (500). A StoreError is 503: the
    write failed and the coordinator is stopping (coordinator/supervisor.py). ``NotLeader`` (a
    leader that lost the lease mid-request; a standby forwards instead, ``forward.py``): 503 with
    ``Retry-After: 1`` and ``{"error": "not_leader", "leader": URL or null}``, never a redirect
    (most clients drop ``Authorization`` on one; docs/security.md, "Redirects")."""
    if isinstance(exc, NotLeader):
        return not_leader_parts(exc)
    status = http_status(exc)
    if status == 500:
        log.error("unexpected domain error on %s", where, exc_info=exc)
    return status, http_body(exc), http_headers(exc, status)


def not_leader_parts(exc: NotLeader) -> tuple[int, dict[str, Any], dict[str, str]]:
    """A member's answer when it does not lead (see ``error_parts``)."""
    body = {"error": "not_leader", "leader": exc.leader, "message": str(exc), "unhealthy": exc.unhealthy}
    return 503, body, {"Retry-After": "1"}


def authorize(rt: Runtime, authorization: str, perm: str) -> sa.Principal:
    """The principal behind an ``Authorization`` header value, if it holds ``perm`` (or any
    valid credential for ``AUTHENTICATED``); AuthError or PermissionDenied otherwise."""
    return _permit(rt.authenticate(sa.parse_authorization_header(authorization)), perm)


def vouch(rt: Runtime, authorization: str, perm: str) -> sa.Principal | None:
    """A standby's ``authorize`` before it forwards a request (the leader authorizes it again):
    None when the credential names a key this member has not heard of yet (one made at the
    leader within the last second reaches it by ``LISTEN dt_keys``), which the leader then
    decides; a missing, malformed, wrong, expired or revoked credential or a lacking permission
    is refused here."""
    unknown = False

    def lookup(key_id: str) -> sk.KeyRecord | None:
        nonlocal unknown
        record = rt.lookup_key(key_id)
        unknown = record is None
        return record

    try:
        principal = sa.authenticate(sa.parse_authorization_header(authorization), lookup, rt.jwt_secret, rt.clock())
    except AuthError:
        if unknown:
            return None
        raise
    return _permit(principal, perm)


def _permit(principal: sa.Principal, perm: str) -> sa.Principal:
    if perm != AUTHENTICATED:
        roles.require(principal.role, roles.Permission(perm))
    if perm == roles.Permission.BUNDLES_UPLOAD:
        bundles_api.require_allow_code(principal)
    return principal


def check_address(app: web.Application, peer: str | None) -> None:
    """RateLimited while ``peer`` is refused for failed authentications."""
    wait = app[AUTH_THROTTLE].retry_after(admission.address_key(peer or ""), time.monotonic())
    if wait is not None:
        app[RUNTIME].metrics.auth_failures.labels("throttled").inc()
        raise RateLimited(f"too many failed authentications from this address; retry in {math.ceil(wait)} s", wait)


def note_failure(app: web.Application, peer: str | None, authorization: str, exc: AuthError) -> None:
    """Count (``dt_auth_failures_total``) and log a refused credential from ``peer``; only a
    wrong credential counts towards the address's throttle (a request without one, or one
    lacking the route's permission, is not a guess)."""
    reason = "forbidden" if isinstance(exc, PermissionDenied) else "invalid" if authorization.strip() else "missing"
    app[RUNTIME].metrics.auth_failures.labels(reason).inc()
    if reason != "invalid":
        return
    throttle, now = app[AUTH_THROTTLE], time.monotonic()
    if throttle.failed(admission.address_key(peer or ""), now):
        log.warning("%s: %d failed authentications within %gs; refusing it (429) until they age out",
                    peer, throttle.limit, throttle.window_s)
    else:
        _failure_log(now, "failed authentication from %s: %s", peer, exc)


def client_address(request: web.Request) -> str | None:
    """The address failed authentications count against: the peer's, or the browser's that the
    dashboard mounted in this process names (``throttle.CLIENT_HEADER``) when it shows this
    process's proxy secret; one guesser signing in through the dashboard is then refused alone,
    not every client on the coordinator's host."""
    secret = request.app.get(PROXY_SECRET)
    shown = request.headers.get(throttle.PROXY_HEADER)
    if secret and shown and hmac.compare_digest(shown.encode(), secret.encode()):
        return request.headers.get(throttle.CLIENT_HEADER) or request.remote
    return request.remote


def check_worker_capacity(app: web.Application) -> None:
    """Unavailable when as many worker sessions as ``--max-worker-sessions`` are open."""
    cap = app[LIMITS].max_worker_sessions
    if len(app[RUNTIME].sessions) >= cap:
        _failure_log(time.monotonic(), "refused a worker handshake: %d worker sessions open (--max-worker-sessions)", cap)
        raise Unavailable(f"the coordinator serves at most {cap} worker sessions (--max-worker-sessions)", 5.0)


@web.middleware
async def error_middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    rt = request.app[RUNTIME]
    forwarded = forward.HEADER in request.headers
    if forwarded:  # a member forwarded it: the original client's address counts
        request = request.clone(remote=forward.client_address(request, rt, time.time()))
    try:
        forwarding = _forwards(request)
        undecided = _admit(request, forwarding)
        if forwarding:  # the leader authorizes it again
            return await forward.forward(request, again=forwarded, expect=undecided)
        resp = await handler(request)
    except DTError as exc:
        resp = _refusal(request, exc)
    except web.HTTPException as exc:  # aiohttp's own: unknown route, wrong method, body too large
        if exc.status < 400:
            raise
        resp = _http_error(exc)
    return end_after_broken_body(request, resp)


def _forwards(request: web.Request) -> bool:
    """Whether this member forwards ``request`` to the leader (it is a standby; forward.py)."""
    return not request.app[RUNTIME].leading() and _route(request) not in STANDBY_ROUTES and \
        request.path != WORKER_ROUTE


def _admit(request: web.Request, forwarding: bool) -> bool:
    """Before the handler, or a standby's forwarding, from the head alone: the address's
    throttle, the route's permission (``request[PRINCIPAL]``), and for the worker endpoint the
    session cap (a standby: 503 naming the leader). A standby checks with the group's keys and
    secret (``vouch``), so a refused request is answered before its body is read, and forwards
    the rest; True when the leader must decide its credential (a key the standby has not heard
    of: the leader is asked with ``Expect: 100-continue``, so it refuses before any body)."""
    route = _route(request)
    rt = request.app[RUNTIME]
    if not rt.leading() and route == WORKER_ROUTE:
        raise rt.not_leader(request.path_qs)
    perm = PERMISSIONS.get((request.method, route))
    if perm is not None or route == WORKER_ROUTE:
        check_address(request.app, client_address(request))
    if perm is not None and forwarding:
        return vouch(rt, request.headers.get("Authorization", ""), perm) is None
    if perm is not None:
        request[PRINCIPAL] = authorize(rt, request.headers.get("Authorization", ""), perm)
    elif route == WORKER_ROUTE:
        check_worker_capacity(request.app)
    return False


def _route(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return resource.canonical if resource else ""


def _refusal(request: web.Request, exc: DTError) -> web.Response:
    if isinstance(exc, AuthError):
        note_failure(request.app, client_address(request), request.headers.get("Authorization", ""), exc)
    status, body, headers = error_parts(exc, f"{request.method} {request.path}")
    return json_response(body, status=status, headers=headers)


async def expect_continue(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue``: the client is told to send its body only when its address and
    credentials pass; otherwise it gets the refusal at once (aiohttp's default would invite the
    body before the middleware runs). A standby invites it too, and its middleware forwards the
    request (without the ``Expect``) to the leader."""
    if request.headers.get("Expect", "").lower() != "100-continue" or request.version != (1, 1):
        raise web.HTTPExpectationFailed(text=f"Unknown Expect: {request.headers.get('Expect', '')}")
    try:
        _admit(request, _forwards(request))  # a standby too: what it invites, its middleware forwards
    except DTError as exc:
        resp = _refusal(request, exc)
        resp.force_close()  # the client may send its body anyway: do not read it as a next request
        return resp
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # as aiohttp's default: the answer's own size starts after this
    return None


def _http_error(exc: web.HTTPException) -> web.Response:
    """aiohttp's error as the API's JSON error body, e.g. ``{"error": "MethodNotAllowed", ...}``."""
    name = type(exc).__name__.removeprefix("HTTP") or "HTTPError"
    message = (exc.text or exc.reason or name).strip().removeprefix(f"{exc.status}: ")
    kept = {k: v for k, v in exc.headers.items() if k.lower() not in ("content-type", "content-length")}
    return json_response({"error": name, "message": message}, status=exc.status, headers=kept)


def _rt(request: web.Request) -> Runtime:
    return request.app[RUNTIME]


# ------------------------------------------------------------------- routes


async def healthz(request: web.Request) -> web.Response:
    rt = _rt(request)
    connected = sum(1 for w in rt.state.workers.values() if w.connected)
    by_state = {k: v for k, v in rt.state.counts.items() if v}
    return json_response({"status": "ok", "workers": connected, "tasks": sum(by_state.values()),
                          "tasks_by_state": by_state})


async def health(request: web.Request) -> web.Response:
    """Whether this coordinator answers, and its part in the group: ``role`` is ``leader``,
    ``standby`` or ``single`` (not in a group); ``leader`` is the URL clients should use. No
    credential; every member serves it."""
    rt = _rt(request)
    g = rt.group
    if g is None:
        return json_response({"status": "ok", "role": "single", "leader": rt.advertise_url, "epoch": None,
                              "member_id": None})
    return json_response({"status": "ok", "role": "leader" if g.leading else "standby", "leader": g.leader_url,
                          "epoch": g.epoch, "member_id": g.member_id})


async def cluster(request: web.Request) -> web.Response:
    """The group's members (URL, role, epoch, seconds since its last heartbeat, healthy) and
    ``leader``, the URL clients should use (null while none leads). Any valid credential, a
    worker's included: workers learn the group from it. A lone coordinator lists itself."""
    rt = _rt(request)
    if rt.group is None:
        me = {"member_id": None, "url": rt.advertise_url, "role": "leader", "epoch": None, "last_seen_age_s": 0.0,
              "healthy": True, "started_at": None}
        return json_response({"leader": rt.advertise_url, "epoch": None, "self": None, "members": [me]})
    return json_response(rt.group.view())


async def submit_tasks(request: web.Request) -> web.Response:
    """Accept a task or a list of them. With ``?wait=S`` the answer waits up to S seconds for every
    one of them to finish and carries each one's final ``state`` and ``outcome`` (submit and
    result in one round trip); the tasks are accepted whether or not they finish in time."""
    wait = float_param(request.query, "wait", 0.0, 0.0, MAX_WAIT_S)
    status, body = await submit(_rt(request), request[PRINCIPAL], await read_body(request), wait)
    return json_response(body, status=status)


async def get_task(request: web.Request) -> web.Response:
    """One task, from memory or else from the store.

    An outcome is shown only once it is on disk, so whatever this shows, the task list and a
    restarted coordinator show too."""
    rt = _rt(request)
    wait = float_param(request.query, "wait", 0.0, 0.0, MAX_WAIT_S)
    t = await views.find_task(rt.state, rt.store, request.match_info["task_id"])
    if wait > 0:
        await rt.wait_finished([t.task_id], wait)
    (t,) = await rt.settled([t.task_id], MAX_WAIT_S)  # at once for an outcome on disk; else once it is
    view = views.task_view(rt.state, t)
    if t.outcome is not None and request.query.get("result", "1") != "0":
        rows = await rt.store.query_results(ResultQuery(task_id=t.task_id, limit=1000))
        mine = [r for r in rows if r.attempt == t.outcome.get("attempt")]
        view["result"] = result_view(mine[0]) if mine else None
    return json_response(view)


async def list_tasks(request: web.Request) -> web.Response:
    """One page of tasks, newest first, filtered and cut by the store.

    Filters and paging of ``TaskQuery`` (state, type, worker_id, tag, submitted_by, since, until,
    limit, offset); ``total`` counts every match."""
    rt = _rt(request)
    page, total = await views.task_page(rt.state, rt.store, views.parse_filter(request.query))
    return json_response({"tasks": page, "total": total})


async def overview(request: web.Request) -> web.Response:
    """Workers and tasks by state, the last hour's per-minute series, the latest failures."""
    rt = _rt(request)
    return json_response(views.overview(rt.state, rt.activity, rt.clock()))


async def stream_events(request: web.Request) -> web.StreamResponse:
    """The change feed as server-sent events (``coordinator/events.py``); resumes after the id in
    ``Last-Event-ID``. A comment line every ``EVENTS_KEEPALIVE_S`` keeps proxies from closing it.
    The stream ends when its credential stops being valid: at once when its key is revoked
    (``Runtime.revoke_key``), at the token's or the key's expiry otherwise; a reconnect then gets 401."""
    rt = _rt(request)
    hub, principal = rt.events, request[PRINCIPAL]
    sub = hub.subscribe(request.headers.get("Last-Event-ID"), principal.key_id)
    try:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                                           "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        await resp.write(b"retry: 500\n: %s\n\n" % hub.last_id.encode())
        while True:
            left = _credential_left(rt, principal)
            if left <= 0:
                return resp
            try:
                async with asyncio.timeout(min(EVENTS_KEEPALIVE_S, left)):
                    ev = await sub.queue.get()
            except TimeoutError:
                if _credential_left(rt, principal) > 0:
                    await resp.write(b": keepalive\n\n")
                continue
            if ev is None:
                return resp
            await resp.write(events.sse_frame(ev))
    except ConnectionResetError:  # the client went away: its stream ends here
        return web.Response(status=499)
    finally:
        hub.unsubscribe(sub)


def _credential_left(rt: Runtime, principal: sa.Principal) -> float:
    """Seconds the credential behind ``principal`` stays valid (inf: no expiry; 0: no longer
    valid, its key revoked or gone)."""
    rec = rt.keys.get(principal.key_id)
    if rec is None or rec.revoked_at is not None:
        return 0.0
    ends = [t for t in (principal.token_exp, rec.expires_at) if t is not None]
    return max(0.0, min(ends) - rt.clock()) if ends else math.inf


async def cancel_task(request: web.Request) -> web.Response:
    rt = _rt(request)
    task_id = request.match_info["task_id"]
    principal = request[PRINCIPAL]
    owner = (await views.find_task(rt.state, rt.store, task_id)).submitted_by  # no await after this
    if principal.role != roles.Role.ADMIN and owner not in (None, principal.key_id):
        raise PermissionDenied(f"task {task_id} was submitted by another key; only it or an admin may cancel it")
    await rt.execute(rt.state.cancel(task_id, rt.clock(), f"cancelled by {principal.name}"))
    return json_response(views.task_view(rt.state, await views.find_task(rt.state, rt.store, task_id)))


async def list_workers(request: web.Request) -> web.Response:
    """One page of the known workers, in worker id order.

    ``limit`` (1 to 10000, default 10000) from ``offset``; ``state`` (ready, constrained,
    draining, disconnected) lists only workers in it; ``total`` counts all that match."""
    rt = _rt(request)
    limit, offset = views.parse_page(request.query)
    page, total = views.worker_page(rt.state, limit, offset, request.query.get("state"))
    return json_response({"workers": page, "total": total})


async def drain_worker(request: web.Request) -> web.Response:
    """Body ``{"deadline_s": S, "reason": TEXT}`` (both optional). 202 once the worker is told
    (it takes nothing new from now on); 404 unknown worker, 409 not connected."""
    rt = _rt(request)
    worker_id = request.match_info["worker_id"]
    body = await json_body(request)
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise ValidationError([{"field": "(body)", "error": "expected an object with deadline_s and reason"}])
    errors = [{"field": k, "error": "unknown field"} for k in sorted(set(body) - {"deadline_s", "reason"})]
    deadline = DEFAULT_DRAIN_DEADLINE_S
    try:
        deadline = positive_seconds(body.get("deadline_s", deadline), "deadline_s")
    except ValidationError as exc:
        errors += exc.errors
    if deadline > MAX_DRAIN_DEADLINE_S:
        errors.append({"field": "deadline_s", "error": f"must be at most {MAX_DRAIN_DEADLINE_S:g} seconds"})
    reason = body.get("reason", f"drain requested by {request[PRINCIPAL].name}")
    if not isinstance(reason, str) or not 0 < len(reason) <= 1000:
        errors.append({"field": "reason", "error": "must be a string of 1 to 1000 characters"})
    if errors:
        raise ValidationError(errors)
    await rt.execute(rt.state.drain_worker(worker_id, reason, deadline, rt.clock()))
    log.info("asked worker %s to drain within %gs: %s", worker_id, deadline, reason)
    return json_response({"worker_id": worker_id, "state": "draining", "deadline_s": deadline, "reason": reason},
                         status=202)


async def release_worker(request: web.Request) -> web.Response:
    """Free a disconnected worker's id from the key it is bound to (that key was revoked or
    replaced): the next worker key to register the id takes it. No body. 200; 404 unknown
    worker, 409 while it is connected."""
    rt = _rt(request)
    worker_id = request.match_info["worker_id"]
    if (await json_body(request)) not in (None, {}):
        raise ValidationError([{"field": "(body)", "error": "takes no body (or an empty object)"}])
    await rt.execute(rt.state.release_worker(worker_id, rt.clock()))
    log.warning("worker id %s released from its key by %s", worker_id, request[PRINCIPAL].name)
    return json_response({"worker_id": worker_id, "released": True})


def result_view(r: ResultRow) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(r)
    out.pop("rec", None)
    return out


async def list_results(request: web.Request) -> web.Response:
    rt = _rt(request)
    query = parse_query(request.query, ResultQuery)
    _check_int64(query)
    rows = await rt.store.query_results(query)
    return json_response({"results": [result_view(r) for r in rows]})


def _check_int64(query: ResultQuery) -> None:
    """Stores compare these as 64-bit integers: refuse what does not fit (and a negative page)."""
    errors = [{"field": name, "error": f"must be between {lo} and {INT64_MAX}"}
              for name, lo in (("limit", 0), ("offset", 0), ("batch_size", -INT64_MAX - 1))
              if (v := getattr(query, name)) is not None and not lo <= v <= INT64_MAX]
    if not errors and query.offset + query.limit > INT64_MAX:
        errors.append({"field": "offset", "error": f"offset + limit must not exceed {INT64_MAX}"})
    if errors:
        raise ValidationError(errors)


async def task_schema(request: web.Request) -> web.Response:
    """The JSON Schema (draft 2020-12) of a task document, as POST /api/v1/tasks checks it."""
    return json_response(specs.task_json_schema())


async def metrics(request: web.Request) -> web.Response:
    """This coordinator's metrics in the Prometheus text format (docs/operations.md, "Metrics")."""
    return web.Response(body=_rt(request).metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE})


async def openapi_json(request: web.Request) -> web.Response:
    """This API's OpenAPI 3.1 description, generated from the routes the coordinator serves."""
    return json_response(request.app[OPENAPI])


def float_param(query: Mapping[str, str], name: str, default: float, lo: float, hi: float) -> float:
    """Query parameter ``name`` as a number in [lo, hi] (``default`` when absent); ValidationError
    naming it otherwise."""
    raw = query.get(name)
    if raw is None:
        return default
    try:
        v = float(raw)
    except ValueError as exc:
        raise ValidationError([{"field": name, "error": f"not a number: {raw!r}"}]) from exc
    if not lo <= v <= hi:
        raise ValidationError([{"field": name, "error": f"must be between {lo:g} and {hi:g}"}])
    return v


ROUTES: list[tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]], str | None]] = [
    ("GET", "/healthz", healthz, None),
    ("GET", "/api/v1/health", health, None),
    ("GET", "/api/v1/cluster", cluster, AUTHENTICATED),
    *keys_api.ROUTES,
    ("POST", "/api/v1/tasks", submit_tasks, "tasks:submit"),
    ("GET", "/api/v1/tasks", list_tasks, "tasks:read"),
    ("GET", "/api/v1/tasks/{task_id}", get_task, "tasks:read"),
    *logs_api.ROUTES,
    ("GET", "/api/v1/overview", overview, "tasks:read"),
    ("GET", "/api/v1/events", stream_events, "tasks:read"),
    ("POST", "/api/v1/tasks/{task_id}/cancel", cancel_task, "tasks:cancel"),
    *runs_api.ROUTES,
    ("GET", "/api/v1/workers", list_workers, "workers:read"),
    ("POST", "/api/v1/workers/{worker_id}/drain", drain_worker, "workers:manage"),
    ("POST", "/api/v1/workers/{worker_id}/release", release_worker, "workers:manage"),
    ("GET", "/api/v1/results", list_results, "results:read"),
    ("GET", "/api/v1/schema/task", task_schema, "schema:read"),
    ("GET", "/api/v1/openapi.json", openapi_json, "schema:read"),
    ("GET", METRICS_ROUTE, metrics, "metrics:read"),
    *bundles_api.ROUTES,
]
PERMISSIONS: dict[tuple[str, str], str] = {(meth, path): perm for meth, path, _, perm in ROUTES if perm}
# What a standby answers itself; it forwards every other request to the leader (forward.py: 503
# with Retry-After while none answers), except the worker endpoint: 503 naming the leader (workers
# connect to the leader themselves; docs/architecture.md, "High availability").
STANDBY_ROUTES = frozenset({"/api/v1/health", "/api/v1/cluster"})
# Not in ROUTES (ws.py checks it itself, after the session cap), but what the route needs all the same.
WORKER_PERMISSION = "worker:connect"
OPENAPI: web.AppKey[dict[str, Any]] = web.AppKey("openapi")


def add_routes(app: web.Application, *, metrics_route: bool = True) -> None:
    """The table's routes; ``GET /metrics`` only with ``metrics_route`` (``--metrics key``)."""
    for method, path, handler, perm in ROUTES:
        if path == METRICS_ROUTE and not metrics_route:
            continue
        app.router.add_route(method, path, handler, expect_handler=expect_continue if perm else None)


def route_entries(app: web.Application) -> list[openapi.Entry]:
    """(method, path, handler, permission) of every route ``app``'s router serves."""
    out: list[openapi.Entry] = []
    for route in app.router.routes():
        path = route.resource.canonical if route.resource else ""
        perm = WORKER_PERMISSION if path == WORKER_ROUTE else PERMISSIONS.get((route.method, path))
        out.append((route.method, path, route.handler, perm))
    return out


def publish_openapi(app: web.Application) -> None:
    """Describe ``app``'s routes (call once every route is added): ``GET /api/v1/openapi.json``."""
    app[OPENAPI] = openapi.document(route_entries(app))


def openapi_text(app: web.Application) -> str:
    """``app``'s OpenAPI document as the indented JSON text published in docs/openapi.json."""
    return json.dumps(app[OPENAPI], indent=2) + "\n"
