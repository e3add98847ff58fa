"""authenticate(): API keys and JWTs against a key store, with revocation on every call."""

from __future__ import annotations

import msgspec
import pytest

from distributed_testing.errors import AuthError, PermissionDenied, StoreError
from distributed_testing.security import keys as keys_module
from distributed_testing.security.auth import (
    Principal,
    authenticate,
    parse_authorization_header,
)
from distributed_testing.security.keys import KeyRecord, generate_key, revoke
from distributed_testing.security.roles import Permission, Role, require
from distributed_testing.security.tokens import issue_token

NOW = 1_700_000_000.5
SECRET = b"k" * 32


class Store:
    """A dict of key records, standing in for the coordinator's store."""

    def __init__(self) -> None:
        self.records: dict[str, KeyRecord] = {}
        self.lookups: list[str] = []

    def add(self, role: Role, name: str = "k", **kwargs: float) -> tuple[str, KeyRecord]:
        plaintext, record = generate_key(role, name, NOW - 1000, **kwargs)
        self.records[record.key_id] = record
        return plaintext, record

    def get(self, key_id: str) -> KeyRecord | None:
        self.lookups.append(key_id)
        return self.records.get(key_id)


@pytest.fixture
def store() -> Store:
    return Store()


def test_api_key(store: Store) -> None:
    plaintext, record = store.add(Role.SUBMITTER, "ci")
    principal = authenticate(plaintext, store.get, SECRET, NOW)
    assert principal == Principal(
        key_id=record.key_id, role=Role.SUBMITTER, name="ci", via="api_key", token_exp=None
    )
    assert store.lookups == [record.key_id]


def test_jwt(store: Store) -> None:
    _, record = store.add(Role.VIEWER, "dash")
    token, claims = issue_token(SECRET, record, NOW)
    principal = authenticate(token, store.get, SECRET, NOW)
    assert principal == Principal(
        key_id=record.key_id, role=Role.VIEWER, name="dash", via="jwt", token_exp=claims.exp,
        session_start=claims.iat,
    )
    assert store.lookups == [record.key_id]


def test_unknown_api_key_and_wrong_secret_get_one_answer(store: Store) -> None:
    """Nothing tells a caller that a key id exists: the same message (and the same hash and
    compare, see ``authenticate``) for an unknown key id and for a known one with a wrong secret."""
    unknown, _ = generate_key(Role.ADMIN, "never-stored", NOW)
    plaintext, _ = store.add(Role.ADMIN)
    forged = plaintext[:-1] + ("A" if plaintext[-1] != "A" else "B")
    messages = []
    for credential in (unknown, forged):
        with pytest.raises(AuthError, match="^invalid API key$") as info:
            authenticate(credential, store.get, SECRET, NOW)
        messages.append(str(info.value))
    assert messages[0] == messages[1]


