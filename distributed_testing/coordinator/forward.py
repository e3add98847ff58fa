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

Two ways through a standby (``Forwarder``):

- ``POST /api/v1/tasks`` as the lean front takes it (``fast_http.py``; the hot route), to a leader
  on plain http: ``Forwarder.relay`` sends the request's own bytes on a kept-alive connection
  of its pool (the head less its hop headers, plus ``Host`` and ``X-DT-Forwarded``; the body as
  it came, never decoded) and hands the leader's answer back as bytes (its ``Connection``
  headers replaced by the client's own). No aiohttp server or client on the way: the relay costs
  the standby a fraction of what they did (benchmarks/RESULTS.md, "Forwarding through a
  standby"). An idle pooled connection is used for at most ``IDLE_S``, well within the leader's
  ``--header-timeout``, so the leader never closes one under a request.
- Every other request (and that one to an https leader): ``forward`` with aiohttp's client,
  streaming the answer as it comes.

While no leader is known, the leader's membership heartbeat is older than ``LEADER_SILENT_S``, or
it does not answer (connect ``client.CONNECT_TIMEOUT_S``, first byte ``client.first_byte_timeout``),
the answer is ``503`` with ``Retry-After: 1`` and the ``not_leader`` body (``leader`` null: ask
another member), which lists the members this one sees silent (``unhealthy``): a client tries
them last (``client.ApiClient``). A request already on its way is given up the same way as soon
as its leader falls silent or another member takes the lease (checked every ``WATCH_S``): a
client then waits about as long as the leader's silence takes to notice, not a whole first-byte
bound, for a paused or cut-off leader. Worker sessions are not relayed: a standby still answers
their handshake with ``503`` naming the leader (docs/architecture.md, "High availability", says
why).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import logging
import time
import urllib.parse
from collections.abc import AsyncIterator
from http import HTTPStatus

import aiohttp
import msgspec
from aiohttp import web
from multidict import CIMultiDict

from ..client import CONNECT_TIMEOUT_S, canonical, first_byte_timeout
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
WATCH_S = 0.25  # how often requests on their way are checked against their leader's health
IDLE_S = 4.0  # a pooled connection idle longer is closed rather than used (below --header-timeout)
MAX_ANSWER_HEAD = 65536
# Hop-by-hop headers (RFC 9110 7.6.1) and those the sending side sets again itself.
_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                  "transfer-encoding", "upgrade", "host", "content-length", "expect", HEADER.lower()})
# What the relay drops from a request head the lean front took (it has no Transfer-Encoding,
# Expect or Upgrade; its Content-Length and body pass as they are).
_RELAY_DROP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
                         b"trailer", b"host", HEADER.lower().encode()})
_ANSWER_DROP = frozenset({b"connection", b"keep-alive"})


@functools.lru_cache(maxsize=4)
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


class Unavailable(Exception):
    """The leader cannot be asked now (the ``message`` says why): answered 503."""


def leader_for(rt: Runtime, again: bool) -> str:
    """The leader a request should go to; ``Unavailable`` when there is none to ask. ``again``:
    it came from a member already; one hop only, so two members with stale views never pass it round."""
    if again:
        raise Unavailable("a member forwarded this request to one that does not lead (a takeover is under way)")
    leader = rt.group.leader_url if rt.group is not None else None
    if not leader or leader.rstrip("/") == (rt.advertise_url or "").rstrip("/"):
        raise Unavailable("no coordinator of the group leads now; retry shortly")
    why = gone(rt, leader)
    if why is not None:
        raise Unavailable(why)
    return leader


def gone(rt: Runtime, leader: str) -> str | None:
    """Why a request should not wait for ``leader`` any more (None: it may): it is silent
    (paused, cut off, stuck) or no longer the one the lease names."""
    if rt.group is None:
        return None
    now = rt.group.leader_url
    if now is None or canonical(now) != canonical(leader):
        return f"the leader {leader} no longer leads; retry shortly"
    # the freshest row at that URL: a member restarted there has a new id, and its old row lingers
    silent = min((m.age_s for m in rt.group.members if canonical(m.url) == canonical(leader)), default=0.0)
    if silent > LEADER_SILENT_S:  # paused or cut off: its lease has not run out yet, but it will not answer
        return f"the leader {leader} has not been seen for {silent:.1f} s; retry shortly"
    return None


def unavailable_body(rt: Runtime, message: str) -> bytes:
    """The 503 ``not_leader`` body: no leader to name, and the members this one sees silent."""
    unhealthy = rt.group.silent_urls() if rt.group is not None else []
    return msgspec.json.encode({"error": "not_leader", "leader": None, "message": message, "unhealthy": unhealthy})


