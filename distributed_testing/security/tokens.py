"""Short-lived JWTs (HS256) minted from an API key.

A token is a bearer credential derived from one :class:`KeyRecord`. Its claims::

    iss  issuer, "distributed_testing" unless configured otherwise
    sub  key_id of the API key it was minted from
    role role of that key at issue time
    iat  issued at, nbf not before, exp expires (integer unix seconds)
    jti  random token id (for audit logs)
    auth_time  when the session began: when its API key was last presented (OIDC's claim name)

A token may be exchanged for a fresh one (renewal), but only within ``max_session_age_s`` of its
``auth_time``, which the new token keeps, and no renewed token expires later than that: a stolen
JWT cannot be stretched into a credential that lives forever. After that, only the API key gets
a new session. Tokens from versions without ``auth_time`` count their ``iat`` as the start.

Only ``HS256`` is accepted, always passed to PyJWT as an explicit allow-list, so ``alg=none``
and algorithm-confusion tokens are rejected. PyJWT's own time checks read the real clock, so
they are switched off and :func:`verify_token` checks ``exp``/``nbf``/``iat`` against the
``now`` argument instead: verification is a pure function of its inputs.

Verifying a token proves only that this coordinator issued it. Revocation of the underlying
key is enforced by :func:`distributed_testing.security.auth.authenticate`, which looks the key
up on every request.
"""

from __future__ import annotations

import math
import secrets
from typing import Annotated, Any

import jwt
import msgspec

from distributed_testing.errors import AuthError, ConfigError, ValidationError
from distributed_testing.security.keys import KeyRecord, check_usable
from distributed_testing.security.roles import Role

__all__ = [
    "ALGORITHM",
    "DEFAULT_ISSUER",
    "DEFAULT_MAX_SESSION_AGE_S",
    "DEFAULT_TTL_S",
    "MAX_TOKEN_LENGTH",
    "MAX_TTL_S",
    "MIN_SECRET_BYTES",
    "TokenClaims",
    "check_secret",
    "generate_secret",
    "issue_token",
    "verify_token",
]

ALGORITHM = "HS256"
DEFAULT_ISSUER = "distributed_testing"
DEFAULT_TTL_S = 900
DEFAULT_MAX_SESSION_AGE_S = 24 * 3600
MAX_TTL_S = 24 * 3600
MIN_SECRET_BYTES = 32
MAX_TOKEN_LENGTH = 4096
_REQUIRED_CLAIMS = ["iss", "sub", "role", "iat", "nbf", "exp", "jti"]

Timestamp = Annotated[int, msgspec.Meta(ge=0, lt=2**40)]
"""Integer unix seconds, bounded so absurd values fail decoding instead of meaning 'forever'."""


class TokenClaims(msgspec.Struct, frozen=True, kw_only=True):
    """The verified claims of a token; times are integer unix seconds."""

    iss: str
    sub: str
    role: Role
    iat: Timestamp
    nbf: Timestamp
    exp: Timestamp
    jti: str
    auth_time: Timestamp | None = None

    @property
    def session_start(self) -> int:
        """When this token's session began (``auth_time``; ``iat`` for tokens without it)."""
        return self.iat if self.auth_time is None else self.auth_time


def generate_secret() -> bytes:
    """Return a fresh random token-signing secret of :data:`MIN_SECRET_BYTES` bytes."""
    return secrets.token_bytes(MIN_SECRET_BYTES)


def check_secret(secret: bytes, what: str = "token signing secret") -> None:
    """Raise :class:`ConfigError` (naming ``what``) unless ``secret`` is at least 32 bytes."""
    if not isinstance(secret, bytes) or len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(f"{what} must be at least {MIN_SECRET_BYTES} bytes")


