"""Authentication: turn a bearer credential (API key or JWT) into a :class:`Principal`.

This is the one function the HTTP and WebSocket layers call per request. Authorization
(what the principal may do) is then ``roles.require(principal.role, permission)``.

Pure: the key store is reached only through the ``lookup_key`` callable and the clock is ``now``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Literal

import msgspec

from distributed_testing.errors import AuthError
from distributed_testing.security.keys import (
    KeyRecord,
    check_usable,
    is_api_key,
    parse_key,
    verify_key,
)
from distributed_testing.security.roles import Role
from distributed_testing.security.tokens import MAX_TOKEN_LENGTH, verify_token

__all__ = ["KeyLookup", "Principal", "authenticate", "parse_authorization_header"]

KeyLookup = Callable[[str], KeyRecord | None]
"""Return the stored record for a key id, or ``None`` when there is none."""

MAX_HEADER_LENGTH = MAX_TOKEN_LENGTH + 64
# RFC 6750 "b64token": the credential characters a Bearer header may carry.
_BEARER_RE = re.compile(r"(?P<scheme>\S+) +(?P<credential>[A-Za-z0-9\-._~+/]+=*)")


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """Who is calling: the API key behind the credential, and how it was presented.

    ``role`` and ``name`` come from the stored key record, not from token claims.
    ``token_exp`` is the token's expiry (unix seconds) when ``via == "jwt"``, else ``None``;
    ``session_start`` likewise its ``auth_time``.
    """

    key_id: str
    role: Role
    name: str
    via: Literal["api_key", "jwt"]
    token_exp: int | None = None
    session_start: int | None = None  # the token's auth_time when via == "jwt" (for renewal)
    allow_code: bool = False  # the key was created with --allow-code: it may ship bundles


def parse_authorization_header(value: str | None) -> str:
    """Return the credential from an ``Authorization: Bearer <credential>`` header value.

    The scheme is matched case-insensitively (RFC 7235). Raises :class:`AuthError` when the
    header is missing or empty, uses another scheme, or is malformed. Never echoes the value.
    """
    if value is None or not value.strip():
        raise AuthError("missing Authorization header")
    if len(value) > MAX_HEADER_LENGTH:
        raise AuthError("Authorization header is too long")
    match = _BEARER_RE.fullmatch(value.strip())
    if match is None:
        raise AuthError("malformed Authorization header; expected 'Bearer <credential>'")
    if match.group("scheme").lower() != "bearer":
        raise AuthError("unsupported Authorization scheme; expected 'Bearer'")
    return match.group("credential")


def _lookup(lookup_key: KeyLookup, key_id: str) -> KeyRecord:
    record = lookup_key(key_id)
    if record is None:
        raise AuthError("unknown API key")
    return record


def _from_token(
    credential: str, lookup_key: KeyLookup, secret: bytes, now: float, leeway_s: float
) -> Principal:
    claims = verify_token(secret, credential, now, leeway_s=leeway_s)
    record = _lookup(lookup_key, claims.sub)
    check_usable(record, now)
    if claims.role != record.role:
        raise AuthError("token role no longer matches its API key")
    if claims.iat < math.floor(record.created_at):
        raise AuthError("token predates its API key")
    return Principal(
        key_id=record.key_id, role=record.role, name=record.name, via="jwt", token_exp=claims.exp,
        session_start=claims.session_start, allow_code=record.allow_code,
    )


def authenticate(
    credential: str,
    lookup_key: KeyLookup,
    secret: bytes,
    now: float,
    leeway_s: float = 0,
) -> Principal:
    """Verify ``credential`` (an API key or a JWT) at ``now`` and return its :class:`Principal`.

    A credential with the ``dtk_`` prefix is treated as an API key, anything else as a JWT.
    For both, the key record is fetched with ``lookup_key`` and must exist and be neither
    revoked nor expired, so revoking a key disables every token minted from it at once.
    For a JWT, its ``role`` claim must still equal the record's role and it must not have been
    issued before the record was created (guards against a reused key id).

    Raises :class:`AuthError` with a reason for every rejected credential; the reason names the
    failure (for logs) and never contains the credential. Clients should be shown a generic
    message. Exceptions raised by ``lookup_key`` itself (e.g. ``StoreError``) propagate.
    ``ConfigError`` is raised for a short ``secret``.
    """
    if not credential:
        raise AuthError("missing credential")
    if is_api_key(credential):
        # An unknown key id is checked against a record no key matches: the same hash, compare
        # and answer as a wrong secret, so neither timing nor message tells a key id exists.
        key_id = parse_key(credential)
        record = lookup_key(key_id) or KeyRecord(key_id=key_id, name="", role=Role.VIEWER, hash="0" * 64,
                                                created_at=0.0)
        verify_key(credential, record, now)
        return Principal(key_id=record.key_id, role=record.role, name=record.name, via="api_key",
                         allow_code=record.allow_code)
    return _from_token(credential, lookup_key, secret, now, leeway_s)
