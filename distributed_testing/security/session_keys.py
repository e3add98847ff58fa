"""Per-session keys for signing worker <-> coordinator messages (used by protocol/signing.py).

Two ways to obtain a session key, both 32 bytes:

* :func:`new_session_key` draws a fresh random key at registration. The coordinator must then
  keep it (in its session table, or the store for HA) and send it to the worker over the
  authenticated WebSocket.
* :func:`derive_session_key` computes the key from the coordinator secret and the session's
  identity, so any coordinator holding the secret can recompute it without storing it (useful
  in an HA group). Each (session_id, worker_id) pair gets an independent key; learning one
  session key reveals nothing about the secret or about other sessions.

Never sign with the coordinator secret directly, and never let each side pick its own key.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from distributed_testing.errors import ValidationError
from distributed_testing.security.tokens import check_secret

__all__ = ["SESSION_KEY_BYTES", "derive_session_key", "new_session_key"]

SESSION_KEY_BYTES = 32
_SALT = b"distributed_testing/session-key/v1"


def new_session_key() -> bytes:
    """Return 32 fresh random bytes from the OS CSPRNG."""
    return secrets.token_bytes(SESSION_KEY_BYTES)


def _length_prefixed(*parts: str) -> bytes:
    """Unambiguous encoding: ("ab", "c") and ("a", "bc") must give different bytes."""
    out = bytearray()
    for part in parts:
        raw = part.encode("utf-8")
        out += len(raw).to_bytes(4, "big") + raw
    return bytes(out)


def derive_session_key(secret: bytes, session_id: str, worker_id: str) -> bytes:
    """Return the 32-byte key for one worker session, by HKDF-SHA256 (RFC 5869).

    ``PRK = HMAC-SHA256(salt, secret)`` with a fixed, versioned salt, then one expand block
    ``OKM = HMAC-SHA256(PRK, info || 0x01)`` where ``info`` is a label followed by the
    length-prefixed UTF-8 ``session_id`` and ``worker_id``. Deterministic for equal inputs.

    Raises :class:`ConfigError` if ``secret`` is shorter than 32 bytes and
    :class:`ValidationError` if either id is empty.
    """
    check_secret(secret, what="session-key master secret")
    errors = [
        {"field": field, "error": "must not be empty"}
        for field, value in (("session_id", session_id), ("worker_id", worker_id))
        if not value
    ]
    if errors:
        raise ValidationError(errors)
    prk = hmac.new(_SALT, secret, hashlib.sha256).digest()
    info = b"worker-session\x00" + _length_prefixed(session_id, worker_id)
    return hmac.new(prk, info + b"\x01", hashlib.sha256).digest()
