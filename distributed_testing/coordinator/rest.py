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
from ..process.httpstream import unreadable
from ..security import auth as sa
from ..tasks import spec as specs

PRINCIPAL = web.RequestKey("principal", sa.Principal)
AUTHENTICATED = "authenticated"  # a route's permission: any valid credential, whatever its role


def json_response(data: Any, *, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """``data`` as a JSON response, encoded once to bytes. Strict JSON whatever workers reported:
    NaN and infinities become null, bytes base64 (msgspec's rules)."""
    return web.Response(body=msgspec.json.encode(data), status=status, headers=headers,
                        content_type="application/json", charset="utf-8")


async def read_body(request: web.Request) -> bytes:
    """The request's body, decoded per its ``Content-Encoding``; ValidationError on ``(body)``
    when it cannot be (the middleware then ends the connection after the answer: its framing is
    lost)."""
    try:
        return await request.read()
    except web.RequestPayloadError as exc:
        raise unreadable(exc) from exc


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
