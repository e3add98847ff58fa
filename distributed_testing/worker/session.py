"""The worker's connection to a coordinator, apart from what it carries: the handshake and how
it is refused (``Dialer``), the timeouts and reconnect pacing, reading frames (``next_frame``),
making them (``sealed``: never one the coordinator must refuse) and how a dead coordinator is
noticed (``keepalive``, ``ping_period``, ``bound_unacknowledged``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
import time
from typing import Any

import aiohttp
import msgspec
from multidict import CIMultiDictProxy

from ..client import canonical
from ..config import ws_url
from ..errors import ProtocolError
from ..protocol import messages as m
from ..protocol.signing import DEFAULT_MAX_FRAME, SESSION_HEADER, Channel
from ..security import tls
from .coordinators import Candidates
from .core.output import unsendable

log = logging.getLogger(__name__)
OPEN_TIMEOUT_S = 10.0  # proxy, TCP connect and WebSocket handshake together
# The same for a member of a group that failed just now (a standby vouched for it): if it is a
# paused leader after all (the standby's view lags by up to a heartbeat), it costs this, not 10 s.
RECENT_OPEN_TIMEOUT_S = 2.0
MAX_FRAME_BYTES = 32 * 1024 * 1024
# --high-availability: the pause between full rounds of every known coordinator starts here and
# doubles up to --reconnect-interval; there is none between two coordinators of a round.
HA_FIRST_PAUSE_S = 0.1
# After an established session ends, the first reconnect waits a uniform random part of this (at
# most --reconnect-interval): a restarted coordinator's whole fleet then arrives spread over a
# second rather than in one millisecond (benchmarks/fleet.py measures the restart at 10,000 workers).
FIRST_RECONNECT_SPREAD_S = 1.0
CLUSTER_TIMEOUT_S = 5.0  # GET /api/v1/cluster after a registration (--high-availability)
RETRY_ON = (OSError, aiohttp.ClientError, asyncio.TimeoutError, ProtocolError)


def sealed(channel: Channel, msg: m.Message, now: float, limit: int = DEFAULT_MAX_FRAME) -> list[bytes]:
    """``msg`` as signed frames of at most ``limit`` bytes (the coordinator's frame limit; a larger
    frame ends the session, and the re-send after the reconnect would end the next one).

    A ``results`` message too large for one frame is split across several; a single result that
    cannot be encoded or is too large by itself (stored before ``core.output`` checked outputs)
    is sent as an ``error`` result of its attempt instead (``unsendable``), so the coordinator's
    acknowledgement ends its re-sends. Any other message that cannot be sealed is a fault of ours:
    ValueError."""
    why = ""
    try:
        frame = channel.seal(msg, now)
        if len(frame) <= limit:
            return [frame]
        why = f"its frame is {len(frame):,} bytes, over the {limit:,} bytes a frame may hold"
    except (OverflowError, TypeError, ValueError, RecursionError, msgspec.EncodeError) as exc:
        why = f"it cannot be encoded: {exc}"
    if not isinstance(msg, m.Results) or not msg.results:
        raise ValueError(f"cannot send {type(msg).__name__}: {why}")
    results = msg.results
    if len(results) > 1:
        half = len(results) // 2
        return [*sealed(channel, m.Results(results[:half]), now, limit),
                *sealed(channel, m.Results(results[half:]), now, limit)]
    log.error("the stored result of task %s (attempt %d) cannot be sent (%s); sending an error result in its place",
              results[0].task_id, results[0].attempt, why)
    return [channel.seal(m.Results([unsendable(results[0], why)]), now)]


def sealed_batch(channel: Channel, msgs: list[m.Message], now: float, limit: int = DEFAULT_MAX_FRAME) -> list[bytes]:
    """``msgs`` (several) as one signed ``batch`` frame; one that would not fit in ``limit`` bytes
    or cannot be encoded goes in halves, down to each message alone through :func:`sealed`."""
    if len(msgs) == 1:
        return sealed(channel, msgs[0], now, limit)
    try:
        frame = channel.seal(m.Batch(msgs), now)  # type: ignore[arg-type]
        if len(frame) <= limit:
            return [frame]
    except (OverflowError, TypeError, ValueError, RecursionError, msgspec.EncodeError):
        pass  # a result that cannot be encoded: the halves find it, and sealed() replaces it
    half = len(msgs) // 2
    return [*sealed_batch(channel, msgs[:half], now, limit), *sealed_batch(channel, msgs[half:], now, limit)]


def ping_period(ttl_s: float, high_availability: bool) -> float:
    """Seconds between a worker's WebSocket pings in a session whose TTL is ``ttl_s``: the TTL,
    half of it with ``--high-availability`` (see ``keepalive``)."""
    return ttl_s / 2 if high_availability else ttl_s


def bound_unacknowledged(ws: aiohttp.ClientWebSocketResponse, ttl_s: float) -> None:
    """Let the kernel end ``ws``'s connection once sent data has waited ``ttl_s`` for its ACK
    (``TCP_USER_TIMEOUT``: a dead coordinator host or a cut path). Where the option or the socket
    is missing (not Linux, a test transport), pings alone find such a coordinator."""
    sock = ws.get_extra_info("socket")
    if sock is None or not hasattr(socket, "TCP_USER_TIMEOUT"):
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, max(1, round(ttl_s * 1000)))
    except OSError as exc:
        log.debug("TCP_USER_TIMEOUT not set: %s", exc)


class SessionRejected(Exception):
    """The coordinator refused us in a way retrying cannot fix (bad credentials, wrong role)."""


class NotTheLeader(ConnectionError):
    """The coordinator is a standby of an HA group (HTTP 503 at the handshake); it named the
    leader, or none while a takeover is under way."""


class HandshakeProbe:
    """The handshake's HTTP response, as seen by a ``TraceConfig`` hook: its headers (the
    coordinator's session id) and, for a refusal, the start of its body (the reason).

    aiohttp's ClientWebSocketResponse exposes neither. A trace hook is public API (the other way,
    the private ``ws._response``, could change in any release), and it sees the response before
    ``ws_connect`` closes a refused one, so the reason survives. The session it is attached to
    makes no other request and connects one attempt at a time, so what it holds after
    ``ws_connect`` is that attempt's response (``reset()`` before each)."""

    def __init__(self) -> None:
        self.config = aiohttp.TraceConfig()
        self.config.on_request_end.append(self._on_request_end)
        self.headers: CIMultiDictProxy[str] | None = None
        self.body = b""

    def reset(self) -> None:
        self.headers, self.body = None, b""

    async def _on_request_end(self, _session: aiohttp.ClientSession, _ctx: Any,
                              params: aiohttp.TraceRequestEndParams) -> None:
        self.headers = params.response.headers
        if params.response.status != 101:  # a 101's body is the WebSocket stream: never read it here
            with contextlib.suppress(aiohttp.ClientError):  # the status alone still says enough
                self.body = await params.response.content.read(2000)


