"""The dashboard's way to the coordinator: its REST API, with the signed-in user's own key.

With several coordinator URLs the client uses the first one whose ``/healthz`` answers, in the
order given (a member that failed just now last: ``client.Members``), and keeps using it until a
request to it fails to connect or to answer; then it looks again. Any member serves every request
(a standby forwards it to the leader). Redirects are not followed: the user's key goes only to the
configured members (docs/security.md, "Redirects"). A connection gets ``CONNECT_TIMEOUT_S`` and an
answer's first byte ``FIRST_BYTE_S`` (the event stream aside). ``health()`` reports every URL for
the Overview page.

Event streams use a connection pool of their own (``open_events``), so streams held open never
leave the REST calls of other users waiting for a connection (the dashboard caps streams per
session and per key, see ``sessions``). Mounted in a coordinator, the client shows that
coordinator's proxy secret and names the browser each call is for (``security/throttle.py``):
failed sign-ins then count against the browser's address, not against the loopback.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
import msgspec

from ..client import CONNECT_TIMEOUT_S, FIRST_BYTE_S, Members
from ..errors import Unavailable
from ..security.throttle import CLIENT_HEADER, PROXY_HEADER

log = logging.getLogger(__name__)
HEALTH_TIMEOUT_S = 2.0
REQUEST_TIMEOUT_S = 30.0
REST_POOL = 200  # connections for REST calls; event streams have a pool of their own


class CoordinatorClient:
    """REST calls to the first healthy coordinator. Create inside the running loop; ``close()``."""

    def __init__(self, urls: Sequence[str], ssl_context: ssl.SSLContext | bool = True,
                 proxy_secret: str | None = None) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.members = Members(self.urls)
        self._ssl = ssl_context
        self._proxy_secret = proxy_secret
        self._http: aiohttp.ClientSession | None = None
        self._streams: aiohttp.ClientSession | None = None
        self._current: str | None = None
        self._lock = asyncio.Lock()

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._ssl, limit=REST_POOL),
                                               timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S))
        return self._http

    @property
    def streams(self) -> aiohttp.ClientSession:
        """The event streams' own pool: unbounded here, bounded by the per-session and per-key caps."""
        if self._streams is None:
            self._streams = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._ssl, limit=0))
        return self._streams

    async def close(self) -> None:
        for http in (self._http, self._streams):
            if http is not None:
                await http.close()

    def _headers(self, credential: str, client: str | None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {credential}"}
        if self._proxy_secret and client:
            headers[PROXY_HEADER], headers[CLIENT_HEADER] = self._proxy_secret, client
        return headers

    def adopt_local(self, sockname: Any, secure: bool) -> None:
        """Use the coordinator this app is mounted in, at the local address a request reached
        (``sockname``). Its TLS certificate is not checked: the peer is this very process."""
        if not sockname:
            raise Unavailable("the dashboard cannot tell its coordinator's address", 1.0)
        host, port = sockname[0], sockname[1]
        host = f"[{host}]" if ":" in host else host
        self.urls = [f"{'https' if secure else 'http'}://{host}:{port}"]
        self.members = Members(self.urls)
        if secure:
            self._ssl = False

    async def health(self) -> list[dict[str, Any]]:
        """Every coordinator URL with its ``/healthz`` answer or the reason it has none."""
        return list(await asyncio.gather(*(self._probe(u) for u in self.urls)))

    async def _probe(self, url: str) -> dict[str, Any]:
        try:
            async with self.http.get(url + "/healthz", timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)) as r:
                body = await r.json(content_type=None)
                return {"url": url, "healthy": r.status == 200, "status": r.status, "health": body,
                        "in_use": url == self._current}
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return {"url": url, "healthy": False, "error": f"{type(exc).__name__}: {exc}", "in_use": False}

    async def base(self) -> str:
        """The coordinator in use; Unavailable when none is healthy."""
        if self._current is not None:
            return self._current
        async with self._lock:
            if self._current is None:
                for url in self.members.order(time.monotonic()):
                    if (await self._probe(url))["healthy"]:
                        self._current = url
                        log.info("dashboard uses coordinator %s", url)
                        break
                    self.members.failed(url, time.monotonic())
                else:
                    raise Unavailable(f"no coordinator answers /healthz: {', '.join(self.urls)}", 2.0)
            return self._current

    async def request(self, method: str, path: str, credential: str, *, params: Mapping[str, str] | None = None,
                      json: Any = None, client: str | None = None) -> tuple[int, Any]:
        """(status, decoded JSON body) of ``method path`` as the holder of ``credential``, for the
        browser at ``client``."""
        status, body, _ = await self.call(method, path, credential, params=params, json=json, client=client)
        return status, body

    async def call(self, method: str, path: str, credential: str, *, params: Mapping[str, str] | None = None,
                   json: Any = None, client: str | None = None) -> tuple[int, Any, Mapping[str, str]]:
        """``request`` with the answer's headers too (a 429's ``Retry-After``)."""
        base = await self.base()
        data = msgspec.json.encode(json) if json is not None else None
        headers = self._headers(credential, client)
        if data is not None:
            headers["Content-Type"] = "application/json"
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S, sock_connect=CONNECT_TIMEOUT_S, sock_read=FIRST_BYTE_S)
        try:
            async with self.http.request(method, base + path, params=params, data=data, headers=headers,
                                         allow_redirects=False, timeout=timeout) as r:
                body = msgspec.json.decode(await r.read()) if r.content_length != 0 else None
                return r.status, body, r.headers
        except (aiohttp.ClientConnectionError, TimeoutError):
            self._lost(base)
            raise

    def _lost(self, url: str) -> None:
        """``url`` failed to connect or to answer: look for a healthy member on the next call."""
        self.members.failed(url, time.monotonic())
        self._current = None

    async def open_events(self, credential: str, last_event_id: str | None,
                          client: str | None = None) -> aiohttp.ClientResponse:
        """The coordinator's event stream (``GET /api/v1/events``), open; the caller closes it."""
        base = await self.base()
        headers = {**self._headers(credential, client), "Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S)
        for attempt in range(2):  # a connect past the bound on a busy coordinator is tried once more
            try:
                return await self.streams.get(base + "/api/v1/events", headers=headers, allow_redirects=False,
                                              timeout=timeout)
            except (aiohttp.ClientConnectionError, TimeoutError):
                self._lost(base)
                if attempt:
                    raise
                base = await self.base()  # the next member, or the same one when it is the only one
        raise AssertionError("unreachable")
