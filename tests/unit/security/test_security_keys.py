"""API keys: format, hashing at rest, verification and the reasons for rejection."""

from __future__ import annotations

import logging
import math
import re

import msgspec
import pytest

from distributed_testing.errors import AuthError, ValidationError
from distributed_testing.security.keys import (
    KeyRecord,
    check_usable,
    generate_key,
    hash_key,
    is_api_key,
    key_status,
    parse_key,
    revoke,
    verify_key,
)
from distributed_testing.security.roles import Role

NOW = 1_700_000_000.25
KEY_RE = re.compile(r"dtk_[a-z0-9]{8}_[A-Za-z0-9_-]{43}")


def _secret_part(plaintext: str) -> str:
    return plaintext[len("dtk_") + 9 :]


def test_generated_key_round_trips() -> None:
    plaintext, record = generate_key(Role.SUBMITTER, "ci-pipeline", NOW)
    assert KEY_RE.fullmatch(plaintext)
    assert parse_key(plaintext) == record.key_id
    assert plaintext.startswith(f"dtk_{record.key_id}_")
    assert record.role is Role.SUBMITTER
    assert record.name == "ci-pipeline"
    assert record.created_at == NOW
    assert record.expires_at is None and record.revoked_at is None
    verify_key(plaintext, record, NOW)
    verify_key(plaintext, record, NOW + 10 * 365 * 86400)


def test_record_holds_only_a_hash() -> None:
    plaintext, record = generate_key(Role.ADMIN, "ops", NOW)
    secret = _secret_part(plaintext)
    assert record.hash == hash_key(plaintext)
    assert re.fullmatch(r"[0-9a-f]{64}", record.hash)
    for rendering in (repr(record), str(record), msgspec.json.encode(record).decode()):
        assert secret not in rendering
        assert plaintext not in rendering


def test_generation_never_logs_the_secret(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        plaintext, _ = generate_key(Role.ADMIN, "ops", NOW)
    assert _secret_part(plaintext) not in caplog.text


def test_keys_are_unique() -> None:
    generated = [generate_key(Role.VIEWER, "v", NOW) for _ in range(50)]
    assert len({p for p, _ in generated}) == 50
    assert len({r.key_id for _, r in generated}) == 50
    assert len({r.hash for _, r in generated}) == 50


def test_record_survives_the_store_encoding() -> None:
    _, record = generate_key("worker", "gpu-01", NOW, expires_in_s=60)
    decoded = msgspec.json.decode(msgspec.json.encode(record), type=KeyRecord)
    assert decoded == record
    assert b'"role":"worker"' in msgspec.json.encode(record)


def test_role_given_as_string() -> None:
    _, record = generate_key("viewer", "dash", NOW)
    assert record.role is Role.VIEWER


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"role": "root"}, "role"),
        ({"name": ""}, "name"),
        ({"name": "   "}, "name"),
        ({"name": "x" * 101}, "name"),
        ({"name": "bad\nname"}, "name"),
        ({"expires_in_s": 0}, "expires_in_s"),
        ({"expires_in_s": -5}, "expires_in_s"),
        ({"expires_in_s": math.nan}, "expires_in_s"),
        ({"expires_in_s": math.inf}, "expires_in_s"),
        ({"now": math.nan}, "now"),
    ],
)
def test_generate_key_validates_input(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"role": Role.ADMIN, "name": "ok", "now": NOW}
    args.update(kwargs)
    with pytest.raises(ValidationError) as info:
        generate_key(**args)  # type: ignore[arg-type]
    assert field in {e["field"] for e in info.value.errors}


def test_wrong_secret_is_rejected() -> None:
    _, record = generate_key(Role.ADMIN, "ops", NOW)
    other_secret = _secret_part(generate_key(Role.ADMIN, "x", NOW)[0])
    forged = f"dtk_{record.key_id}_{other_secret}"
    with pytest.raises(AuthError, match="^invalid API key$"):
        verify_key(forged, record, NOW)


def test_single_character_change_is_rejected() -> None:
    plaintext, record = generate_key(Role.ADMIN, "ops", NOW)
    last = plaintext[-1]
    forged = plaintext[:-1] + ("A" if last != "A" else "B")
    with pytest.raises(AuthError, match="^invalid API key$"):
        verify_key(forged, record, NOW)


def test_key_of_another_record_gets_the_same_answer_as_a_wrong_secret() -> None:
    plaintext, _ = generate_key(Role.ADMIN, "a", NOW)
    _, other = generate_key(Role.ADMIN, "b", NOW)
    with pytest.raises(AuthError, match="^invalid API key$"):
        verify_key(plaintext, other, NOW)