def issue_token(
    secret: bytes,
    key_record: KeyRecord,
    now: float,
    ttl_s: int = DEFAULT_TTL_S,
    issuer: str = DEFAULT_ISSUER,
    *,
    session_start: int | None = None,
    max_session_age_s: int = DEFAULT_MAX_SESSION_AGE_S,
) -> tuple[str, TokenClaims]:
    """Mint a token for ``key_record``; return ``(token, claims)``.

    ``iat = nbf = floor(now)``; ``exp = iat + ttl_s``, but never later than the key's own
    ``expires_at`` (a token never outlives its key) nor than ``auth_time + max_session_age_s``.
    ``session_start`` is the ``auth_time`` of the token being renewed (``None``: the API key
    itself was presented, so a session begins now). Raises :class:`AuthError` if the key is
    revoked or expired at ``now`` or the session is ``max_session_age_s`` old or older,
    :class:`ValidationError` if ``ttl_s`` is not an integer in ``1..MAX_TTL_S``, and
    :class:`ConfigError` for a short secret.
    """
    check_secret(secret)
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or not 0 < ttl_s <= MAX_TTL_S:
        raise ValidationError(
            [{"field": "ttl_s", "error": f"must be an integer between 1 and {MAX_TTL_S}"}]
        )
    check_usable(key_record, now)
    iat = math.floor(now)
    auth_time = iat if session_start is None else session_start
    if iat >= auth_time + max_session_age_s:
        raise AuthError(
            f"session too old to renew: it began {iat - auth_time} s ago and the maximum session age is "
            f"{max_session_age_s} s; get a new token with the API key"
        )
    exp = min(iat + ttl_s, auth_time + max_session_age_s)
    if key_record.expires_at is not None:
        exp = min(exp, math.floor(key_record.expires_at))
    claims = TokenClaims(
        iss=issuer,
        sub=key_record.key_id,
        role=key_record.role,
        iat=iat,
        nbf=iat,
        exp=exp,
        jti=secrets.token_urlsafe(16),
        auth_time=auth_time,
    )
    token = jwt.encode(msgspec.to_builtins(claims), secret, algorithm=ALGORITHM)
    return token, claims


def _decode(secret: bytes, token: str, issuer: str) -> dict[str, Any]:
    """Check the signature, algorithm, issuer and claim presence; return the raw payload."""
    try:
        payload: dict[str, Any] = jwt.decode(
            token,
            secret,
            algorithms=[ALGORITHM],
            issuer=issuer,
            options={
                "verify_signature": True,
                "verify_exp": False,
                "verify_nbf": False,
                "verify_iat": False,
                "verify_iss": True,
                "verify_aud": True,
                "require": _REQUIRED_CLAIMS,
            },
        )
    except jwt.InvalidSignatureError as exc:
        raise AuthError("token signature is invalid") from exc
    except jwt.InvalidAlgorithmError as exc:
        raise AuthError(f"token algorithm is not allowed (only {ALGORITHM})") from exc
    except jwt.InvalidIssuerError as exc:
        raise AuthError("token has the wrong issuer") from exc
    except jwt.MissingRequiredClaimError as exc:
        raise AuthError(f"token lacks the {exc.claim!r} claim") from exc
    except jwt.DecodeError as exc:
        raise AuthError("token is malformed") from exc
    except jwt.InvalidTokenError as exc:
        raise AuthError(f"token is invalid: {exc}") from exc
    return payload


def verify_token(
    secret: bytes,
    token: str,
    now: float,
    leeway_s: float = 0,
    issuer: str = DEFAULT_ISSUER,
) -> TokenClaims:
    """Verify ``token`` at time ``now`` and return its claims.

    Raises :class:`AuthError` naming the reason: malformed or over-long token, algorithm other
    than HS256, bad signature (tampering or another secret), wrong issuer, missing or
    ill-typed claims, a lifetime (``exp - iat``) outside ``0..MAX_TTL_S``, not yet valid (``now < nbf - leeway_s`` or ``iat > now + leeway_s``), or
    expired (``now >= exp + leeway_s``). Raises :class:`ConfigError` for a short secret.
    A non-finite ``now`` is a caller bug: ``ValueError``. Does not consult the key store: see ``auth.authenticate`` for revocation.
    """
    check_secret(secret)
    if not math.isfinite(now):
        raise ValueError("now must be a finite number of unix seconds")
    if len(token) > MAX_TOKEN_LENGTH:
        raise AuthError("token is too long")
    if not token.isascii():
        raise AuthError("token is malformed")
    payload = _decode(secret, token, issuer)
    try:
        claims = msgspec.convert(payload, TokenClaims)
    except msgspec.ValidationError as exc:
        raise AuthError(f"token claims are invalid: {exc}") from exc
    if not 0 <= claims.exp - claims.iat <= MAX_TTL_S:
        raise AuthError("token lifetime is invalid")
    if claims.session_start > claims.iat:
        raise AuthError("token session starts after it was issued")
    if now < claims.nbf - leeway_s or claims.iat > now + leeway_s:
        raise AuthError("token is not yet valid")
    if now >= claims.exp + leeway_s:
        raise AuthError("token has expired")
    return claims