def refusal_json(body: bytes) -> dict[str, Any]:
    """A refusal's JSON body as a dict ({} when it is not one)."""
    try:
        value = json.loads(body or b"{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class Dialer:
    """Opens the WebSocket to a coordinator. ``http`` is the HTTP client the socket is opened with
    (``client_session``, one per ``WorkerAgent.run``); ``handshake`` sees each handshake's answer;
    a standby's refusal naming the leader sends the next attempt there (through ``candidates``)."""

    def __init__(self, candidates: Candidates, ssl_context: ssl.SSLContext | None) -> None:
        self.candidates = candidates
        self.ssl = ssl_context
        self.handshake = HandshakeProbe()
        self.http: aiohttp.ClientSession | None = None

    def client_session(self) -> aiohttp.ClientSession:
        """The HTTP client the coordinator WebSocket is opened with. It connects directly, as the
        worker's token requests do: no proxy variables, and no ``~/.netrc`` (with ``trust_env``,
        a matching netrc entry makes aiohttp refuse our Authorization header). Every connection
        carries one WebSocket session and is closed with it, so nothing is pooled
        (``force_close``), and the coordinator's name is resolved at every connect (no DNS cache),
        so a coordinator that moved is found at the next reconnect. No total timeout: the
        handshake has its own (``OPEN_TIMEOUT_S``) and a session lasts as long as it lasts."""
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True, use_dns_cache=False, ssl=self.ssl or True),
            timeout=aiohttp.ClientTimeout(total=None), trace_configs=[self.handshake.config])

    def session_id(self) -> str | None:
        """The session id header of the last handshake's answer."""
        return self.handshake.headers.get(SESSION_HEADER) if self.handshake.headers is not None else None

    async def open(self, url: str, cred: str) -> aiohttp.ClientWebSocketResponse:
        """The WebSocket handshake with the coordinator at ``url``. A standby's 503 naming the
        leader sends the next attempt there (``NotTheLeader``)."""
        assert self.http is not None, "only within client_session()"
        self.handshake.reset()
        recent = len(self.candidates.urls) > 1 and self.candidates.members.recently_failed(url, time.monotonic())
        try:
            async with asyncio.timeout(RECENT_OPEN_TIMEOUT_S if recent else OPEN_TIMEOUT_S):
                # No compression (compress=0, the default); keepalive pings are ours (keepalive).
                return await self.http.ws_connect(ws_url(url), headers={"Authorization": f"Bearer {cred}"},
                                                  max_msg_size=MAX_FRAME_BYTES, autoping=False)
        except aiohttp.ClientConnectorCertificateError as exc:  # a configuration problem: retrying cannot help
            raise SessionRejected(tls.describe_tls_error(exc, url) or str(exc)) from exc
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status in (401, 403):
                raise SessionRejected(f"coordinator refused credentials: HTTP {exc.status} "
                                      f"{self.handshake.body.decode(errors='replace')}".rstrip()) from exc
            if exc.status == 503 and (answer := refusal_json(self.handshake.body)).get("error") == "not_leader":
                leader = answer.get("leader")
                if isinstance(leader, str) and canonical(leader) != url:
                    silent = answer.get("unhealthy")
                    alive = isinstance(silent, list) and canonical(leader) not in {
                        canonical(u) for u in silent if isinstance(u, str)}
                    await self._follow(url, leader, cred, seen_alive=alive)
                raise NotTheLeader(f"{url} is a standby; leader: {leader or 'none yet'}") from exc
            raise

    async def _follow(self, url: str, leader: str, cred: str, *, seen_alive: bool = False) -> None:
        """A standby at ``url`` named ``leader``: the next attempt goes there if it is a member
        (asking ``url``'s cluster view once for a URL not yet known); the worker key never goes
        anywhere else, nor from https to http (client.Members)."""
        if canonical(leader) not in self.candidates.urls and self.candidates.refusal(url, leader, membership=False) is None:
            view = await self.cluster_view(url, cred)
            if view is not None:
                self.candidates.learn(view, url)
        refused = self.candidates.refusal(url, leader)
        if refused is not None:
            log.warning("%s", refused)
        elif not self.candidates.redirect(leader, time.monotonic(), seen_alive=seen_alive):
            log.info("standby %s names %s, which failed just now: trying the other members first", url, leader)

    async def cluster_view(self, url: str, cred: str) -> dict[str, Any] | None:
        """``GET /api/v1/cluster`` of the member at ``url`` (None, logged, when it has none)."""
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl or True),
                                             timeout=aiohttp.ClientTimeout(total=CLUSTER_TIMEOUT_S)) as http:
                async with http.get(f"{url}/api/v1/cluster", headers={"Authorization": f"Bearer {cred}"}) as resp:
                    view = await resp.json(content_type=None) if resp.status == 200 else None
                    if view is None:
                        log.warning("GET %s/api/v1/cluster: HTTP %d", url, resp.status)
                    return view if isinstance(view, dict) else None
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            log.warning("GET %s/api/v1/cluster failed: %s", url, exc)
            return None


