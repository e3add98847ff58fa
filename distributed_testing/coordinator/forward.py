"""A standby serves every API request by forwarding it to the leader and streaming the answer back
(bodies, ``?wait`` long polls, the event stream, the dashboard): one address for the whole group
works for every client, ``curl`` and ``requests`` included (they drop ``Authorization`` on a
redirect to another host). Vault, etcd and Consul do the same.

What is forwarded: the method, the path and query, the body (streamed as it comes; a compressed
one decoded, as aiohttp hands it over, so without its ``Content-Encoding``; a declared length
over the route's cap is answered 413 here), and the headers apart from the hop ones. The
client's own ``Authorization`` goes with it and the leader checks it as if the client had come
straight (a standby grants nothing; it checks the credential from the head first, ``api._admit``
and the lean front's ``_judge``, so that it refuses before reading a body). The standby adds
``X-DT-Forwarded``: the client's address, a timestamp and an HMAC over both and the request
line, keyed from the group's token-signing secret (``member_key``; every member holds it, from
the database or the shared ``--jwt-secret-file``). The leader believes that address
(``client_address``: rate limits and logs go to the original client) only when the HMAC
verifies within ``SKEW_S``; anything else, a forged header included, counts as the direct
peer's address.

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
  streaming the answer as it comes; an https leader's certificate is verified with the
  coordinator's ``--ca-file`` (a group on a private CA), else the system's CAs.

A request that came over https is not forwarded to a leader on plain http (its credential would
cross the network in clear; a loopback leader aside): ``503`` saying so.

While nothing of a request has gone to the leader (none is known, its membership heartbeat is
older than ``LEADER_SILENT_S``, the connection to it failed within ``client.CONNECT_TIMEOUT_S``)
the answer is ``503`` with ``Retry-After: 1`` and the ``not_leader`` body (``leader`` null: ask
another member), which lists the members this one sees silent (``unhealthy``): a client tries
them last (``client.ApiClient``). Once the request went out, the leader may have carried it out,
so a failure is never a 503 (a client would send the request again elsewhere: a submission
without task ids would run twice): no answer within ``client.first_byte_timeout`` is ``504``, a
broken or unreadable answer ``502``, both with the ``answer_lost`` body (``lost_body``), which a
client repeats only when the request is safe to repeat. A request already on its way is given up
(``504``) as soon as its leader falls silent or another member takes the lease (checked every
``WATCH_S``): a client then waits about as long as the leader's silence takes to notice, not a
whole first-byte bound, for a paused or cut-off leader. Worker sessions are not relayed: a
standby still answers their handshake with ``503`` naming the leader (docs/architecture.md,
"High availability", says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import ipaddress
import logging
import time
import urllib.parse
from collections.abc import AsyncIterator
from http import HTTPStatus
from pathlib import Path

import aiohttp
import msgspec
from aiohttp import web
from multidict import CIMultiDict

from ..client import CONNECT_TIMEOUT_S, canonical, first_byte_timeout, wait_of
from ..process.httpstream import ClientGone, chunks_while_connected
from ..security import tls
from . import bundles_api
from .group import MEMBER_STALE_S
from .rest import read_body
from .runtime import RUNTIME, Runtime

log = logging.getLogger(__name__)
HEADER = "X-DT-Forwarded"
SKEW_S = 30.0
# A leader the cluster view shows unhealthy (no membership heartbeat, sent every 0.5 s, for this
# long) is not asked: the answer is 503 at once instead of after the first-byte bound (a paused
# leader keeps its lease for a TTL). Not shorter: a leader on a loaded host beats late.
LEADER_SILENT_S = MEMBER_STALE_S
WATCH_S = 0.25  # how often requests on their way are checked against their leader's health
GONE_CHECK_S = 1.0  # how often a forwarded event stream looks whether its client went away
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
    """The leader cannot be asked now (the ``message`` says why): answered 503, nothing was sent."""


def leader_for(rt: Runtime, again: bool, secure: bool = False) -> str:
    """The leader a request should go to; ``Unavailable`` when there is none to ask. ``again``:
    it came from a member already; one hop only, so two members with stale views never pass it
    round. ``secure``: it came over https, so its credential goes on only over https (or to a
    leader on this host's loopback), as a client's own would (docs/security.md, "Redirects")."""
    if again:
        raise Unavailable("a member forwarded this request to one that does not lead (a takeover is under way)")
    leader = rt.group.leader_url if rt.group is not None else None
    if not leader or leader.rstrip("/") == (rt.advertise_url or "").rstrip("/"):
        raise Unavailable("no coordinator of the group leads now; retry shortly")
    if secure and urllib.parse.urlsplit(leader).scheme.lower() != "https" and not _loopback(leader):
        raise Unavailable(f"this member was reached over https and the leader {leader} is on plain http: the "
                          "request's credential is not sent on in clear; give every member an https "
                          "--advertise-url, or ask the leader itself")
    why = gone(rt, leader)
    if why is not None:
        raise Unavailable(why)
    return leader


def _loopback(url: str) -> bool:
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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


LOST = "answer_lost"  # the error of a request the leader got whose answer did not come back


def lost_body(rt: Runtime, leader: str, why: str) -> bytes:
    """The 502/504 ``answer_lost`` body: the request reached ``leader`` (it may have been carried
    out) and its answer did not come back (``why``); and the members this one sees silent."""
    unhealthy = rt.group.silent_urls() if rt.group is not None else []
    message = (f"the request was sent to the leader {leader} but its answer was lost ({why}); it may have been "
               "carried out: send it again only if that is safe (a submission whose tasks all have a task_id)")
    return msgspec.json.encode({"error": LOST, "message": message, "unhealthy": unhealthy})


class _Watched:
    """A request on its way to ``leader``; ``why`` is set when the watch gave up on it, ``sent``
    once a connection to the leader is open and the request goes out on it."""

    __slots__ = ("leader", "long", "scope", "sent", "why")

    def __init__(self, leader: str, long: bool) -> None:
        self.leader = leader
        self.long = long  # it may take long (an event stream, a ?wait): ended when this member stops
        self.scope: asyncio.Timeout | None = None
        self.why: str | None = None
        self.sent = False


class Forwarder:
    """A member's forwarding to the leader: aiohttp's client (every route, streamed), a pool of
    raw kept-alive connections (``relay``), and the watch over requests on their way."""

    def __init__(self, app: web.Application, ca_file: Path | None = None) -> None:
        self._app = app  # its runtime is set up after this (server._member_ctx)
        # bodies pass through as they are (no decompression); TLS verified with ``ca_file`` (the
        # coordinator's --ca-file) or the system's CAs; pooled connections kept as long as the
        # relay's (well within the leader's --header-timeout)
        trace = aiohttp.TraceConfig()
        trace.on_connection_create_end.append(_connected)
        trace.on_connection_reuseconn.append(_connected)
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=IDLE_S,
                                         ssl=tls.client_context(ca_file) if ca_file is not None else True)
        self.http = aiohttp.ClientSession(connector=connector, auto_decompress=False, trace_configs=[trace])
        self._idle: dict[str, list[tuple[float, asyncio.StreamReader, asyncio.StreamWriter]]] = {}
        self._waiting: set[_Watched] = set()
        self._watch = asyncio.get_running_loop().create_task(self._watch_loop(), name="forward-watch")
        self.stopping = False

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

    def watch(self, leader: str, long: bool = False) -> _Watched:
        """Watch a request on its way to ``leader``: once it is ``gone`` (or, for a ``long`` one:
        an event stream or a ``?wait`` poll, once this member stops), the request's scope
        (``asyncio.timeout`` entered as ``scope``) ends in TimeoutError and ``why`` says why.
        ``unwatch`` when it is done."""
        w = _Watched(leader, long)
        self._waiting.add(w)
        return w

    def entered(self, w: _Watched) -> None:
        """``w``'s scope is entered: a long request that arrives while this member stops is given
        up at once, as those under way were (``end_long_requests``)."""
        if self.stopping and w.long:
            self._give_up(w, "this member is stopping")

    def unwatch(self, w: _Watched) -> None:
        self._waiting.discard(w)

    def end_long_requests(self) -> None:
        """This member is stopping: end the event streams and ``?wait`` polls it forwards, each of
        which would hold the shutdown until its client leaves or its wait ends (the leader
        answers its own the same way). A poll still waiting for its answer gets the lost answer
        (504 ``answer_lost``), which the group's clients take to another member."""
        self.stopping = True
        for w in list(self._waiting):
            if w.long:
                self._give_up(w, "this member is stopping")

    def _give_up(self, w: _Watched, why: str) -> None:
        if w.scope is not None:
            self._waiting.discard(w)
            w.why = why
            with contextlib.suppress(RuntimeError):  # its scope ended meanwhile
                w.scope.reschedule(asyncio.get_running_loop().time())

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            for w in list(self._waiting):
                why = gone(self.rt, w.leader)
                if why is not None:
                    self._give_up(w, why)

    # ------------------------------------------------------------ the raw relay (the lean front's route)

    @staticmethod
    def relays_to(rt: Runtime) -> bool:
        """Whether ``relay`` takes a request now: no leader to ask (it answers 503 itself), or one
        on plain http (https goes through aiohttp's client, which does TLS)."""
        leader = rt.group.leader_url if rt.group is not None else None
        return leader is None or leader.startswith("http://")

    async def relay(self, head: bytes, body: bytes, target: str, peer: str, *, close: bool, again: bool,
                    secure: bool) -> bytes:
        """The answer, as bytes for the client at ``peer``, to the lean front's ``POST`` whose
        head (up to its blank line, without it) is ``head`` and whose request target is
        ``target``; ``close``: the client asked to close; ``again``: it came from a member;
        ``secure``: over https."""
        rt = self.rt
        try:
            leader = leader_for(rt, again, secure)
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
        w = self.watch(leader, long=wait_of(target) > 0)
        bound = first_byte_timeout(target)
        try:
            async with asyncio.timeout(bound) as w.scope:
                self.entered(w)
                reader, writer = await self._connection(parts.netloc)
                writer.write(request)
                w.sent = True
                answer_head = await reader.readuntil(b"\r\n\r\n")
                length, keep = _answer_framing(answer_head)
                answer_body = await reader.readexactly(length)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            if writer is not None:
                writer.transport.abort()
            if not w.sent:
                why = w.why or f"the leader {leader} did not answer this member: {_reason(exc)}"
                log.warning("forwarding POST %s to the leader %s failed: %s", target, leader, why)
                return _answer(503, unavailable_body(rt, why), close, b"Retry-After: 1\r\n")
            why = w.why or (f"no answer within {bound:g} s" if isinstance(exc, TimeoutError) else _reason(exc))
            log.warning("the answer of the leader %s to POST %s was lost: %s", leader, target, why)
            return _answer(504 if isinstance(exc, TimeoutError) else 502, lost_body(rt, leader, why), close)
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


async def _pass_on(request: web.Request, upstream: aiohttp.ClientResponse, out: web.StreamResponse,
                   streaming: bool) -> None:
    """Send ``upstream``'s answer on as ``out``; ``ClientGone`` when the client went away. For
    an event stream, which may stay silent for a keepalive interval, the client's connection is
    looked at every ``GONE_CHECK_S``, so the stream to the leader ends soon after it closed."""
    try:
        await out.prepare(request)
        if streaming:
            async with contextlib.aclosing(chunks_while_connected(request, upstream, GONE_CHECK_S)) as chunks:
                async for chunk in chunks:
                    await out.write(chunk)
        else:
            async for chunk in upstream.content.iter_any():
                await out.write(chunk)
        await out.write_eof()
    except ConnectionError as exc:  # aiohttp's ClientConnectionResetError: writing to a closed transport
        raise ClientGone from exc


def _streams(request: web.Request) -> bool:
    """Whether the answer is an event stream, which may be silent for as long as the leader's
    keepalive interval (15 s): ``GET /api/v1/events``, the dashboard's ``/dashboard/events``, or
    any request asking for ``text/event-stream`` (a browser's EventSource does). Its answer gets
    no read bound, only the watch over its leader."""
    return request.path.endswith("/events") or "text/event-stream" in request.headers.get("Accept", "")


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def _connected(_session: aiohttp.ClientSession, ctx: object, _params: object) -> None:
    """aiohttp's trace: a connection to the leader is open (new or pooled); the request is sent on it."""
    w = getattr(ctx, "trace_request_ctx", None)
    if isinstance(w, _Watched):
        w.sent = True


def _answer(status: int, body: bytes, close: bool, extra: bytes = b"") -> bytes:
    head = b"HTTP/1.1 %d %s\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: %d\r\n" % (
        status, HTTPStatus(status).phrase.encode(), len(body))
    return head + extra + (b"Connection: close\r\n" if close else b"") + b"\r\n" + body


async def _body(request: web.Request, rt: Runtime, headers: CIMultiDict[str]) -> bytes | aiohttp.StreamReader | None:
    """What to send the leader as ``request``'s body: streamed as it comes (never buffered here;
    a blob may be far larger than the app's body limit), after a declared length over the
    route's own cap got the leader's 413 from here. aiohttp hands the body over decoded per its
    ``Content-Encoding``: such a body is read first (within the app's limit, a blob route's within
    its cap; one that cannot be decoded gets the leader's 400 from here) and goes without that
    header."""
    if not request.body_exists:
        return None
    resource = request.match_info.route.resource
    capped = (request.method, resource.canonical if resource else "") in bundles_api.CAPPED
    if headers.popall("Content-Encoding", None) is not None:  # read decoded, within the route's own cap
        return await (bundles_api.read_capped(request, bundles_api.body_cap(rt), "(body)") if capped
                      else read_body(request))
    if capped:
        bundles_api.check_length(request, bundles_api.body_cap(rt), "(body)")
    elif request.content_length is not None and request.content_length > rt.config.max_frame_bytes:
        raise web.HTTPRequestEntityTooLarge(max_size=rt.config.max_frame_bytes, actual_size=request.content_length)
    if request.content_length is not None:
        headers["Content-Length"] = str(request.content_length)
    return request.content


FORWARDER: web.AppKey[Forwarder] = web.AppKey("forwarder", Forwarder)


async def http_ctx(app: web.Application, ca_file: Path | None = None) -> AsyncIterator[None]:
    """The app's ``Forwarder`` (``ca_file``: ``--ca-file``), closed with it."""
    app[FORWARDER] = Forwarder(app, ca_file)
    try:
        yield
    finally:
        await app[FORWARDER].close()


def _unavailable(rt: Runtime, message: str) -> web.Response:
    return web.Response(body=unavailable_body(rt, message), status=503, content_type="application/json",
                        headers={"Retry-After": "1"})


async def forward(request: web.Request, *, again: bool = False, expect: bool = False) -> web.StreamResponse:
    """``request`` as the leader answers it, streamed back through aiohttp's client (module
    docstring). ``again``: it came from a member already (``leader_for``); ``expect``: its body
    goes only once the leader invites it (``Expect: 100-continue``: a credential this member
    could not judge, which the leader may refuse from the head)."""
    rt = request.app[RUNTIME]
    try:
        leader = leader_for(rt, again, request.secure)
    except Unavailable as exc:
        return _unavailable(rt, str(exc))
    headers = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in _HOP)
    if rt.jwt_secret:
        headers[HEADER] = forwarded_value(member_key(rt.jwt_secret), request.remote or "", request.method,
                                          request.path_qs, time.time())
    streaming = _streams(request)
    read_s = None if streaming else first_byte_timeout(request.path_qs)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=read_s)
    body = await _body(request, rt, headers)
    forwarder = request.app[FORWARDER]
    out: web.StreamResponse | None = None
    w = forwarder.watch(leader, long=streaming or wait_of(request.path_qs) > 0)
    try:
        async with asyncio.timeout(None) as w.scope:
            forwarder.entered(w)
            async with await forwarder.http.request(
                    request.method, leader.rstrip("/") + request.path_qs, headers=headers, data=body,
                    allow_redirects=False, timeout=timeout, trace_request_ctx=w,
                    expect100=expect and body is not None) as upstream:
                out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
                for k, v in upstream.headers.items():
                    if k.lower() not in _HOP or k.lower() == "content-length":
                        out.headers.add(k, v)
                await _pass_on(request, upstream, out, streaming)
    except ClientGone:  # nothing wrong with the leader: the client no longer reads
        log.info("the client of %s %s went away before the leader's answer was all passed on", request.method,
                 request.path)
        assert out is not None  # raised only by _pass_on
        return out
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        if out is not None and forwarder.stopping and w.why is not None:
            log.info("ended the forwarded answer to %s %s: %s", request.method, request.path, w.why)
            return out
        if out is not None:  # the head is sent: all we can do is cut the answer
            why = w.why or _reason(exc)
            log.warning("the leader's answer to %s %s broke off: %s", request.method, request.path, why)
            return out
        if not w.sent:  # no connection to the leader: nothing of the request left this member
            why = w.why or f"the leader {leader} did not answer this member: {_reason(exc)}"
            log.warning("forwarding %s %s to the leader %s failed: %s", request.method, request.path, leader, why)
            return _unavailable(rt, why)
        timed_out = isinstance(exc, TimeoutError)
        why = w.why or (f"no answer within {read_s:g} s" if timed_out and read_s else _reason(exc))
        log.warning("the answer of the leader %s to %s %s was lost: %s", leader, request.method, request.path, why)
        return web.Response(body=lost_body(rt, leader, why), status=504 if timed_out else 502,
                            content_type="application/json")
    finally:
        forwarder.unwatch(w)
    return out
