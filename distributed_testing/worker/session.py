"""The worker's connection to a coordinator, apart from what it carries: the handshake and how
it is refused, the timeouts and reconnect pacing, and how a dead coordinator is noticed
(``ping_period``, ``bound_unacknowledged``; the rules are in ``WorkerAgent._keepalive``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from typing import Any

import aiohttp
from multidict import CIMultiDictProxy

from ..errors import ProtocolError

log = logging.getLogger(__name__)
OPEN_TIMEOUT_S = 10.0  # proxy, TCP connect and WebSocket handshake together
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


def ping_period(ttl_s: float, high_availability: bool) -> float:
    """Seconds between a worker's WebSocket pings in a session whose TTL is ``ttl_s``: the TTL,
    half of it with ``--high-availability`` (see ``WorkerAgent._keepalive``)."""
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
