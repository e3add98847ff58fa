"""JWT issue and verify against an explicit clock, and the attacks they must stop."""

from __future__ import annotations

import base64
import hmac
import json
from typing import Any

import jwt
import msgspec
import pytest

from distributed_testing.errors import AuthError, ConfigError, ValidationError
from distributed_testing.security.keys import KeyRecord, generate_key, revoke
from distributed_testing.security.roles import Role
from distributed_testing.security.tokens import (
    DEFAULT_TTL_S,
    MAX_TTL_S,
    TokenClaims,
    generate_secret,
    issue_token,
    verify_token,
)

NOW = 1_700_000_000.75
SECRET = bytes(range(32))
OTHER_SECRET = bytes(range(1, 33))


@pytest.fixture
def record() -> KeyRecord:
    return generate_key(Role.VIEWER, "dash", NOW - 100)[1]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _claims(record: KeyRecord, **overrides: Any) -> dict[str, Any]:
    claims: dict[str, Any] = {
        "iss": "distributed_testing",
        "sub": record.key_id,
        "role": record.role.value,
        "iat": int(NOW),
        "nbf": int(NOW),
        "exp": int(NOW) + 900,
        "jti": "j1",
    }
    claims.update(overrides)
    return {k: v for k, v in claims.items() if v is not None}


def _hs_sign_with_header(
    header: dict[str, Any], payload: dict[str, Any], key: bytes, digest: str = "sha256"
) -> str:
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(payload).encode())}"
    signature = hmac.new(key, signing_input.encode(), digest).digest()
    return f"{signing_input}.{_b64(signature)}"


def test_issue_and_verify(record: KeyRecord) -> None:
    token, claims = issue_token(SECRET, record, NOW)
    assert claims.sub == record.key_id
    assert claims.role is Role.VIEWER
    assert claims.iss == "distributed_testing"
    assert claims.iat == claims.nbf == int(NOW)
    assert claims.exp == int(NOW) + DEFAULT_TTL_S
    assert claims.jti
    assert verify_token(SECRET, token, NOW) == claims
    header = jwt.get_unverified_header(token)
    assert header["alg"] == "HS256"


def test_jti_is_unique(record: KeyRecord) -> None:
    jtis = {issue_token(SECRET, record, NOW)[1].jti for _ in range(20)}
    assert len(jtis) == 20


def test_ttl_is_capped_by_key_expiry() -> None:
    _, record = generate_key(Role.SUBMITTER, "ci", NOW, expires_in_s=60)
    _, claims = issue_token(SECRET, record, NOW, ttl_s=900)
    assert claims.exp == int(NOW + 60)


@pytest.mark.parametrize("ttl", [0, -1, MAX_TTL_S + 1, True, 1.5])
def test_bad_ttl(record: KeyRecord, ttl: Any) -> None:
    with pytest.raises(ValidationError):
        issue_token(SECRET, record, NOW, ttl_s=ttl)


def test_no_token_for_revoked_or_expired_key(record: KeyRecord) -> None:
    with pytest.raises(AuthError, match="revoked"):
        issue_token(SECRET, revoke(record, NOW), NOW)
    _, short = generate_key(Role.VIEWER, "v", NOW, expires_in_s=1)
    with pytest.raises(AuthError, match="expired"):
        issue_token(SECRET, short, NOW + 1)


@pytest.mark.parametrize("secret", [b"", b"x" * 31, "x" * 40])
def test_short_or_non_bytes_secret_is_a_config_error(record: KeyRecord, secret: Any) -> None:
    with pytest.raises(ConfigError):
        issue_token(secret, record, NOW)
    with pytest.raises(ConfigError):
        verify_token(secret, "a.b.c", NOW)


def test_generate_secret() -> None:
    a, b = generate_secret(), generate_secret()
    assert isinstance(a, bytes) and len(a) == 32 and a != b


def test_expired_by_now(record: KeyRecord) -> None:
    token, claims = issue_token(SECRET, record, NOW, ttl_s=60)
    verify_token(SECRET, token, claims.exp - 0.001)
    with pytest.raises(AuthError, match="expired"):
        verify_token(SECRET, token, claims.exp)
    with pytest.raises(AuthError, match="expired"):
        verify_token(SECRET, token, claims.exp + 10**6)
    verify_token(SECRET, token, claims.exp + 4, leeway_s=5)


def test_not_yet_valid(record: KeyRecord) -> None:
    token, claims = issue_token(SECRET, record, NOW)
    with pytest.raises(AuthError, match="not yet valid"):
        verify_token(SECRET, token, claims.nbf - 1)
    verify_token(SECRET, token, claims.nbf - 1, leeway_s=2)


def test_nbf_in_future_is_rejected(record: KeyRecord) -> None:
    token = jwt.encode(_claims(record, nbf=int(NOW) + 60), SECRET, algorithm="HS256")
    with pytest.raises(AuthError, match="not yet valid"):
        verify_token(SECRET, token, NOW)


def test_iat_in_future_is_rejected(record: KeyRecord) -> None:
    token = jwt.encode(_claims(record, iat=int(NOW) + 60), SECRET, algorithm="HS256")
    with pytest.raises(AuthError, match="not yet valid"):
        verify_token(SECRET, token, NOW)


