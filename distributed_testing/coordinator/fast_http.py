"""A lean HTTP/1.1 front for the hottest route, ``POST /api/v1/tasks``; aiohttp serves the rest.

Every accepted connection starts with :class:`FastProtocol`. It answers a request itself only when
the request is exactly what CI clients send: ``POST /api/v1/tasks`` (any printable ASCII query)
over HTTP/1.1 with a ``Host``, a ``Content-Length`` body within the app's size limit, no
``Transfer-Encoding``, ``Content-Encoding``, ``Expect`` or ``Upgrade``, no repeated header and no
control character in its head. Anything else (another route, a WebSocket handshake, a chunked or
compressed body, a body over the limit, odd framing) hands the connection, with every byte read so
far, to aiohttp's own protocol, which keeps it from then on and judges the request with its strict
parser. Requests on one connection are answered one at a time and in order, so a hand-over never
overtakes an answer. A client that sends far ahead without reading the answers is stopped by flow
control (reading pauses once the buffer passes the body limit; answering pauses while the
transport's write buffer is full). A request's credentials are checked from its head alone, as
soon as the head is in, on a standby too (it holds the group's keys and secret; what it
authorized it relays to the leader, which checks it again; a key it has not heard of yet goes
to aiohttp, whose forwarding lets the leader decide before any body): a refused one (401, 403,
429) is answered at once and, when its body has not all arrived, the connection is closed
without reading it, so an anonymous client cannot make the coordinator buffer a body. A
connection that sends no complete head within ``--header-timeout`` of its start or its last
answer is closed (an authorized body that stalls, after ``KEEPALIVE_S``), and one accepted
beyond ``--max-connections`` is answered 503 and closed at once, before the process could run
out of descriptors. A handler that raises gets aiohttp's plain
500 and the connection is closed.

The route's logic is shared with the aiohttp handler (``api.authorize``, ``submission.submit``,
``api.error_parts``), so both give the same status, body and error shape.

Why: aiohttp spends about 150 µs of CPU on each request before and after its handler (measured:
a bare aiohttp app answering a POST, 150-157 µs of server CPU a request over a keep-alive
``http.client`` connection; a minimal asyncio protocol, 57 µs), and a serial ``?wait`` submission
pays that on its critical path. See docs/architecture.md, "Measured".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import ssl
import time
from email.utils import formatdate
from http import HTTPStatus
from typing import cast
from urllib.parse import parse_qsl

import msgspec
from aiohttp import web
from aiohttp.http import SERVER_SOFTWARE

from ..errors import AuthError, DTError
from ..security.auth import Principal
from . import api, forward, submission
from .admission import RateLimitedLog, listen_backlog
from .runtime import RUNTIME, Runtime
from .server import CONFIG, LINGER_S, end_long_requests, nofile

log = logging.getLogger(__name__)

ROUTE = "/api/v1/tasks"
PERMISSION = api.PERMISSIONS[("POST", ROUTE)]  # as the route table says for aiohttp's handler
TLS_HANDSHAKE = b"\x16\x03"  # how a TLS connection's first record begins (a handshake, TLS 1.x)
SHUTDOWN_TIMEOUT_S = 60.0  # how long stop() lets requests in progress finish (aiohttp's runner default)
MAX_HEAD = 8190  # request line and headers together; aiohttp's own limit per line/field
MAX_HEADERS = 100  # aiohttp refuses more than 128; a request with this many goes to it to decide
KEEPALIVE_S = 3630.0  # an authorized request's body stalled this long is dropped (aiohttp 3.14's keep-alive)
_HEAD_END = b"\r\n\r\n"
_FORWARDED = forward.HEADER.lower()
_CTL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # control characters other than TAB
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


class _Date:
    """The ``Date`` header value, formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def __call__(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second, self._value = now, formatdate(now, usegmt=True).encode()
        return self._value


_date = _Date()
_FULL_BODY = msgspec.json.encode({"error": "Unavailable", "message": "too many open connections; try again"})


class _Head:
    """A request head this layer takes: its query, credentials, framing and, once judged, the
    principal its credentials name or the error that refuses it."""

    __slots__ = ("query", "authorization", "start", "length", "close", "verdict", "target", "forwarded", "relay")

    def __init__(self, query: dict[str, str], authorization: str, start: int, length: int, close: bool,
                 target: str = ROUTE, forwarded: str | None = None) -> None:
        self.query = query
        self.authorization = authorization
        self.target = target  # the request target as sent (what a forwarding member signed)
        self.forwarded = forwarded  # X-DT-Forwarded, checked in _judge
        self.start = start  # where the body starts in the buffer
        self.length = length
        self.close = close
        self.verdict: Principal | DTError | None = None
        self.relay = False  # a standby relays it to the leader as it came (forward.Forwarder.relay)


class _Request:
    __slots__ = ("query", "authorization", "body", "close", "verdict")

    def __init__(self, query: dict[str, str], authorization: str, body: bytes, close: bool,
                 verdict: Principal | DTError | None = None) -> None:
        self.query = query
        self.authorization = authorization
        self.body = body
        self.close = close
        self.verdict = verdict  # as judged from the head; None: not yet


def parse_head(buf: bytearray, max_body: int) -> _Head | None | bool:
    """The request head at the start of ``buf`` when this layer takes the request; ``None`` when
    more bytes are needed to tell; ``False`` when aiohttp must take the connection (another route,
    a framing this layer does not do, anything doubtful). The body need not have arrived."""
    end = buf.find(_HEAD_END, 0, MAX_HEAD + len(_HEAD_END))
    if end < 0:
        return None if len(buf) < MAX_HEAD + len(_HEAD_END) else False
    head = bytes(buf[:end]).decode("latin-1")
    lines = head.split("\r\n")
    if any(_CTL.search(line) for line in lines):
        return False  # a bare CR or LF, NUL or another control character: aiohttp's parser decides
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[0] != "POST" or parts[2] != "HTTP/1.1" or len(lines) > MAX_HEADERS + 1:
        return False
    if not parts[1].isascii() or not parts[1].isprintable():
        return False  # a TAB or a byte >= 0x80 in the target: aiohttp's strict parser refuses it
    path, _, query = parts[1].partition("?")
    if path != ROUTE or "#" in query:
        return False
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or not _TOKEN.issuperset(name.encode("latin-1")):
            return False  # obs-fold, a bare line or a bad name: let aiohttp judge it
        key = name.lower()
        if key in headers:
            return False  # a repeated header (framing, credentials, Host...): aiohttp decides
        headers[key] = value.strip(" \t")
    if "transfer-encoding" in headers or "expect" in headers or "upgrade" in headers or "host" not in headers:
        return False
    if headers.get("content-encoding", "identity").lower() != "identity":
        return False  # aiohttp decompresses (or refuses) encoded bodies
    connection = headers.get("connection", "keep-alive").lower()
    if connection not in ("keep-alive", "close"):
        return False
    length_raw = headers.get("content-length", "")
    if not (length_raw.isascii() and length_raw.isdigit()) or len(length_raw) > 18 or int(length_raw) > max_body:
        return False  # missing, malformed or over the limit: aiohttp answers (411/400/413)
    try:
        params = parse_qsl(query, keep_blank_values=True, strict_parsing=False, errors="strict")
    except (ValueError, UnicodeDecodeError):
        return False
    first: dict[str, str] = {}
    for k, v in params:
        first.setdefault(k, v)  # as aiohttp's request.query.get: the first value
    return _Head(first, headers.get("authorization", ""), end + len(_HEAD_END), int(length_raw), connection == "close",
                 parts[1], headers.get(_FORWARDED))


def parse_request(buf: bytearray, max_body: int) -> tuple[_Request, int] | None | bool:
    """The request at the start of ``buf``: ``(request, bytes it spans)`` when this layer takes it
    and it is complete; ``None`` when more bytes are needed to tell; ``False`` when aiohttp must
    take the connection (as :func:`parse_head`)."""
    head = parse_head(buf, max_body)
    if not isinstance(head, _Head):
        return head
    if len(buf) < head.start + head.length:
        return None
    body = bytes(buf[head.start : head.start + head.length])
    return _Request(head.query, head.authorization, body, head.close), head.start + head.length


class FastProtocol(asyncio.Protocol):
    """One connection: answers ``POST /api/v1/tasks`` itself, hands anything else to aiohttp."""

    def __init__(self, site: FastSite) -> None:
        self._site = site
        self._app = site.app
        self._max_body = site.max_body
        self._transport: asyncio.Transport | None = None
        self._peer = ""
        self._buf = bytearray()
        self._head: _Head | None = None  # a judged head whose body is still arriving
        self._busy: asyncio.Task[None] | None = None
        self._closing = False
        self._discarding = False  # refused before its body: what still arrives is dropped unread
        self._paused = False
        self._eof = False  # the client half-closed: close once the answer in progress is out
        self._write_paused = False  # the transport's buffer is full: answer nothing more until it drains
        self._idle: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        t = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport instances
        if self._site.full():
            self._site.refuse(t)
            return
        self._transport = t
        self._site.connections.add(self)
        peer = transport.get_extra_info("peername")
        self._peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # answers go out at once
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)  # as aiohttp: dead peers are noticed
        self._arm_idle(self._site.header_timeout)

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        self._buf += data
        if len(self._buf) > self._max_body + 2 * MAX_HEAD and not self._paused and self._transport is not None:
            self._paused = True  # a client pipelining far ahead of our answers, or not reading them
            self._transport.pause_reading()
        self._next()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._next()

    def eof_received(self) -> bool:
        self._eof = True
        return self._busy is not None  # keep the socket open for the answer in progress, then close

    def connection_lost(self, exc: Exception | None) -> None:
        self._site.connections.discard(self)
        self._transport = None
        self._disarm()
        # A request in progress runs to its end, as aiohttp's handlers do: the tasks were accepted.

    # ------------------------------------------------------------ requests

    def _next(self) -> None:
        """Judge the next buffered request head from its headers alone, refusing it before its
        body arrives when its credentials fail; start it once its body is in; or hand the
        connection over. Resume reading once the buffer has room again."""
        if self._transport is None or self._busy is not None or self._closing or self._write_paused:
            return
        if self._head is None:
            if self._buf[:2] == TLS_HANDSHAKE:  # a client speaking TLS to this plain-http port: end it now,
                self._transport.close()  # its handshake fails at once instead of after --header-timeout
                return
            parsed = parse_head(self._buf, self._max_body) if self._buf else None
            if parsed is False:
                self._hand_over()
                return
            if isinstance(parsed, _Head) and not self._app[RUNTIME].leading() and not self._relays():
                self._hand_over()  # aiohttp's middleware checks it and forwards it (forward.forward)
                return
            if isinstance(parsed, _Head):
                standby = not self._app[RUNTIME].leading()
                self._head = parsed
                if not self._judge(parsed, standby):
                    return
                if parsed.verdict is None:  # a key this standby has not heard of yet: the leader decides
                    self._head = None
                    self._hand_over()  # aiohttp's forwarding streams the body; the leader refuses it unread
                    return
                # a standby relays what it authorized (the leader authorizes it again); a refusal
                # whose body is here is answered by this member (_answer raises the verdict)
                parsed.relay = standby and isinstance(parsed.verdict, Principal)
        head = self._head
        if head is None or len(self._buf) < head.start + head.length:  # wait for more, not for ever
            if self._paused and len(self._buf) <= self._max_body + 2 * MAX_HEAD:
                self._paused = False
                self._transport.resume_reading()
            if head is None:
                self._arm_idle(self._site.header_timeout)
            return
        if head.relay:
            raw_head = bytes(self._buf[: head.start - len(_HEAD_END)])
            body = bytes(self._buf[head.start : head.start + head.length])
            del self._buf[: head.start + head.length]
            self._head = None
            self._disarm()
            self._busy = asyncio.get_running_loop().create_task(self._relay(raw_head, body, head))
            return
        req = _Request(head.query, head.authorization, bytes(self._buf[head.start : head.start + head.length]),
                       head.close, head.verdict)
        del self._buf[: head.start + head.length]
        self._head = None
        self._disarm()
        self._busy = asyncio.get_running_loop().create_task(self._answer(req))

    def _judge(self, head: _Head, standby: bool) -> bool:
        """Check the head's address and credentials (a ``standby`` with ``api.vouch``: the
        verdict stays None for a key it has not heard of); False when it was refused at once
        (its body not all here yet: the connection is then closed without reading it)."""
        peer = self._peer if head.forwarded is None else forward.verified_address(
            self._app[RUNTIME], head.forwarded, "POST", head.target, self._peer, time.time())
        try:
            api.check_address(self._app, peer)
            head.verdict = (api.vouch if standby else api.authorize)(self._app[RUNTIME], head.authorization, PERMISSION)
        except DTError as exc:
            if isinstance(exc, AuthError):
                api.note_failure(self._app, peer, head.authorization, exc)
            head.verdict = exc
            if len(self._buf) < head.start + head.length:
                self._refuse(exc)
                return False
            return True
        self._disarm()  # an authorized sender has as long as aiohttp gives for its body
        self._arm_idle(KEEPALIVE_S)
        return True

    def _refuse(self, exc: DTError) -> None:
        """Answer ``exc`` now, before the body, and close: the body is never read. What the client
        sends meanwhile is dropped for up to ``LINGER_S``, so that the answer reaches it rather than
        a reset."""
        status, body, headers = api.error_parts(exc, "POST /api/v1/tasks")
        self._write(status, msgspec.json.encode(body), "application/json; charset=utf-8", headers, True)
        self._buf = bytearray()
        self._head = None
        self._discarding = self._closing = True
        t = self._transport
        assert t is not None
        if self._paused:
            t.resume_reading()
        if t.can_write_eof():
            t.write_eof()
        self._disarm()
        self._idle = asyncio.get_running_loop().call_later(LINGER_S, self.close)

    def _arm_idle(self, seconds: float) -> None:
        if self._idle is None:
            self._idle = asyncio.get_running_loop().call_later(seconds, self._idle_close)

    def _disarm(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    async def _answer(self, req: _Request) -> None:
        rt: Runtime = self._app[RUNTIME]
        try:
            try:
                if isinstance(req.verdict, DTError):
                    raise req.verdict
                assert req.verdict is not None
                wait = api.float_param(req.query, "wait", 0.0, 0.0, submission.MAX_WAIT_S)
                status, body = await submission.submit(rt, req.verdict, req.body, wait)
                headers: dict[str, str] | None = None
            except DTError as exc:
                status, body, headers = api.error_parts(exc, "POST /api/v1/tasks")
            self._write(status, msgspec.json.encode(body), "application/json; charset=utf-8", headers, req.close)
        except Exception:  # noqa: BLE001 - aiohttp's answer to a handler that raised: a plain 500
            log.exception("error handling POST /api/v1/tasks")
            self._write(500, b"500 Internal Server Error\n\nServer got itself in trouble", "text/plain; charset=utf-8",
                        None, True)
            req.close = True
        finally:
            self._busy = None
        self._after(req.close)

    def _relays(self) -> bool:
        """Whether this standby relays the lean front's route itself (``forward.Forwarder.relay``)."""
        return forward.FORWARDER in self._app and forward.Forwarder.relays_to(self._app[RUNTIME])

    async def _relay(self, raw_head: bytes, body: bytes, head: _Head) -> None:
        close = head.close
        try:
            answer = await self._app[forward.FORWARDER].relay(raw_head, body, head.target, self._peer, close=close,
                                                              again=head.forwarded is not None,
                                                              secure=self._site.secure)
            t = self._transport
            if t is not None and not t.is_closing():
                t.write(answer)
        except Exception:  # noqa: BLE001 - as _answer: a plain 500
            log.exception("error forwarding POST /api/v1/tasks")
            self._write(500, b"500 Internal Server Error\n\nServer got itself in trouble", "text/plain; charset=utf-8",
                        None, True)
            close = True
        finally:
            self._busy = None
        self._after(close)

    def _after(self, close: bool) -> None:
        """An answer is out: close when asked, else take the next request."""
        if close or self._eof:
            self._closing = True
            if self._transport is not None:
                self._transport.close()
            return
        self._next()

    def _write(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None, close: bool) -> None:
        t = self._transport
        if t is None or t.is_closing():
            return  # the client went away; its tasks stay accepted
        t.write(_response(status, body, content_type, headers, close))

    def _hand_over(self) -> None:
        """Give the connection, and what was read from it so far, to aiohttp for good."""
        t = self._transport
        assert t is not None and self._busy is None
        self._site.connections.discard(self)
        self._disarm()  # aiohttp keeps its own keep-alive timer from here on
        handler = self._site.aiohttp_protocol()
        data, self._buf = bytes(self._buf), bytearray()
        self._transport = None
        t.set_protocol(handler)
        handler.connection_made(t)
        if data:
            handler.data_received(data)
        if self._paused:
            t.resume_reading()

    def _idle_close(self) -> None:
        """No complete head within ``--header-timeout`` of the connection's start or its last
        answer, or a body stalled for ``KEEPALIVE_S``: close."""
        self._idle = None
        if self._busy is None and self._transport is not None:
            self._transport.close()

    # ------------------------------------------------------------ shutdown

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def shutdown(self) -> asyncio.Task[None] | None:
        """Stop taking requests: close now if idle; otherwise after the answer in progress, whose
        task is returned."""
        self._closing = True
        if self._busy is None and self._transport is not None:
            self._transport.close()
        return self._busy


def _response(status: int, body: bytes, content_type: str, headers: dict[str, str] | None, close: bool) -> bytes:
    out = bytearray(b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode()))
    out += b"Content-Type: %s\r\nContent-Length: %d\r\n" % (content_type.encode(), len(body))
    out += b"Date: " + _date() + b"\r\nServer: " + SERVER_SOFTWARE.encode() + b"\r\n"
    for k, v in (headers or {}).items():
        out += f"{k}: {v}\r\n".encode("latin-1")
    if close:
        out += b"Connection: close\r\n"
    out += b"\r\n"
    out += body
    return bytes(out)


