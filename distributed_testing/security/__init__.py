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