def test_tampered_payload(record: KeyRecord) -> None:
    token, _ = issue_token(SECRET, record, NOW)
    header, payload, signature = token.split(".")
    claims = json.loads(_unb64(payload))
    claims["role"] = "admin"
    forged = f"{header}.{_b64(json.dumps(claims).encode())}.{signature}"
    with pytest.raises(AuthError, match="signature"):
        verify_token(SECRET, forged, NOW)


def test_tampered_signature(record: KeyRecord) -> None:
    token, _ = issue_token(SECRET, record, NOW)
    header, payload, signature = token.split(".")
    flipped = ("B" if signature[0] != "B" else "C") + signature[1:]
    with pytest.raises(AuthError, match="signature"):
        verify_token(SECRET, f"{header}.{payload}.{flipped}", NOW)
    with pytest.raises(AuthError):
        verify_token(SECRET, f"{header}.{payload}.", NOW)


def test_wrong_secret(record: KeyRecord) -> None:
    token, _ = issue_token(OTHER_SECRET, record, NOW)
    with pytest.raises(AuthError, match="signature"):
        verify_token(SECRET, token, NOW)


def test_alg_none_is_rejected(record: KeyRecord) -> None:
    token = jwt.encode(_claims(record), None, algorithm="none")
    with pytest.raises(AuthError, match="algorithm"):
        verify_token(SECRET, token, NOW)
    unsigned = _hs_sign_with_header({"alg": "none"}, _claims(record), SECRET).rsplit(".", 1)[0]
    with pytest.raises(AuthError, match="algorithm"):
        verify_token(SECRET, unsigned + ".", NOW)


def test_other_hmac_algorithm_with_right_secret_is_rejected(record: KeyRecord) -> None:
    token = _hs_sign_with_header({"alg": "HS512", "typ": "JWT"}, _claims(record), SECRET, "sha512")
    with pytest.raises(AuthError, match="algorithm"):
        verify_token(SECRET, token, NOW)


def test_rs_hs_confusion_is_rejected(record: KeyRecord) -> None:
    # The classic attack: claim RS256 but sign with HMAC over the (public) key material.
    for key in (SECRET, b"-----BEGIN PUBLIC KEY-----\nMIIB...\n-----END PUBLIC KEY-----\n"):
        token = _hs_sign_with_header({"alg": "RS256", "typ": "JWT"}, _claims(record), key)
        with pytest.raises(AuthError, match="algorithm"):
            verify_token(SECRET, token, NOW)


def test_missing_alg_is_rejected(record: KeyRecord) -> None:
    token = _hs_sign_with_header({"typ": "JWT"}, _claims(record), SECRET)
    with pytest.raises(AuthError, match="algorithm"):
        verify_token(SECRET, token, NOW)


def test_wrong_issuer(record: KeyRecord) -> None:
    token, _ = issue_token(SECRET, record, NOW, issuer="someone-else")
    with pytest.raises(AuthError, match="issuer"):
        verify_token(SECRET, token, NOW)
    assert verify_token(SECRET, token, NOW, issuer="someone-else").iss == "someone-else"


@pytest.mark.parametrize("claim", ["iss", "sub", "role", "iat", "nbf", "exp", "jti"])
def test_missing_claim(record: KeyRecord, claim: str) -> None:
    token = jwt.encode(_claims(record, **{claim: None}), SECRET, algorithm="HS256")
    with pytest.raises(AuthError, match=claim):
        verify_token(SECRET, token, NOW)


@pytest.mark.parametrize(
    "overrides",
    [
        {"role": "root"},
        {"sub": 12},
        {"exp": "later"},
        {"iat": 1.5},
        {"jti": ["x"]},
        {"exp": 2**80},
        {"iat": -5, "nbf": -5},
        {"exp": int(NOW) + 10**7},
        {"exp": int(NOW) - 1},
    ],
)
def test_ill_typed_claims(record: KeyRecord, overrides: dict[str, Any]) -> None:
    token = jwt.encode(_claims(record, **overrides), SECRET, algorithm="HS256")
    with pytest.raises(AuthError):
        verify_token(SECRET, token, NOW)


def test_token_for_an_audience_is_rejected(record: KeyRecord) -> None:
    token = jwt.encode(_claims(record, aud="other-service"), SECRET, algorithm="HS256")
    with pytest.raises(AuthError):
        verify_token(SECRET, token, NOW)


@pytest.mark.parametrize(
    "token",
    ["", "abc", "a.b.c", "a.b", "...", "eyJ.eyJ.sig", "é.é.é", "x" * 5000, "\ud800.a.b"],
)
def test_malformed_tokens(token: str) -> None:
    with pytest.raises(AuthError):
        verify_token(SECRET, token, NOW)


def test_claims_encode_for_logs_and_api(record: KeyRecord) -> None:
    _, claims = issue_token(SECRET, record, NOW)
    assert msgspec.json.decode(msgspec.json.encode(claims), type=TokenClaims) == claims


@pytest.mark.parametrize("now", [float("nan"), float("inf")])
def test_non_finite_clock_is_a_bug(record: KeyRecord, now: float) -> None:
    token, _ = issue_token(SECRET, record, NOW)
    with pytest.raises(ValueError):
        verify_token(SECRET, token, now)
    with pytest.raises(ValueError):
        issue_token(SECRET, record, now)
