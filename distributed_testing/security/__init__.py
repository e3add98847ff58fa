"""Security: API keys (hashed at rest), JWT issue/verify, roles and per-session signing keys.

Pure code apart from the file and TLS helpers (``bootstrap.write_secret_file``, ``files``,
``secret_file``, ``tls``): no network, no database, no event loop; wherever time matters the
caller passes ``now`` (unix seconds). The coordinator wires it in like this::

    credential = parse_authorization_header(request.headers.get("Authorization"))
    principal = authenticate(credential, store.get_key, config.token_secret, now)
    require(principal.role, Permission.TASKS_SUBMIT)

Modules: ``roles`` (the role -> permission table), ``keys`` (API keys), ``tokens`` (JWTs),
``auth`` (credential -> Principal), ``bootstrap``, ``files`` (state files 0600, directories 0700),
``secret_file`` (the token-signing secret's own file, its migration and rotation) and ``tls``
(server and client TLS contexts). Message-signing session keys are derived in
:mod:`distributed_testing.protocol.signing`.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distributed_testing.security.auth import (
        KeyLookup,
        Principal,
        authenticate,
        parse_authorization_header,
    )
    from distributed_testing.security.bootstrap import (
        bootstrap_admin_key,
        write_secret_file,
    )
    from distributed_testing.security.keys import (
        KeyRecord,
        check_usable,
        generate_key,
        key_status,
        parse_key,
        revoke,
        verify_key,
    )
    from distributed_testing.security.roles import (
        ROLE_PERMISSIONS,
        Permission,
        Role,
        has_permission,
        parse_role,
        require,
    )
    from distributed_testing.security.tokens import (
        TokenClaims,
        generate_secret,
        issue_token,
        verify_token,
    )

# Imported on first use (PEP 562): ``security.tls`` alone, which the HTTP client and so the pytest
# plugin (imported by every pytest where this package is installed) need, must not cost the JWT
# and cryptography imports of ``tokens`` and ``auth``.
_WHERE = {
    "KeyLookup": "auth",
    "KeyRecord": "keys",
    "Permission": "roles",
    "Principal": "auth",
    "ROLE_PERMISSIONS": "roles",
    "Role": "roles",
    "TokenClaims": "tokens",
    "authenticate": "auth",
    "bootstrap_admin_key": "bootstrap",
    "check_usable": "keys",
    "generate_key": "keys",
    "generate_secret": "tokens",
    "has_permission": "roles",
    "issue_token": "tokens",
    "key_status": "keys",
    "parse_authorization_header": "auth",
    "parse_key": "keys",
    "parse_role": "roles",
    "require": "roles",
    "revoke": "keys",
    "verify_key": "keys",
    "verify_token": "tokens",
    "write_secret_file": "bootstrap",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:  # a submodule (``security.tls``), as the eager imports used to leave them bound
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "ROLE_PERMISSIONS",
    "KeyLookup",
    "KeyRecord",
    "Permission",
    "Principal",
    "Role",
    "TokenClaims",
    "authenticate",
    "bootstrap_admin_key",
    "check_usable",
    "generate_key",
    "generate_secret",
    "has_permission",
    "issue_token",
    "key_status",
    "parse_authorization_header",
    "parse_key",
    "parse_role",
    "require",
    "revoke",
    "verify_key",
    "verify_token",
    "write_secret_file",
]
