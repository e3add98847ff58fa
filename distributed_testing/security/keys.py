"""API keys: generation, parsing, hashing at rest and verification.

Format of a plaintext key (shown to its owner once, never stored)::

    dtk_<key_id>_<secret>
    dtk_k3x9q2mz_Jc2Zq0...43 chars...

* ``dtk_`` is a fixed, greppable prefix so secret scanners and log scrubbers can find leaked keys.
* ``key_id`` is 8 characters of ``[a-z0-9]`` (about 41 bits). It is *public*: it names the key in
  listings, logs and JWT ``sub`` claims, and lets the coordinator fetch the one record to check
  without scanning every hash. The store must enforce its uniqueness (a collision is rare; the
  caller then generates again).
* ``secret`` is ``secrets.token_urlsafe(32)``: 32 random bytes, 43 url-safe base64 characters.

At rest only :attr:`KeyRecord.hash` is kept: SHA-256 over a versioned domain tag and the whole
plaintext key. A slow password hash (bcrypt, scrypt, argon2) exists to make guessing *low-entropy*
passwords expensive after a database leak; a 256-bit random secret cannot be guessed at any speed,
so a fast hash is equally safe here and keeps per-request verification cheap. Comparison uses
:func:`hmac.compare_digest`.

Pure apart from the OS random source: the clock is always the ``now`` argument (unix seconds).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import re
import secrets
import string
from typing import Literal

import msgspec

from distributed_testing.errors import AuthError, ValidationError
from distributed_testing.security.roles import Role, parse_role

__all__ = [
    "KEY_PREFIX",
    "KeyRecord",
    "KeyStatus",
    "check_usable",
    "generate_key",
    "hash_key",
    "is_api_key",
    "key_status",
    "parse_key",
    "revoke",
    "verify_key",
]

logger = logging.getLogger(__name__)

KEY_PREFIX = "dtk_"
KEY_ID_LENGTH = 8
SECRET_BYTES = 32
MAX_NAME_LENGTH = 100

_KEY_ID_ALPHABET = string.ascii_lowercase + string.digits
_SECRET_CHARS = -(-SECRET_BYTES * 4 // 3)  # unpadded base64 length of SECRET_BYTES: 43
_KEY_RE = re.compile(
    rf"{KEY_PREFIX}(?P<key_id>[a-z0-9]{{{KEY_ID_LENGTH}}})_[A-Za-z0-9_-]{{{_SECRET_CHARS}}}"
)
_HASH_DOMAIN = b"distributed_testing/api-key/v1\x00"
INVALID_KEY = "invalid API key"  # unknown key id and wrong secret alike

KeyStatus = Literal["active", "expired", "revoked"]


class KeyRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the store keeps about one API key. Holds no secret: only its hash.

    ``created_at``, ``expires_at`` and ``revoked_at`` are unix seconds. A key is expired when
    ``now >= expires_at``; it is revoked as soon as ``revoked_at`` is set, whatever ``now`` is
    (revocation never waits on clock agreement). Records are immutable: revoking produces a new
    record (:func:`revoke`).
    """

    key_id: str
    name: str
    role: Role
    hash: str
    created_at: float
    expires_at: float | None = None
    revoked_at: float | None = None
    allow_code: bool = False  # created with --allow-code: may upload bundles and submit tasks running them


def hash_key(plaintext: str) -> str:
    """Hex SHA-256 of the domain tag and ``plaintext``: the value stored in :attr:`KeyRecord.hash`."""
    return hashlib.sha256(_HASH_DOMAIN + plaintext.encode("utf-8")).hexdigest()


def is_api_key(credential: str) -> bool:
    """True when ``credential`` claims to be an API key (has the ``dtk_`` prefix); not validated."""
    return credential.startswith(KEY_PREFIX)


