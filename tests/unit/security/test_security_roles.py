"""The role -> permission table, checked cell by cell against an independent copy."""

from __future__ import annotations

import itertools

import pytest

from distributed_testing.errors import AuthError, PermissionDenied, ValidationError
from distributed_testing.security import roles
from distributed_testing.security.roles import (
    ROLE_PERMISSIONS,
    Permission,
    Role,
    has_permission,
    parse_role,
    require,
)

# Written out by hand on purpose: a change to the table must be made twice to pass.
EXPECTED: dict[str, set[str]] = {
    "admin": {
        "keys:manage",
        "workers:manage",
        "tasks:submit",
        "tasks:cancel",
        "tasks:read",
        "results:read",
        "workers:read",
        "schema:read",
        "metrics:read",
        "bundles:upload",
        "bundles:read",
    },
    "submitter": {
        "tasks:submit",
        "tasks:cancel",
        "tasks:read",
        "results:read",
        "workers:read",
        "schema:read",
        "metrics:read",
        "bundles:upload",
        "bundles:read",
    },
    "viewer": {"tasks:read", "results:read", "workers:read", "schema:read", "metrics:read"},
    "worker": {"worker:connect", "schema:read", "bundles:read"},
}
ALL_PERMISSIONS = {
    "keys:manage",
    "workers:manage",
    "tasks:submit",
    "tasks:cancel",
    "tasks:read",
    "results:read",
    "workers:read",
    "worker:connect",
    "schema:read",
    "metrics:read",
    "bundles:upload",
    "bundles:read",
}


def test_roles_and_permissions_are_exactly_the_documented_names() -> None:
    assert {r.value for r in Role} == set(EXPECTED)
    assert {p.value for p in Permission} == ALL_PERMISSIONS
    assert set(ROLE_PERMISSIONS) == set(Role)


@pytest.mark.parametrize(
    ("role", "permission"), list(itertools.product(sorted(EXPECTED), sorted(ALL_PERMISSIONS)))
)
def test_matrix(role: str, permission: str) -> None:
    allowed = permission in EXPECTED[role]
    assert has_permission(Role(role), Permission(permission)) is allowed
    assert (permission in ROLE_PERMISSIONS[Role(role)]) is allowed
    if allowed:
        require(Role(role), Permission(permission))
    else:
        with pytest.raises(PermissionDenied) as info:
            require(Role(role), Permission(permission))
        assert repr(role) in str(info.value)
        assert repr(permission) in str(info.value)


def _documented_table() -> dict[str, set[str]]:
    """Parse the reST table in the roles module docstring."""
    doc = roles.__doc__ or ""
    lines = doc.splitlines()
    borders = [i for i, line in enumerate(lines) if line.startswith("=====")]
    header = lines[borders[0] + 1]
    columns = header.split()[1:]
    starts = [header.index(c) for c in columns]
    table: dict[str, set[str]] = {c: set() for c in columns}
    for line in lines[borders[1] + 1 : borders[2]]:
        permission = line.split()[0]
        for column, start in zip(columns, starts, strict=True):
            if line[start : start + 3] == "yes":
                table[column].add(permission)
    return table


def test_docstring_table_matches_code() -> None:
    assert _documented_table() == EXPECTED


def test_submitter_and_admin_cannot_register_as_worker() -> None:
    for role in (Role.SUBMITTER, Role.ADMIN, Role.VIEWER):
        with pytest.raises(PermissionDenied):
            require(role, Permission.WORKER_CONNECT)


def test_permission_denied_is_an_auth_error() -> None:
    assert issubclass(PermissionDenied, AuthError)


def test_table_is_read_only() -> None:
    with pytest.raises(TypeError):
        ROLE_PERMISSIONS[Role.VIEWER] = frozenset(Permission)  # type: ignore[index]
    assert all(isinstance(v, frozenset) for v in ROLE_PERMISSIONS.values())


def test_string_values_work_like_members() -> None:
    assert has_permission("viewer", "tasks:read")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        has_permission(Role.ADMIN, "tasks:destroy")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["admin", "submitter", "worker", "viewer"])
def test_parse_role_accepts_valid(name: str) -> None:
    assert parse_role(name) is Role(name)


@pytest.mark.parametrize("name", ["", "Admin", "root", " admin", "admin ", "keys:manage"])
def test_parse_role_rejects_and_lists_valid_roles(name: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_role(name)
    assert info.value.errors[0]["field"] == "role"
    for valid in ("admin", "submitter", "viewer", "worker"):
        assert valid in str(info.value)


def test_parse_role_field_name() -> None:
    with pytest.raises(ValidationError) as info:
        parse_role("nope", field="body.role")
    assert info.value.errors[0]["field"] == "body.role"
