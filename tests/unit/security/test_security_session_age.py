"""Renewal within a maximum session age: a JWT may mint JWTs only until its session (begun when
the API key was presented, the ``auth_time`` claim) is ``max_session_age_s`` old."""

from __future__ import annotations

import jwt
import pytest

from distributed_testing.errors import AuthError
from distributed_testing.security.auth import authenticate
from distributed_testing.security.keys import KeyRecord, generate_key
from distributed_testing.security.roles import Role
from distributed_testing.security.tokens import issue_token, verify_token

NOW = 1_700_000_000
SECRET = bytes(range(32))
AGE = 3600


@pytest.fixture
def record() -> KeyRecord:
    return generate_key(Role.WORKER, "w", NOW - 100)[1]


def renew(token: str, record: KeyRecord, now: float) -> tuple[str, int]:
    """What POST /api/v1/auth/token does with a JWT: verify it, mint one in the same session."""
    principal = authenticate(token, {record.key_id: record}.get, SECRET, now)
    new, claims = issue_token(SECRET, record, now, ttl_s=900, session_start=principal.session_start,
                              max_session_age_s=AGE)
    return new, claims.exp


def test_a_key_starts_a_session_and_renewals_keep_its_start(record: KeyRecord) -> None:
    token, claims = issue_token(SECRET, record, NOW, ttl_s=900, max_session_age_s=AGE)
    assert claims.auth_time == claims.iat == NOW
    t = NOW
    while t + 600 < NOW + AGE:
        t += 600
        token, _ = renew(token, record, t)
        assert verify_token(SECRET, token, t).auth_time == NOW


def test_a_chain_of_renewals_stops_at_the_maximum_age(record: KeyRecord) -> None:
    token, _ = issue_token(SECRET, record, NOW, ttl_s=900, max_session_age_s=AGE)
    t, exps = NOW, []
    with pytest.raises(AuthError, match="token has expired"):
        while True:
            t += 600
            token, exp = renew(token, record, t)
            exps.append(exp)
    assert t == NOW + AGE  # the last renewed token expired exactly when the session reached its maximum age
    assert max(exps) == NOW + AGE  # no renewed token outlived the session
    fresh, claims = issue_token(SECRET, record, t, ttl_s=900, max_session_age_s=AGE)  # the API key still works
    assert claims.auth_time == t and verify_token(SECRET, fresh, t).exp == t + 900


def test_a_token_whose_session_starts_after_its_issue_is_refused(record: KeyRecord) -> None:
    forged = jwt.encode({"iss": "distributed_testing", "sub": record.key_id, "role": "worker", "iat": NOW,
                         "nbf": NOW, "exp": NOW + 900, "jti": "x", "auth_time": NOW + 10}, SECRET, algorithm="HS256")
    with pytest.raises(AuthError, match="session starts after"):
        verify_token(SECRET, forged, NOW + 1)


def test_a_token_without_auth_time_counts_its_issue_as_the_session_start(record: KeyRecord) -> None:
    old = jwt.encode({"iss": "distributed_testing", "sub": record.key_id, "role": "worker", "iat": NOW,
                      "nbf": NOW, "exp": NOW + 900, "jti": "x"}, SECRET, algorithm="HS256")
    assert verify_token(SECRET, old, NOW + 1).session_start == NOW
    _, exp = renew(old, record, NOW + 600)
    assert exp == NOW + 600 + 900


def test_a_session_already_older_than_the_maximum_is_not_renewed(record: KeyRecord) -> None:
    """A token still valid past the maximum age (the limit was lowered since it was issued)."""
    token, _ = issue_token(SECRET, record, NOW, ttl_s=900, max_session_age_s=AGE)
    principal = authenticate(token, {record.key_id: record}.get, SECRET, NOW + 700)
    with pytest.raises(AuthError, match="session too old to renew: it began 700 s ago and the maximum session "
                                        "age is 600 s; get a new token with the API key"):
        issue_token(SECRET, record, NOW + 700, session_start=principal.session_start, max_session_age_s=600)