class _Watched:
    """A request on its way to ``leader``; ``why`` is set when the watch gave up on it."""

    __slots__ = ("leader", "scope", "streaming", "why")

    def __init__(self, leader: str, streaming: bool = False) -> None:
        self.leader = leader
        self.scope: asyncio.Timeout | None = None
        self.streaming = streaming  # an event stream: it ends only when someone ends it
        self.why: str | None = None


class Forwarder:
    """A member's forwarding to the leader: aiohttp's client (every route, streamed), a pool of
    raw kept-alive connections (``relay``), and the watch over requests on their way."""

    def __init__(self, app: web.Application) -> None:
        self._app = app  # its runtime is set up after this (server._member_ctx)
        # bodies pass through as they are (no decompression); TLS verified with the system's CAs
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        self._idle: dict[str, list[tuple[float, asyncio.StreamReader, asyncio.StreamWriter]]] = {}
        self._waiting: set[_Watched] = set()
        self._watch = asyncio.get_running_loop().create_task(self._watch_loop(), name="forward-watch")

    async def close(self) -> None:
        self._watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._watch
        for conns in self._idle.values():
            for _, _, writer in conns:
                writer.transport.abort()
        self._idle.clear()
        await self.http.close()

    @property
    def rt(self) -> Runtime:
        return self._app[RUNTIME]

    def watch(self, leader: str, *, streaming: bool = False) -> _Watched:
        """Watch a request on its way to ``leader``: once it is ``gone``, the request's scope
        (``asyncio.timeout`` entered as ``scope``) ends in TimeoutError and ``why`` says why.
        ``unwatch`` when it is done."""
        w = _Watched(leader, streaming)
        self._waiting.add(w)
        return w

    def end_streams(self, why: str) -> None:
        """End every event stream being forwarded now (this member is stopping), as the leader
        ends its own at a stop: the HTTP server's shutdown would otherwise wait for each, up to
        its timeout while its client stays, or until the next keepalive finds the client gone."""
        self._end([w for w in self._waiting if w.streaming], why)

    def _end(self, watched: list[_Watched], why: str) -> None:
        loop = asyncio.get_running_loop()
        for w in watched:
            if w.scope is not None:
                self._waiting.discard(w)
                w.why = why
                with contextlib.suppress(RuntimeError):  # its scope ended meanwhile
                    w.scope.reschedule(loop.time())

    def unwatch(self, w: _Watched) -> None:
        self._waiting.discard(w)

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            for w in list(self._waiting):
                why = gone(self.rt, w.leader)
                if why is not None:
                    self._end([w], why)

    # ------------------------------------------------------------ the raw relay (the lean front's route)

    @staticmethod
    def relays_to(rt: Runtime) -> bool:
        """Whether ``relay`` takes a request now: no leader to ask (it answers 503 itself), or one
        on plain http (https goes through aiohttp's client, which does TLS)."""
        leader = rt.group.leader_url if rt.group is not None else None
        return leader is None or leader.startswith("http://")

    async def relay(self, head: bytes, body: bytes, target: str, peer: str, *, close: bool, again: bool) -> bytes:
        """The answer, as bytes for the client at ``peer``, to the lean front's ``POST`` whose
        head (up to its blank line, without it) is ``head`` and whose request target is
        ``target``; ``close``: the client asked to close; ``again``: it came from a member."""
        rt = self.rt
        try:
            leader = leader_for(rt, again)
        except Unavailable as exc:
            return _answer(503, unavailable_body(rt, str(exc)), close, b"Retry-After: 1\r\n")
        parts = urllib.parse.urlsplit(leader)
        lines = head.split(b"\r\n")
        out = [lines[0]]
        out += [line for line in lines[1:] if line.partition(b":")[0].strip().lower() not in _RELAY_DROP]
        out.append(b"Host: " + parts.netloc.encode())
        if rt.jwt_secret:
            out.append(b"%s: %s" % (HEADER.encode(), forwarded_value(member_key(rt.jwt_secret), peer, "POST", target,
                                                                      time.time()).encode()))
        request = b"\r\n".join(out) + b"\r\n\r\n" + body
        writer: asyncio.StreamWriter | None = None
        w = self.watch(leader)
        try:
            async with asyncio.timeout(first_byte_timeout(target)) as w.scope:
                reader, writer = await self._connection(parts.netloc)
                writer.write(request)
                answer_head = await reader.readuntil(b"\r\n\r\n")
                length, keep = _answer_framing(answer_head)
                answer_body = await reader.readexactly(length)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            if writer is not None:
                writer.transport.abort()
            why = w.why or f"the leader {leader} did not answer this member: {type(exc).__name__}"
            log.warning("forwarding POST %s to the leader %s failed: %s", target, leader, why)
            return _answer(503, unavailable_body(rt, why), close, b"Retry-After: 1\r\n")
        finally:
            self.unwatch(w)
        if keep:
            self._idle.setdefault(parts.netloc, []).append((time.monotonic(), reader, writer))
        else:
            writer.transport.abort()
        lines = answer_head[:-4].split(b"\r\n")
        kept = [line for line in lines[1:] if line.partition(b":")[0].strip().lower() not in _ANSWER_DROP]
        if close:
            kept.append(b"Connection: close")
        return b"\r\n".join([lines[0], *kept]) + b"\r\n\r\n" + answer_body

    async def _connection(self, netloc: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A kept-alive connection to ``netloc`` idle for under ``IDLE_S``, else a new one."""
        idle = self._idle.get(netloc)
        now = time.monotonic()
        while idle:
            since, reader, writer = idle.pop()
            if now - since < IDLE_S and not reader.at_eof() and not writer.transport.is_closing():
                return reader, writer
            writer.transport.abort()
        host, _, port = netloc.rpartition(":")
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host.strip("[]"), int(port or 80), limit=MAX_ANSWER_HEAD)
        return reader, writer


def _answer_framing(head: bytes) -> tuple[int, bool]:
    """``(body length, whether the connection may be used again)`` of an answer head; a
    ValueError for a framing the relay does not take (no Content-Length: the lean front and
    aiohttp always send one for this route)."""
    lines = head[:-4].split(b"\r\n")
    version = lines[0].partition(b" ")[0]
    length: int | None = None
    keep = version == b"HTTP/1.1"
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value.strip())
        elif name == b"transfer-encoding":
            raise ValueError("a chunked answer")
        elif name == b"connection" and b"close" in value.lower():
            keep = False
    if length is None:
        raise ValueError("an answer without Content-Length")
    return length, keep


def _answer(status: int, body: bytes, close: bool, extra: bytes = b"") -> bytes:
    head = b"HTTP/1.1 %d %s\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: %d\r\n" % (
        status, HTTPStatus(status).phrase.encode(), len(body))
    return head + extra + (b"Connection: close\r\n" if close else b"") + b"\r\n" + body


FORWARDER: web.AppKey[Forwarder] = web.AppKey("forwarder", Forwarder)


async def http_ctx(app: web.Application) -> AsyncIterator[None]:
    """The app's ``Forwarder``, closed with it."""
    app[FORWARDER] = Forwarder(app)
    try:
        yield
    finally:
        await app[FORWARDER].close()


def _unavailable(rt: Runtime, message: str) -> web.Response:
    return web.Response(body=unavailable_body(rt, message), status=503, content_type="application/json",
                        headers={"Retry-After": "1"})


async def forward(request: web.Request, *, again: bool = False) -> web.StreamResponse:
    """``request`` as the leader answers it, streamed back through aiohttp's client (module
    docstring). ``again``: it came from a member already (``leader_for``)."""
    rt = request.app[RUNTIME]
    try:
        leader = leader_for(rt, again)
    except Unavailable as exc:
        return _unavailable(rt, str(exc))
    headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in _HOP)
    if rt.jwt_secret:
        headers[HEADER] = forwarded_value(member_key(rt.jwt_secret), request.remote or "", request.method,
                                          request.path_qs, time.time())
    streaming = request.path.endswith(EVENTS_PATH)
    read_s = None if streaming else first_byte_timeout(request.path_qs)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=read_s)
    body = await request.read() if request.body_exists else None
    forwarder = request.app[FORWARDER]
    out: web.StreamResponse | None = None
    w = forwarder.watch(leader, streaming=streaming)
    try:
        async with asyncio.timeout(None) as w.scope, await forwarder.http.request(
                request.method, leader.rstrip("/") + request.path_qs, headers=headers, data=body,
                allow_redirects=False, timeout=timeout) as upstream:
            out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in _HOP or k.lower() == "content-length":
                    out.headers.add(k, v)
            await out.prepare(request)
            async for chunk in upstream.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        why = w.why or f"the leader {leader} did not answer this member: {type(exc).__name__}"
        if out is not None:  # the head is sent: all we can do is cut the answer
            log.warning("the leader's answer to %s %s broke off: %s", request.method, request.path, why)
            return out
        log.warning("forwarding %s %s to the leader %s failed: %s", request.method, request.path, leader, why)
        return _unavailable(rt, why)
    finally:
        forwarder.unwatch(w)
    return out