def test_expiry_boundary() -> None:
    plaintext, record = generate_key(Role.SUBMITTER, "ci", NOW, expires_in_s=3600)
    assert record.expires_at == NOW + 3600
    verify_key(plaintext, record, NOW + 3599.999)
    with pytest.raises(AuthError, match="expired"):
        verify_key(plaintext, record, NOW + 3600)
    assert key_status(record, NOW + 3600) == "expired"


def test_revoked_key_is_rejected_at_once() -> None:
    plaintext, record = generate_key(Role.SUBMITTER, "ci", NOW)
    revoked = revoke(record, NOW + 5)
    assert revoked.revoked_at == NOW + 5
    assert key_status(revoked, NOW + 5) == "revoked"
    # Revocation does not wait on clock agreement: even an earlier `now` sees it.
    for now in (NOW, NOW + 5, NOW + 100):
        with pytest.raises(AuthError, match="revoked"):
            verify_key(plaintext, revoked, now)


def test_revoke_is_idempotent_and_keeps_first_time() -> None:
    _, record = generate_key(Role.VIEWER, "v", NOW)
    first = revoke(record, NOW + 1)
    assert revoke(first, NOW + 50) is first
    assert record.revoked_at is None  # records are immutable


def test_revoked_status_is_only_revealed_to_secret_holders() -> None:
    plaintext, record = generate_key(Role.ADMIN, "ops", NOW)
    revoked = revoke(record, NOW)
    forged = plaintext[:-1] + ("A" if plaintext[-1] != "A" else "B")
    with pytest.raises(AuthError, match="^invalid API key$"):
        verify_key(forged, revoked, NOW)


def test_check_usable_and_status() -> None:
    _, record = generate_key(Role.VIEWER, "v", NOW, expires_in_s=10)
    assert key_status(record, NOW) == "active"
    check_usable(record, NOW)
    with pytest.raises(AuthError, match="expired"):
        check_usable(record, NOW + 10)
    # Revoked wins over expired.
    assert key_status(revoke(record, NOW), NOW + 10) == "revoked"


def test_record_is_frozen() -> None:
    _, record = generate_key(Role.VIEWER, "v", NOW)
    with pytest.raises(AttributeError):
        record.role = Role.ADMIN  # type: ignore[misc]


VALID_ID = "abcd1234"
VALID_SECRET = "A" * 43


@pytest.mark.parametrize(
    "candidate",
    [
        "",
        "dtk_",
        "dtk",
        "dtk_abc_def",
        f"dtk_{VALID_ID}",
        f"dtk_{VALID_ID}_",
        f"dtk{VALID_ID}_{VALID_SECRET}",
        f"dtx_{VALID_ID}_{VALID_SECRET}",
        f"DTK_{VALID_ID}_{VALID_SECRET}",
        f"dtk_ABCD1234_{VALID_SECRET}",
        f"dtk_abcd123_{VALID_SECRET}",
        f"dtk_abcd12345_{VALID_SECRET}",
        f"dtk_abcd-123_{VALID_SECRET}",
        f"dtk_{VALID_ID}_{VALID_SECRET[:-1]}",
        f"dtk_{VALID_ID}_{VALID_SECRET}A",
        f"dtk_{VALID_ID}-{VALID_SECRET}",
        f"dtk_{VALID_ID}_{VALID_SECRET[:-1]}=",
        f"dtk_{VALID_ID}_{VALID_SECRET[:-1]}é",
        f"dtk_{VALID_ID}_{VALID_SECRET}\n",
        f" dtk_{VALID_ID}_{VALID_SECRET}",
        f"Bearer dtk_{VALID_ID}_{VALID_SECRET}",
        f"dtk_{VALID_ID}_{VALID_SECRET[:-1]}\x00",
        "eyJhbGciOiJIUzI1NiJ9.e30.sig",
    ],
)
def test_malformed_keys_are_rejected_without_echo(candidate: str) -> None:
    with pytest.raises(AuthError, match="malformed") as info:
        parse_key(candidate)
    if candidate:
        assert candidate not in str(info.value)


def test_well_formed_key_parses() -> None:
    assert parse_key(f"dtk_{VALID_ID}_{VALID_SECRET}") == VALID_ID
    assert parse_key(f"dtk_{VALID_ID}_{'_-' * 21}x") == VALID_ID


def test_is_api_key_checks_only_the_prefix() -> None:
    assert is_api_key("dtk_anything")
    assert not is_api_key("eyJhbGciOi.x.y")
    assert not is_api_key("")
