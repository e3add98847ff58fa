"""Roles, permissions and the one table that maps one to the other.

Every API key carries exactly one :class:`Role`. What a role may do is decided only by
:data:`ROLE_PERMISSIONS`; handlers ask :func:`require` and never compare role names themselves.

The table follows least privilege:

==============  =====  =========  ======  ======
permission      admin  submitter  viewer  worker
==============  =====  =========  ======  ======
keys:manage     yes
tasks:submit    yes    yes
tasks:cancel    yes    yes
tasks:read      yes    yes        yes
results:read    yes    yes        yes
workers:read    yes    yes        yes
workers:manage  yes
worker:connect                            yes
schema:read     yes    yes        yes     yes
metrics:read    yes    yes        yes
bundles:upload  yes*   yes*
bundles:read    yes    yes                yes
==============  =====  =========  ======  ======

``*``: only a key created with ``--allow-code`` (``KeyRecord.allow_code``); the REST layer checks
that on top of this table (``coordinator/api.py``, ``authorize``).

Reasons for the less obvious cells:

* ``worker:connect`` belongs to the worker role alone, admin included: a leaked admin or
  submitter key must not be able to join the pool and receive task payloads, and a host that
  runs a worker gets a key that can do nothing else (it cannot submit, cancel or read results).
* ``tasks:cancel`` is a role check only. Whether a submitter may cancel *another* submitter's
  task is an ownership rule the coordinator applies on top of this table.
* A worker learns about its tasks over its WebSocket, so it needs no REST read permissions,
  except ``bundles:read``: it fetches the blobs of a bundle task with its own key.
* ``bundles:upload`` ships code that workers run, so it needs a key made for that on top of the
  role: a leaked ordinary submitter key cannot run code on the fleet.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

from distributed_testing.errors import PermissionDenied, ValidationError

__all__ = [
    "ROLE_PERMISSIONS",
    "Permission",
    "Role",
    "has_permission",
    "parse_role",
    "require",
]


class Role(StrEnum):
    """The role an API key (and every token minted from it) acts as."""

    ADMIN = "admin"
    SUBMITTER = "submitter"
    WORKER = "worker"
    VIEWER = "viewer"


class Permission(StrEnum):
    """A named capability; the string value is the stable name used in docs and errors."""

    KEYS_MANAGE = "keys:manage"
    TASKS_SUBMIT = "tasks:submit"
    TASKS_CANCEL = "tasks:cancel"
    TASKS_READ = "tasks:read"
    RESULTS_READ = "results:read"
    WORKERS_READ = "workers:read"
    WORKERS_MANAGE = "workers:manage"
    WORKER_CONNECT = "worker:connect"
    SCHEMA_READ = "schema:read"
    METRICS_READ = "metrics:read"
    BUNDLES_UPLOAD = "bundles:upload"
    BUNDLES_READ = "bundles:read"


_READ = frozenset(
    {
        Permission.TASKS_READ,
        Permission.RESULTS_READ,
        Permission.WORKERS_READ,
        Permission.SCHEMA_READ,
        Permission.METRICS_READ,
    }
)
_SUBMIT = _READ | {Permission.TASKS_SUBMIT, Permission.TASKS_CANCEL, Permission.BUNDLES_UPLOAD,
                   Permission.BUNDLES_READ}

ROLE_PERMISSIONS: Mapping[Role, frozenset[Permission]] = MappingProxyType(
    {
        Role.ADMIN: _SUBMIT | {Permission.KEYS_MANAGE, Permission.WORKERS_MANAGE},
        Role.SUBMITTER: _SUBMIT,
        Role.VIEWER: _READ,
        Role.WORKER: frozenset({Permission.WORKER_CONNECT, Permission.SCHEMA_READ, Permission.BUNDLES_READ}),
    }
)
"""Read-only role -> permissions table; the single source of truth for authorization."""


def parse_role(value: str, field: str = "role") -> Role:
    """Return the :class:`Role` named by ``value`` (exact, lower-case match).

    Raises :class:`ValidationError` on ``field`` listing the valid roles otherwise.
    """
    try:
        return Role(value)
    except ValueError:
        valid = ", ".join(sorted(r.value for r in Role))
        raise ValidationError(
            [{"field": field, "error": f"unknown role {value!r}; valid roles: {valid}"}]
        ) from None


def has_permission(role: Role, permission: Permission) -> bool:
    """True when ``role`` holds ``permission`` in :data:`ROLE_PERMISSIONS`.

    ``role`` and ``permission`` must be members (or their exact string values); an unknown
    name is a programming error and raises ``ValueError``.
    """
    return Permission(permission) in ROLE_PERMISSIONS[Role(role)]


def require(role: Role, permission: Permission) -> None:
    """Return if ``role`` holds ``permission``; else raise :class:`PermissionDenied`.

    The message names both, e.g. ``role 'viewer' lacks permission 'tasks:submit'``; it is safe
    to return to the caller (it reveals only their own role).
    """
    if not has_permission(role, permission):
        raise PermissionDenied(
            f"role {Role(role).value!r} lacks permission {Permission(permission).value!r}"
        )
