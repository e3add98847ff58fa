"""Session-key derivation: HKDF-SHA256, deterministic, separated by every input."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from distributed_testing.errors import ConfigError, ValidationError
from distributed_testing.security.session_keys import (
    derive_session_key,
    new_session_key,
)

SECRET = bytes(range(32))


def _rfc5869(salt: bytes, ikm: bytes, info: bytes, length: int) -> bytes:
    """Textbook HKDF-SHA256, independent of the code under test."""
    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
    out, block, counter = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        out += block
        counter += 1
    return out[:length]


def test_reference_hkdf_matches_rfc5869_case_1() -> None:
    okm = _rfc5869(
        bytes.fromhex("000102030405060708090a0b0c"),
        bytes.fromhex("0b" * 22),
        bytes.fromhex("f0f1f2f3f4f5f6f7f8f9"),
        42,
    )
    assert okm.hex() == (
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
    )


def test_derivation_is_hkdf_sha256() -> None:
    info = b"worker-session\x00" + b"\x00\x00\x00\x02s1" + b"\x00\x00\x00\x02w1"
    expected = _rfc5869(b"distributed_testing/session-key/v1", SECRET, info, 32)
    assert derive_session_key(SECRET, "s1", "w1") == expected


def test_deterministic_and_32_bytes() -> None:
    key = derive_session_key(SECRET, "sess-1", "worker-a")
    assert len(key) == 32
    assert key == derive_session_key(SECRET, "sess-1", "worker-a")


def test_every_input_changes_the_key() -> None:
    base = derive_session_key(SECRET, "sess-1", "worker-a")
    assert derive_session_key(SECRET, "sess-2", "worker-a") != base
    assert derive_session_key(SECRET, "sess-1", "worker-b") != base
    assert derive_session_key(bytes(range(1, 33)), "sess-1", "worker-a") != base
    assert derive_session_key(SECRET, "worker-a", "sess-1") != base


def test_id_boundaries_are_unambiguous() -> None:
    assert derive_session_key(SECRET, "ab", "c") != derive_session_key(SECRET, "a", "bc")


@pytest.mark.parametrize(("session_id", "worker_id"), [("", "w"), ("s", ""), ("", "")])
def test_empty_ids(session_id: str, worker_id: str) -> None:
    with pytest.raises(ValidationError):
        derive_session_key(SECRET, session_id, worker_id)


def test_short_secret() -> None:
    with pytest.raises(ConfigError):
        derive_session_key(b"short", "s", "w")


def test_new_session_key() -> None:
    a, b = new_session_key(), new_session_key()
    assert len(a) == 32 and isinstance(a, bytes) and a != b
