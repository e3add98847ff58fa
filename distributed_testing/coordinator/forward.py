"""A standby serves every API request by forwarding it to the leader and streaming the answer back
(bodies, ``?wait`` long polls, the event stream, the dashboard): one address for the whole group
works for every client, ``curl`` and ``requests`` included (they drop ``Authorization`` on a
redirect to another host). Vault, etcd and Consul do the same.

What is forwarded: the method, the path and query, the body, and the headers apart from the hop
ones; the client's own ``Authorization`` goes with it and the leader checks it as if the client
had come straight (a standby grants nothing). The standby adds ``X-DT-Forwarded``: the client's
address, a timestamp and an HMAC over both and the request line, keyed from the group's
token-signing secret (``member_key``; every member holds it, from the database or the shared
``--jwt-secret-file``). The leader believes that address (``client_address``: rate limits and
logs go to the original client) only when the HMAC verifies within ``SKEW_S``; anything else,
a forged header included, counts as the direct peer's address.

While no leader is known, the leader's membership heartbeat is older than ``LEADER_SILENT_S``, or
it does not answer (connect ``client.CONNECT_TIMEOUT_S``, first byte ``client.first_byte_timeout``),
the answer is ``503`` with ``Retry-After: 1`` and the
``not_leader`` body (``leader`` null: ask another member). Worker sessions are not relayed:
a standby still answers their handshake with ``503`` naming the leader (docs/architecture.md,
"High availability", says why).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from ..client import CONNECT_TIMEOUT_S, first_byte_timeout
from .group import MEMBER_STALE_S
from .runtime import RUNTIME, Runtime

log = logging.getLogger(__name__)
HEADER = "X-DT-Forwarded"
SKEW_S = 30.0
EVENTS_PATH = "/api/v1/events"
# A leader the cluster view shows unhealthy (no membership heartbeat, sent every 0.5 s, for this
# long) is not asked: the answer is 503 at once instead of after the first-byte bound (a paused
# leader keeps its lease for a TTL). Not shorter: a leader on a loaded host beats late.
LEADER_SILENT_S = MEMBER_STALE_S
# Hop-by-hop headers (RFC 9110 7.6.1) and those the sending side sets again itself.
_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                  "transfer-encoding", "upgrade", "host", "content-length", "expect", HEADER.lower()})
HTTP: web.AppKey[aiohttp.ClientSession] = web.AppKey("forward_http", aiohttp.ClientSession)


def member_key(jwt_secret: bytes) -> bytes:
    """The members' forwarding key, derived from the group's token-signing secret (never the
    secret itself on the wire or in a MAC that could be replayed as a token)."""
    return hmac.new(jwt_secret, b"dt-member-forwarding-v1", hashlib.sha256).digest()


def _mac(key: bytes, address: str, ts: str, method: str, path_qs: str) -> str:
    return hmac.new(key, f"{address}\n{ts}\n{method}\n{path_qs}".encode(), hashlib.sha256).hexdigest()


def forwarded_value(key: bytes, address: str, method: str, path_qs: str, now: float) -> str:
    ts = f"{now:.3f}"
    return f"{address};{ts};{_mac(key, address, ts, method, path_qs)}"


def client_address(request: web.Request, rt: Runtime, now: float) -> str:
    """The original client's address of a request a member forwarded (a valid ``X-DT-Forwarded``),
    else the direct peer's."""
    return verified_address(rt, request.headers.get(HEADER), request.method, request.path_qs,
                            request.remote or "", now)


def verified_address(rt: Runtime, value: str | None, method: str, path_qs: str, peer: str, now: float) -> str:
    """The address ``value`` (an ``X-DT-Forwarded`` header) vouches for when a member signed it for
    this request within ``SKEW_S``, else ``peer`` (both HTTP layers use it)."""
    if not value or not rt.jwt_secret:
        return peer
    try:
        address, ts, mac = value.rsplit(";", 2)
        fresh = abs(now - float(ts)) <= SKEW_S
    except ValueError:
        return peer
    if not (fresh and hmac.compare_digest(mac, _mac(member_key(rt.jwt_secret), address, ts, method, path_qs))):
        log.warning("ignored an X-DT-Forwarded header from %s that no member signed", peer)
        return peer
    return address


async def http_ctx(app: web.Application) -> AsyncIterator[None]:
    """The forwarding client, owned by the app: kept-alive connections to the leader; bodies pass
    through as they are (no decompression); TLS verified with the system's CAs."""
    app[HTTP] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
    try:
        yield
    finally:
        await app[HTTP].close()


def _unavailable(message: str) -> web.Response:
    return web.json_response({"error": "not_leader", "leader": None, "message": message}, status=503,
                             headers={"Retry-After": "1"})


async def forward(request: web.Request, *, again: bool = False) -> web.StreamResponse:
    """``request`` as the leader answers it, streamed back (module docstring). ``again``: it came
    from a member already; one hop only, so two members with stale views never pass it round."""
    rt = request.app[RUNTIME]
    if again:
        return _unavailable("a member forwarded this request to one that does not lead (a takeover is under way)")
    leader = rt.group.leader_url if rt.group is not None else None
    if not leader or leader.rstrip("/") == (rt.advertise_url or "").rstrip("/"):
        return _unavailable("no coordinator of the group leads now; retry shortly")
    silent = next((m.age_s for m in rt.group.members if m.url.rstrip("/") == leader.rstrip("/")), 0.0) \
        if rt.group is not None else 0.0
    if silent > LEADER_SILENT_S:  # paused or cut off: its lease has not run out yet, but it will not answer
        return _unavailable(f"the leader {leader} has not been seen for {silent:.1f} s; retry shortly")
    headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in _HOP)
    if rt.jwt_secret:
        headers[HEADER] = forwarded_value(member_key(rt.jwt_secret), request.remote or "", request.method,
                                          request.path_qs, time.time())
    streaming = request.path.endswith(EVENTS_PATH)
    read_s = None if streaming else first_byte_timeout(request.path_qs)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=read_s)
    body = await request.read() if request.body_exists else None
    try:
        upstream = await request.app[HTTP].request(request.method, leader.rstrip("/") + request.path_qs,
                                                   headers=headers, data=body, allow_redirects=False, timeout=timeout)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        log.warning("forwarding %s %s to the leader %s failed: %s", request.method, request.path, leader, exc)
        return _unavailable(f"the leader {leader} did not answer this member: {type(exc).__name__}")
    async with upstream:
        out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for k, v in upstream.headers.items():
            if k.lower() not in _HOP or k.lower() == "content-length":
                out.headers.add(k, v)
        await out.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                await out.write(chunk)
        except (aiohttp.ClientError, TimeoutError) as exc:  # the head is sent: all we can do is cut the answer
            log.warning("the leader's answer to %s %s broke off: %s", request.method, request.path, exc)
            return out
        await out.write_eof()
    return out
