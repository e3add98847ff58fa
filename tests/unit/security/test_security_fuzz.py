"""Property tests: arbitrary input never authenticates and never raises anything unexpected."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distributed_testing.errors import AuthError, ValidationError
from distributed_testing.security.auth import authenticate, parse_authorization_header
from distributed_testing.security.keys import KeyRecord, generate_key, parse_key
from distributed_testing.security.roles import Role, parse_role

NOW = 1_700_000_000.0
SECRET = b"s" * 32
_, TEMPLATE = generate_key(Role.ADMIN, "fuzz", NOW - 10)
EXPECTED = (AuthError, ValidationError)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def permissive_lookup(key_id: str) -> KeyRecord:
    """The worst case for an attacker to face: every key id exists and is active."""
    return msgspec.structs.replace(TEMPLATE, key_id=key_id)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


_HS256_HEADER = _b64(b'{"alg":"HS256","typ":"JWT"}')


def _hs256(payload: Any) -> str:
    """Sign any JSON value with the real secret, bypassing PyJWT's encode-side checks."""
    signing_input = f"{_HS256_HEADER}.{_b64(json.dumps(payload).encode())}"
    signature = hmac.new(SECRET, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{_b64(signature)}"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)
claim_names = st.sampled_from(["iss", "sub", "role", "iat", "nbf", "exp", "jti", "aud"])

credentials = st.one_of(
    st.text(),
    st.binary().map(lambda b: b.decode("latin-1")),
    st.text().map(lambda s: "dtk_" + s),
    st.from_regex(r"dtk_[a-z0-9]{8}_[A-Za-z0-9_-]{43}", fullmatch=True),
    st.tuples(st.binary(), st.binary(), st.binary()).map(lambda t: ".".join(map(_b64, t))),
    st.tuples(json_values, json_values, st.binary()).map(
        lambda t: ".".join(
            [_b64(json.dumps(t[0]).encode()), _b64(json.dumps(t[1]).encode()), _b64(t[2])]
        )
    ),
    st.text().map(lambda s: "eyJ" + s),
)


@FUZZ
@given(credentials)
def test_random_credentials_never_authenticate(credential: str) -> None:
    with pytest.raises(EXPECTED):
        authenticate(credential, permissive_lookup, SECRET, NOW)


@FUZZ
@given(st.dictionaries(claim_names | st.text(), json_values, max_size=9))
def test_validly_signed_random_claims_fail_only_cleanly(payload: dict[str, Any]) -> None:
    """Even with the right secret, odd claims give a Principal or an AuthError, nothing else."""
    token = _hs256(payload)
    try:
        principal = authenticate(token, permissive_lookup, SECRET, NOW)
    except EXPECTED:
        return
    assert principal.via == "jwt"


@FUZZ
@given(st.text())
def test_parse_key_only_raises_auth_error(candidate: str) -> None:
    try:
        key_id = parse_key(candidate)
    except AuthError:
        return
    assert candidate.startswith(f"dtk_{key_id}_")


@FUZZ
@given(st.one_of(st.none(), st.text(), st.text().map(lambda s: "Bearer " + s)))
def test_parse_authorization_header_only_raises_auth_error(value: str | None) -> None:
    try:
        credential = parse_authorization_header(value)
    except AuthError:
        return
    assert credential and credential in (value or "")


@FUZZ
@given(st.text())
def test_parse_role_only_raises_validation_error(value: str) -> None:
    try:
        role = parse_role(value)
    except ValidationError:
        return
    assert role.value == value
