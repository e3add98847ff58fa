"""``chunks_while_connected``: an upstream HTTP answer read chunk by chunk while the client it is
relayed to is still there. Shared by the standby's forwarding of event streams
(``coordinator/forward.py``) and the dashboard's event relay (``dashboard/app.py``): aiohttp tells
a handler nothing when its client goes away, and a stream that stays silent for a keepalive
interval would otherwise hold its upstream connection (and its place under the caps) that long."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import aiohttp
from aiohttp import web


class ClientGone(Exception):
    """The client of a relayed answer went away (or its connection broke) while it was passed on."""


async def chunks_while_connected(request: web.Request, upstream: aiohttp.ClientResponse,
                                 every_s: float) -> AsyncGenerator[bytes, None]:
    """``upstream``'s body, chunk by chunk, until its end; ``ClientGone`` once ``request``'s
    connection is found closing (looked at every ``every_s`` while upstream is silent). Close it
    (``contextlib.aclosing``) when leaving early: the pending read is cancelled then."""
    read: asyncio.Future[bytes] | None = None
    try:
        while True:
            read = read or asyncio.ensure_future(upstream.content.readany())
            done, _ = await asyncio.wait({read}, timeout=every_s)
            if not done:
                if request.transport is None or request.transport.is_closing():
                    raise ClientGone
                continue
            chunk, read = read.result(), None
            if not chunk:
                return
            yield chunk
    finally:
        if read is not None:
            read.cancel()
