"""REST handlers for credentials: a JWT for the caller's key, and API keys created, listed and
revoked (docs/security.md). The route table (``api.ROUTES``) takes ``ROUTES`` from here; each
route declares its permission.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from ..errors import NotFound, ValidationError
from ..security import auth as sa
from ..security import keys as sk
from ..security import roles, tokens
from .rest import AUTHENTICATED, PRINCIPAL, json_body, json_response, positive_seconds
from .runtime import RUNTIME, key_view

log = logging.getLogger(__name__)


async def issue_token(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    principal: sa.Principal = request[PRINCIPAL]
    rec = rt.keys[principal.key_id]
    # a JWT renews within its session's maximum age only; the API key starts a new session
    token, claims = tokens.issue_token(rt.jwt_secret, rec, rt.clock(), ttl_s=int(rt.config.token_ttl_s),
                                       session_start=principal.session_start if principal.via == "jwt" else None,
                                       max_session_age_s=int(rt.config.max_session_age_s))
    return json_response({"token": token, "expires_at": claims.exp, "role": claims.role, "key_id": claims.sub,
                          "session_expires_at": claims.session_start + int(rt.config.max_session_age_s)})


async def create_key(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    body = await json_body(request)
    if not isinstance(body, dict):
        raise ValidationError([{"field": "(body)", "error": "expected an object with role, name, expires_in_s"}])
    unknown = set(body) - {"role", "name", "expires_in_s", "allow_code"}
    if unknown:
        raise ValidationError([{"field": k, "error": "unknown field"} for k in sorted(unknown)])
    role = roles.parse_role(body.get("role", ""))
    expires = body.get("expires_in_s")
    if expires is not None:
        expires = positive_seconds(expires, "expires_in_s")
    name = body.get("name") or f"{role}-key"
    if not isinstance(name, str):
        raise ValidationError([{"field": "name", "error": "must be a string"}])
    allow_code = body.get("allow_code", False)
    if not isinstance(allow_code, bool) or (allow_code and role not in (roles.Role.SUBMITTER, roles.Role.ADMIN)):
        raise ValidationError([{"field": "allow_code", "error": "must be true or false, and true only for a "
                                "submitter or admin key"}])
    plaintext, rec = sk.generate_key(role, name, rt.clock(), expires_in_s=expires, allow_code=allow_code)
    await rt.save_key(rec)
    log.info("created %s key %s (%s)", role, rec.key_id, name)
    return json_response({"key": plaintext, **key_view(rec)}, status=201)


async def list_keys(request: web.Request) -> web.Response:
    return json_response({"keys": [key_view(k) for k in request.app[RUNTIME].keys.values()]})


async def revoke_key(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    key_id = request.match_info["key_id"]
    if key_id not in rt.keys:
        raise NotFound(f"no key {key_id!r}")
    rec = await rt.revoke_key(key_id)
    return json_response(key_view(rec))


ROUTES: list[tuple[str, str, Any, str]] = [
    ("POST", "/api/v1/auth/token", issue_token, AUTHENTICATED),
    ("POST", "/api/v1/keys", create_key, "keys:manage"),
    ("GET", "/api/v1/keys", list_keys, "keys:manage"),
    ("POST", "/api/v1/keys/{key_id}/revoke", revoke_key, "keys:manage"),
    ("DELETE", "/api/v1/keys/{key_id}", revoke_key, "keys:manage"),
]