async def next_frame(ws: aiohttp.ClientWebSocketResponse, pong: asyncio.Event) -> bytes | None:
    """The next data frame (a text frame as its UTF-8 bytes), or None once the session was
    closed cleanly (the coordinator's close frame with code 1000 or 1001, or a close from this
    side). Answers pings and sets ``pong`` at each pong (autoping is off: see ``keepalive``). A
    connection that ended without a clean close, or one aiohttp found broken (a bad or oversized
    frame), raises ConnectionError: a lost session, or before registration a failed connect."""
    while True:
        frame = await ws.receive()
        kind = frame.type
        if kind is aiohttp.WSMsgType.BINARY:
            return frame.data  # type: ignore[no-any-return]
        if kind is aiohttp.WSMsgType.PING:
            await ws.pong(frame.data)
        elif kind is aiohttp.WSMsgType.PONG:
            pong.set()
        elif kind is aiohttp.WSMsgType.TEXT:
            return frame.data.encode()  # type: ignore[no-any-return]
        elif kind is aiohttp.WSMsgType.CLOSE and frame.data in (aiohttp.WSCloseCode.OK, aiohttp.WSCloseCode.GOING_AWAY):
            log.info("coordinator closed the session%s", f": {frame.extra}" if frame.extra else "")
            return None
        elif kind is aiohttp.WSMsgType.CLOSING:  # closed from this side
            return None
        elif kind is aiohttp.WSMsgType.ERROR:
            raise ConnectionError(f"WebSocket to coordinator failed: {frame.data}") from frame.data
        else:  # CLOSE with an error code; CLOSED: the connection ended without a close frame
            raise ConnectionError(f"connection to coordinator closed abnormally (close code {ws.close_code}"
                                  f"{f': {frame.extra}' if frame.extra else ''})")


