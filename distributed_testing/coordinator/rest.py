"""What every REST handler shares: the JSON response, the request body, and the request keys the
middleware (``api.error_middleware``) sets. Handler modules (``api``, ``keys_api``,
``bundles_api``) import this; it imports none of them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgspec
from aiohttp import web

from ..errors import ValidationError
from ..security import auth as sa
from ..tasks import spec as specs

PRINCIPAL = web.RequestKey("principal", sa.Principal)
CLOSE_AFTER = web.RequestKey("close_after", bool)  # the answer ends the connection
AUTHENTICATED = "authenticated"  # a route's permission: any valid credential, whatever its role


def json_response(data: Any, *, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """``data`` as a JSON response, encoded once to bytes. Strict JSON whatever workers reported:
    NaN and infinities become null, bytes base64 (msgspec's rules)."""
    return web.Response(body=msgspec.json.encode(data), status=status, headers=headers,
                        content_type="application/json", charset="utf-8")


async def read_body(request: web.Request) -> bytes:
    """The request's body, decoded per its ``Content-Encoding``; ValidationError on ``(body)``
    when it cannot be (the connection is then closed after the answer: its framing is lost)."""
    try:
        return await request.read()
    except web.RequestPayloadError as exc:
        raise unreadable(request, exc) from exc


def unreadable(request: web.Request, exc: web.RequestPayloadError) -> ValidationError:
    """The answer to a body that cannot be read (a ``Content-Encoding`` it does not decode
    with): a 400 on ``(body)``, the connection closed after it (its framing is lost)."""
    request.content.feed_eof()  # nothing more to read: no lingering read of a broken payload
    request[CLOSE_AFTER] = True
    cause = exc.__cause__ or exc
    detail = getattr(cause, "message", None) or str(cause)
    return ValidationError([{"field": "(body)", "error": f"cannot read the body: {' '.join(str(detail).split())}"}])


async def json_body(request: web.Request) -> Any:
    return specs.decode_json(await read_body(request))


def positive_seconds(value: Any, field: str) -> float:
    """``value`` as a finite number of seconds > 0, else ValidationError on ``field``."""
    try:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    except OverflowError:  # an integer too large for a float
        ok = False
    if not ok:
        raise ValidationError([{"field": field, "error": "must be a positive number of seconds"}])
    return float(value)