def test_unknown_api_key_and_wrong_secret_do_the_same_work(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """No early return for an unknown key id: one lookup, one hash and one constant-time compare
    of equal-length digests, as for a wrong secret (what timing could otherwise tell apart)."""
    calls: list[tuple[str, ...]] = []
    real_hash, real_compare = keys_module.hash_key, keys_module.hmac.compare_digest

    def hashing(plaintext: str) -> str:
        calls.append(("hash",))
        return real_hash(plaintext)

    def comparing(a: str, b: str) -> bool:
        calls.append(("compare", str(len(a)), str(len(b))))
        return real_compare(a, b)

    monkeypatch.setattr(keys_module, "hash_key", hashing)
    monkeypatch.setattr(keys_module.hmac, "compare_digest", comparing)
    unknown, _ = generate_key(Role.ADMIN, "never-stored", NOW)
    plaintext, _ = store.add(Role.ADMIN)
    forged = plaintext[:-1] + ("A" if plaintext[-1] != "A" else "B")
    seen = []
    for credential in (unknown, forged):
        calls.clear()
        store.lookups.clear()
        with pytest.raises(AuthError):
            authenticate(credential, store.get, SECRET, NOW)
        seen.append((list(calls), len(store.lookups)))
    assert seen[0] == seen[1] == ([("hash",), ("compare", "64", "64")], 1)


def test_revoking_the_key_kills_its_api_key_and_tokens_at_once(store: Store) -> None:
    plaintext, record = store.add(Role.SUBMITTER)
    token, _ = issue_token(SECRET, record, NOW)
    authenticate(token, store.get, SECRET, NOW)
    store.records[record.key_id] = revoke(record, NOW)
    for credential in (plaintext, token):
        with pytest.raises(AuthError, match="revoked"):
            authenticate(credential, store.get, SECRET, NOW)


def test_deleted_key_kills_its_tokens(store: Store) -> None:
    _, record = store.add(Role.SUBMITTER)
    token, _ = issue_token(SECRET, record, NOW)
    del store.records[record.key_id]
    with pytest.raises(AuthError, match="unknown"):
        authenticate(token, store.get, SECRET, NOW)


def test_expired_key_kills_its_tokens_even_with_leeway(store: Store) -> None:
    _, record = store.add(Role.SUBMITTER, expires_in_s=1000 + 60)
    token, _ = issue_token(SECRET, record, NOW)
    assert record.expires_at is not None
    with pytest.raises(AuthError, match="expired"):
        authenticate(token, store.get, SECRET, record.expires_at, leeway_s=30)


def test_token_with_changed_role_is_rejected(store: Store) -> None:
    _, record = store.add(Role.ADMIN)
    token, _ = issue_token(SECRET, record, NOW)
    store.records[record.key_id] = msgspec.structs.replace(record, role=Role.VIEWER)
    with pytest.raises(AuthError, match="role"):
        authenticate(token, store.get, SECRET, NOW)


def test_token_older_than_its_key_is_rejected(store: Store) -> None:
    """A key id reused by a newer key must not accept the old key's tokens."""
    _, record = store.add(Role.ADMIN)
    token, _ = issue_token(SECRET, record, NOW)
    store.records[record.key_id] = msgspec.structs.replace(record, created_at=NOW + 5)
    with pytest.raises(AuthError, match="predates"):
        authenticate(token, store.get, SECRET, NOW + 10)


def test_token_from_another_coordinator_secret(store: Store) -> None:
    _, record = store.add(Role.ADMIN)
    token, _ = issue_token(b"z" * 32, record, NOW)
    with pytest.raises(AuthError, match="signature"):
        authenticate(token, store.get, SECRET, NOW)
    assert store.lookups == []  # no store hit for an unverified token


def test_expired_token(store: Store) -> None:
    _, record = store.add(Role.ADMIN)
    token, claims = issue_token(SECRET, record, NOW, ttl_s=60)
    with pytest.raises(AuthError, match="expired"):
        authenticate(token, store.get, SECRET, claims.exp)


def test_store_errors_propagate(store: Store) -> None:
    plaintext, _ = store.add(Role.ADMIN)

    def broken(key_id: str) -> KeyRecord | None:
        raise StoreError("database is down")

    with pytest.raises(StoreError):
        authenticate(plaintext, broken, SECRET, NOW)


def test_empty_credential(store: Store) -> None:
    with pytest.raises(AuthError, match="missing"):
        authenticate("", store.get, SECRET, NOW)


def test_header_to_permission_flow(store: Store) -> None:
    plaintext, _ = store.add(Role.WORKER, "gpu-01")
    principal = authenticate(
        parse_authorization_header(f"Bearer {plaintext}"), store.get, SECRET, NOW
    )
    require(principal.role, Permission.WORKER_CONNECT)
    with pytest.raises(PermissionDenied):
        require(principal.role, Permission.TASKS_SUBMIT)


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_parse_bearer(scheme: str) -> None:
    assert parse_authorization_header(f"{scheme} abc.def-_~+/==") == "abc.def-_~+/=="
    assert parse_authorization_header(f"  {scheme}   tok  ") == "tok"


@pytest.mark.parametrize("value", [None, "", "   "])
def test_missing_header(value: str | None) -> None:
    with pytest.raises(AuthError, match="missing"):
        parse_authorization_header(value)


@pytest.mark.parametrize("value", ["Basic dXNlcjpwYXNz", "Token abc", "Digest x"])
def test_other_schemes(value: str) -> None:
    with pytest.raises(AuthError, match="scheme"):
        parse_authorization_header(value)


@pytest.mark.parametrize(
    "value",
    [
        "Bearer",
        "Bearertok",
        "Bearer a b",
        "Bearer\ttok",
        "Bearer tok\nX-Evil: 1",
        "Bearer t=k",
        "Bearer tök",
        "Bearer " + "a" * 10_000,
    ],
)
def test_malformed_header(value: str) -> None:
    with pytest.raises(AuthError) as info:
        parse_authorization_header(value)
    assert "tok" not in str(info.value)
