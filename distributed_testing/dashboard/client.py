"""The dashboard's way to the coordinator: its REST API, with the signed-in user's own key.

With several coordinator URLs the client uses the first one whose ``/healthz`` answers, in the
order given (a member that failed just now last: ``client.Members``), and keeps using it until a
request to it fails to connect or to answer; then it looks again. Any member serves every request
(a standby forwards it to the leader). Redirects are not followed: the user's key goes only to the
configured members (docs/security.md, "Redirects"). A connection gets ``CONNECT_TIMEOUT_S`` and an
answer's first byte ``FIRST_BYTE_S`` (the event stream aside). ``health()`` reports every URL for
the Overview page.
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

log = logging.getLogger(__name__)
HEALTH_TIMEOUT_S = 2.0
REQUEST_TIMEOUT_S = 30.0


class CoordinatorClient:
    """REST calls to the first healthy coordinator. Create inside the running loop; ``close()``."""

    def __init__(self, urls: Sequence[str], ssl_context: ssl.SSLContext | bool = True) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.members = Members(self.urls)
        self._ssl = ssl_context
        self._http: aiohttp.ClientSession | None = None
        self._current: str | None = None
        self._lock = asyncio.Lock()

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._ssl, limit=200),
                                               timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S))
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

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
                      json: Any = None) -> tuple[int, Any]:
        """(status, decoded JSON body) of ``method path`` as the holder of ``credential``."""
        base = await self.base()
        data = msgspec.json.encode(json) if json is not None else None
        headers = {"Authorization": f"Bearer {credential}"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S, sock_connect=CONNECT_TIMEOUT_S, sock_read=FIRST_BYTE_S)
        try:
            async with self.http.request(method, base + path, params=params, data=data, headers=headers,
                                         allow_redirects=False, timeout=timeout) as r:
                return r.status, msgspec.json.decode(await r.read()) if r.content_length != 0 else None
        except (aiohttp.ClientConnectionError, TimeoutError):
            self._lost(base)
            raise

    def _lost(self, url: str) -> None:
        """``url`` failed to connect or to answer: look for a healthy member on the next call."""
        self.members.failed(url, time.monotonic())
        self._current = None

    async def open_events(self, credential: str, last_event_id: str | None) -> aiohttp.ClientResponse:
        """The coordinator's event stream (``GET /api/v1/events``), open; the caller closes it."""
        base = await self.base()
        headers = {"Authorization": f"Bearer {credential}", "Accept": "text/event-stream"}
        if last_event_id:
            headers["Last-Event-ID"] = last_event_id
        try:
            return await self.http.get(base + "/api/v1/events", headers=headers, allow_redirects=False,
                                       timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S))
        except (aiohttp.ClientConnectionError, TimeoutError):
            self._lost(base)
            raise