def _validate_new_key(name: str, now: float, expires_in_s: float | None) -> list[dict[str, str]]:
    errors: list[dict[str, str]] = []
    if not name.strip():
        errors.append({"field": "name", "error": "must not be empty"})
    elif len(name) > MAX_NAME_LENGTH:
        errors.append({"field": "name", "error": f"must be at most {MAX_NAME_LENGTH} characters"})
    elif not name.isprintable():
        errors.append({"field": "name", "error": "must contain only printable characters"})
    if not math.isfinite(now):
        errors.append({"field": "now", "error": "must be a finite number"})
    if expires_in_s is not None and not (math.isfinite(expires_in_s) and expires_in_s > 0):
        errors.append({"field": "expires_in_s", "error": "must be a positive number of seconds"})
    return errors


def generate_key(
    role: Role | str, name: str, now: float, expires_in_s: float | None = None, allow_code: bool = False
) -> tuple[str, KeyRecord]:
    """Create a new API key for ``role``; return ``(plaintext, record)``.

    The plaintext must be handed to its owner once and then dropped; persist only ``record``.
    ``expires_in_s`` (positive, finite) sets ``expires_at = now + expires_in_s``; ``None`` means
    the key never expires. Raises :class:`ValidationError` for an unknown role, an empty,
    over-long or non-printable ``name``, or a non-positive expiry.
    """
    parsed_role = parse_role(role) if not isinstance(role, Role) else role
    errors = _validate_new_key(name, now, expires_in_s)
    if errors:
        raise ValidationError(errors)
    key_id = "".join(secrets.choice(_KEY_ID_ALPHABET) for _ in range(KEY_ID_LENGTH))
    plaintext = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(SECRET_BYTES)}"
    record = KeyRecord(
        key_id=key_id,
        name=name,
        role=parsed_role,
        hash=hash_key(plaintext),
        created_at=float(now),
        expires_at=None if expires_in_s is None else float(now + expires_in_s),
        allow_code=allow_code,
    )
    logger.debug("generated API key %s (%s) role=%s", key_id, name, parsed_role.value)
    return plaintext, record


def parse_key(plaintext: str) -> str:
    """Return the public key id of a well-formed API key.

    Raises :class:`AuthError` ("malformed API key") for anything not exactly of the form
    ``dtk_<8 x [a-z0-9]>_<43 x [A-Za-z0-9_-]>``. The message never echoes the input.
    """
    match = _KEY_RE.fullmatch(plaintext)
    if match is None:
        raise AuthError("malformed API key")
    return match.group("key_id")


def key_status(record: KeyRecord, now: float) -> KeyStatus:
    """``"revoked"`` if ``revoked_at`` is set, else ``"expired"`` if ``now >= expires_at``,
    else ``"active"``. A non-finite ``now`` is a caller bug: ``ValueError``."""
    if not math.isfinite(now):
        raise ValueError("now must be a finite number of unix seconds")
    if record.revoked_at is not None:
        return "revoked"
    if record.expires_at is not None and now >= record.expires_at:
        return "expired"
    return "active"


def check_usable(record: KeyRecord, now: float) -> None:
    """Return if the key is active at ``now``; raise :class:`AuthError` naming why not."""
    status = key_status(record, now)
    if status != "active":
        raise AuthError(f"API key {record.key_id} is {status}")


def verify_key(plaintext: str, record: KeyRecord, now: float) -> None:
    """Return if ``plaintext`` is the key ``record`` describes and it is active at ``now``.

    Raises :class:`AuthError`: "malformed API key"; "invalid API key" when the key is not the
    one ``record`` describes, whether its id or its secret differs (one answer, one hash and
    compare, so no caller can tell an unknown key id from a wrong secret); revoked or expired.
    The secret is checked *before* the status, so only a holder of the real secret learns that a
    key is revoked or expired.
    """
    parse_key(plaintext)
    if not hmac.compare_digest(hash_key(plaintext), record.hash):  # the hash covers the key id too
        raise AuthError(INVALID_KEY)
    check_usable(record, now)


def revoke(record: KeyRecord, now: float) -> KeyRecord:
    """Return ``record`` revoked at ``now``; an already revoked record is returned unchanged
    (the first revocation time is kept)."""
    if record.revoked_at is not None:
        return record
    return msgspec.structs.replace(record, revoked_at=float(now))