async def keepalive(ws: aiohttp.ClientWebSocketResponse, ttl: float, high_availability: bool,
                    pong: asyncio.Event) -> None:
    """How the worker finds a dead coordinator, with the one number of the session's contract
    (``registered``): its TTL. Raises ConnectionError when it finds one.

    - A dead host or path: the heartbeats the worker sends every interval stay unacknowledged,
      and the kernel ends the connection once data has waited a TTL for its ACK
      (``TCP_USER_TIMEOUT``, Linux; nothing for the coordinator's process to do).
    - A coordinator process that is alive to TCP but not answering (SIGSTOP, a stuck loop): a
      WebSocket ping every TTL (every half of it with ``--high-availability``); no pong within
      the TTL ends the session. Pings go every TTL, not every heartbeat, because each pong is
      a write the coordinator makes for every worker: at 10,000 idle workers, pinging every
      second made the pongs a third of its CPU (``benchmarks/fleet.py``).

    The coordinator never pings; each ping is also a sign of life to it. aiohttp's
    ``heartbeat=`` is not used: its pong timeout is half the interval and cannot be set, so a
    coordinator busy for half a second would cost a reconnect and every provisional
    assignment with it."""
    bound_unacknowledged(ws, ttl)
    period = ping_period(ttl, high_availability)
    while True:
        await asyncio.sleep(period)
        pong.clear()
        try:
            async with asyncio.timeout(ttl):
                await ws.ping()  # waits while the send buffer is full, as a dead path leaves it
                await pong.wait()
        except TimeoutError:
            raise ConnectionError(f"no pong from the coordinator within {ttl:g}s") from None