class FastSite(web.BaseSite):
    """A TCP site whose connections start with :class:`FastProtocol` (``web.TCPSite``'s role)."""

    def __init__(self, runner: web.AppRunner, host: str | None, port: int, *, reuse_address: bool | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        # With ``ssl_context`` asyncio's TLS transport hands FastProtocol decrypted bytes, and a
        # hand-over gives aiohttp that same transport (it reports ``sslcontext``: https, wss).
        super().__init__(runner, ssl_context=ssl_context)
        self._app_runner = runner
        self._host_name = host
        self._port_number = port
        self._reuse_address = reuse_address
        self.shutdown_timeout = SHUTDOWN_TIMEOUT_S
        self.connections: set[FastProtocol] = set()
        self.max_body = 0
        self.header_timeout = 10.0
        self.max_connections = 0
        self._refusals = RateLimitedLog(log, logging.WARNING)

    @property
    def secure(self) -> bool:
        """Whether this site serves https."""
        return self._ssl_context is not None

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host_name or '0.0.0.0'}:{self._port_number}"

    @property
    def app(self) -> web.Application:
        return self._app_runner.app

    def full(self) -> bool:
        """True when ``--max-connections`` HTTP connections are open: every connection this site
        accepted and still holds (its own and those handed to aiohttp) but registered workers'."""
        server = self._app_runner.server
        handed = len(server.connections) if server is not None else 0  # public: a copy of the list, ~10 µs at 10k
        return len(self.connections) + handed - len(self.app[RUNTIME].sessions) >= self.max_connections

    def refuse(self, transport: asyncio.Transport) -> None:
        """Close a connection over the cap at once, with a 503 it may read."""
        transport.write(_response(503, _FULL_BODY, "application/json; charset=utf-8", {"Retry-After": "1"}, True))
        transport.close()
        self._refusals(time.monotonic(), "refused a connection: %d HTTP connections open (--max-connections)",
                       self.max_connections)

    def aiohttp_protocol(self) -> asyncio.Protocol:
        server = self._app_runner.server
        assert server is not None, "the runner is not set up"
        return server()

    async def start(self) -> None:
        await super().start()
        config = self.app[CONFIG]
        self.max_body = config.max_frame_bytes  # the app's client_max_size
        self.header_timeout = config.header_timeout_s
        self.max_connections = self.app[api.LIMITS].max_connections
        self._server = await asyncio.get_running_loop().create_server(
            lambda: FastProtocol(self), self._host_name, self._port_number, reuse_address=self._reuse_address,
            ssl=self._ssl_context, backlog=listen_backlog(nofile()))

    async def stop(self) -> None:
        await super().stop()  # no new connections
        await end_long_requests(self.app)  # answer the ?wait requests now, not after shutdown_timeout
        busy = [t for c in list(self.connections) if (t := c.shutdown()) is not None]
        if busy:
            _, pending = await asyncio.wait(busy, timeout=self.shutdown_timeout)
            for task in pending:
                task.cancel()
        for c in list(self.connections):
            c.close()
