"""One rooted exception tree for the whole project.

::

    DTError
    ├── ConfigError              bad flag, variable or config file value (names the source)
    ├── ProtocolError            a wire message we must reject
    │   ├── DecodeError          malformed bytes / unknown type / bad field (cause chained)
    │   ├── FrameTooLarge        frame over the size limit
    │   └── SignatureError       bad or missing HMAC
    │       ├── StaleMessage     timestamp outside the accepted window
    │       └── ReplayedMessage  sequence number not strictly increasing
    ├── AuthError                no / bad / expired / revoked credentials      (HTTP 401)
    │   └── PermissionDenied     valid credentials, wrong role                  (HTTP 403)
    ├── ValidationError          user input that does not match the schema     (HTTP 400)
    │   └── TooLarge             a body or bundle over a size cap               (HTTP 413)
    ├── RateLimited              too many failed logins from this address       (HTTP 429)
    ├── Unavailable              at a capacity limit; try again later           (HTTP 503)
    ├── NotFound                 no such task / key / worker                    (HTTP 404)
    ├── Conflict                 same id, different body                        (HTTP 409)
    ├── IllegalTransition        task state machine asked to do the impossible
    ├── StoreError               persistence failed; fatal to the coordinator      (HTTP 503)
    │   └── Fenced               a write refused: this coordinator no longer holds the lease
    └── ExecutionError           an executor could not run a task (infrastructure, not the
                                 user's test failing: that is a result, not an exception)

A failed user task is data (a result with a status), never one of these.
"""

from __future__ import annotations

import math
from typing import Any


class DTError(Exception):
    """Root of every exception this package raises on purpose."""


class ConfigError(DTError):
    """A configuration value is missing or invalid; the message names the flag or variable."""


class ProtocolError(DTError):
    """A message from a peer was rejected. ``code`` is the stable wire name of the reason."""

    code = "protocol_error"


class DecodeError(ProtocolError):
    code = "malformed"


class FrameTooLarge(ProtocolError):
    code = "too_large"


class SignatureError(ProtocolError):
    code = "bad_signature"


class StaleMessage(SignatureError):
    code = "stale_timestamp"


class ReplayedMessage(SignatureError):
    code = "replayed_sequence"


class AuthError(DTError):
    """Missing, invalid, expired or revoked credentials."""


class PermissionDenied(AuthError):
    """Valid credentials whose role may not do this."""


class ValidationError(DTError):
    """User input failed validation. ``errors`` lists ``{"field": ..., "error": ...}`` items."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        self.errors = errors
        summary = "; ".join(f"{e.get('field', '?')}: {e.get('error', '?')}" for e in errors)
        super().__init__(summary or "invalid input")


class TooLarge(ValidationError):
    """An upload over one of the coordinator's size caps (a bundle over ``--max-bundle-mb``, a
    file over ``--max-bundle-file-mb``); ``errors`` names the largest files."""


class RateLimited(DTError):
    """A client address failed authentication too often, or a key is at its quota; it may try
    again in ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message)


class Unavailable(DTError):
    """The coordinator is at one of its capacity limits; try again in ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message)


class NotFound(DTError):
    pass


class Conflict(DTError):
    pass


class IllegalTransition(DTError):
    pass


class StoreError(DTError):
    pass


class Fenced(StoreError):
    """A store write was refused because the fence set on the store (a lease holder and epoch)
    no longer matches the lease row: another coordinator took over, or the lease expired. Nothing
    of the refused write was committed."""


class ExecutionError(DTError):
    """The executor itself could not run the task (bad config, missing library, crash)."""


# The HTTP answer for each error the REST API and the dashboard may raise (the tree above);
# anything else is a 500. Most specific first: PermissionDenied before AuthError.
HTTP_STATUS: tuple[tuple[type[DTError], int], ...] = (
    (TooLarge, 413), (ValidationError, 400), (PermissionDenied, 403), (AuthError, 401), (NotFound, 404), (Conflict, 409),
    (RateLimited, 429), (Unavailable, 503), (StoreError, 503))


def http_status(exc: DTError) -> int:
    return next((code for cls, code in HTTP_STATUS if isinstance(exc, cls)), 500)


def http_body(exc: DTError) -> dict[str, Any]:
    """The JSON error body every 4xx/5xx of ours has: ``error``, ``message`` (and ``errors``)."""
    body: dict[str, Any] = {"error": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, ValidationError):
        body["errors"] = exc.errors
    return body


def http_headers(exc: DTError, status: int) -> dict[str, str] | None:
    if isinstance(exc, RateLimited | Unavailable):
        return {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}
    return {"WWW-Authenticate": "Bearer"} if status == 401 else None
