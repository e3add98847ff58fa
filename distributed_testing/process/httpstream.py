"""HTTP handling the coordinator and the dashboard share.

``chunks_while_connected``: an upstream HTTP answer read chunk by chunk while the client it is
relayed to is still there. Used by the standby's forwarding of event streams
(``coordinator/forward.py``) and the dashboard's event relay (``dashboard/app.py``): aiohttp tells
a handler nothing when its client goes away, and a stream that stays silent for a keepalive
interval would otherwise hold its upstream connection (and its place under the caps) that long.

``end_after_broken_body``: the middlewares of both apps pass each answer through it, so a body
that does not decode ends its connection however it was answered; ``unreadable`` is the 400 a
handler that tried to read one raises."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import aiohttp
from aiohttp import web

from ..errors import ValidationError


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


def end_after_broken_body(request: web.Request, resp: web.StreamResponse) -> web.StreamResponse:
    """``resp``, ending the connection when ``request``'s compressed body turned out not to
    decode and its handler did not read it (a refusal before the body, a route that takes none).
    aiohttp would read the rest to keep the connection and log the decoding error as an
    unhandled exception with its traceback: any client, a refused one too, could fill the log so.
    (A body still arriving when the answer is ready is left to aiohttp.)"""
    content = request.content if request.body_exists else None
    if content is not None and not content.is_eof() and content.exception() is not None:
        content.feed_eof()  # the parser gave up on it: nothing more comes
        resp.force_close()  # and the connection's framing is lost
    return resp


def unreadable(exc: web.RequestPayloadError) -> ValidationError:
    """The 400 on ``(body)`` for a body that cannot be read (a ``Content-Encoding`` it does not
    decode with); ``end_after_broken_body`` then ends the connection after the answer."""
    cause = exc.__cause__ or exc
    detail = " ".join(str(getattr(cause, "message", None) or cause).split())
    return ValidationError([{"field": "(body)", "error": f"cannot read the body: {detail}"}])
