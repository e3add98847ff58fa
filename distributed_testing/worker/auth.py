"""The worker's credentials: an API key, or a JWT that it renews before it expires.

With ``--api-key`` the key itself authenticates every handshake. With ``--token`` or
``--token-file`` the worker renews the JWT at two thirds of its lifetime through
``POST /api/v1/auth/token`` and hands the new one to the live session (``auth_renew``), so a
session outlives the token it opened with. ``--token-file`` is re-read at each reconnect, so an
external tool may rotate it.

Renewal works only within the coordinator's ``--max-session-age`` of the moment the API key was
exchanged for the first token. Once the coordinator refuses a renewal, the session lasts until
the current token expires; the next connect then stops the worker with a ``ConfigError`` that
says why (unless ``--token-file`` meanwhile holds another token).

For an ``https`` coordinator the certificate is verified against ``ca_file`` (``--ca-file``) or
the system's CAs; :attr:`Credentials.ssl` is that context, shared with the WebSocket client.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import jwt

from ..config import read_token_file
from ..errors import AuthError, ConfigError
from ..security import tls

log = logging.getLogger(__name__)


def token_expiry(token: str) -> float | None:
    """The ``exp`` claim, read without verification (only the coordinator can verify)."""
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return None
    exp = claims.get("exp")
    return float(exp) if isinstance(exp, (int, float)) else None


class Credentials:
    def __init__(self, coordinator_url: str, *, api_key: str | None = None, token: str | None = None,
                 token_file: Path | None = None, ca_file: Path | None = None, others: Sequence[str] = ()) -> None:
        given = [n for n, v in (("--api-key", api_key), ("--token", token), ("--token-file", token_file)) if v]
        if not given:
            raise ConfigError("no credentials: pass --api-key (or DT_API_KEY), --token or --token-file")
        if len(given) > 1:
            raise ConfigError(f"give only one of {', '.join(given)}")
        self.coordinator_url = coordinator_url
        self.api_key = api_key
        self.token_file = token_file
        self._token = token
        self._file_token: str | None = None
        self.ended: str | None = None  # why the current token can no longer be renewed
        # https: verified with ca_file or the system's CAs (any of the group's URLs: ``others``)
        self.ssl: ssl.SSLContext | None = (
            tls.client_context(ca_file) if any(u.startswith("https://") for u in (coordinator_url, *others)) else None)

    async def current(self) -> str:
        """The credential for the next handshake. ``ConfigError`` once the token has expired and
        could not be renewed (refused, or its session reached the maximum age), unless
        ``--token-file`` meanwhile holds another token."""
        if self.api_key:
            return self.api_key
        if self.token_file is not None:
            on_disk = read_token_file(self.token_file)
            if on_disk != self._file_token:  # rotated by an external tool since we last looked
                self._file_token = self._token = on_disk
                self.ended = None
        assert self._token is not None
        if self.ended is not None and (token_expiry(self._token) or 0) <= time.time():
            raise ConfigError(f"the worker's token expired and {self.ended}; restart the worker with --api-key "
                              "or a fresh --token/--token-file")
        return self._token

    def renew_in(self, now: float) -> float | None:
        """Seconds until the token should be renewed; None when nothing expires or it cannot be renewed."""
        if self.api_key or self._token is None or self.ended is not None:
            return None
        exp = token_expiry(self._token)
        if exp is None:
            return None
        issued_left = exp - now
        return max(0.0, issued_left * 2 / 3)

    async def renew(self) -> str:
        """Exchange the token for a fresh one. ``AuthError`` if the coordinator refuses (then no
        further renewal is tried); a token that reaches its session's end is the last one."""
        assert self._token is not None
        url = f"{self.coordinator_url}/api/v1/auth/token"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.ssl or True)) as http:
            async with http.post(url, headers={"Authorization": f"Bearer {self._token}"}) as resp:
                body = await resp.json(content_type=None)
                if resp.status in (401, 403):
                    self.ended = f"the coordinator refused to renew it (HTTP {resp.status}: {body.get('message', body)})"
                    log.error("token renewal refused: HTTP %d: %s; this session ends when the current token expires",
                              resp.status, body.get("message", body))
                    raise AuthError(f"token renewal refused: HTTP {resp.status}: {body.get('message', body)}")
                if resp.status != 200:
                    raise AuthError(f"token renewal failed: HTTP {resp.status}: {body.get('message', body)}")
        self._token = str(body["token"])
        session_end = body.get("session_expires_at")
        if isinstance(session_end, int | float) and body.get("expires_at", 0) >= session_end:
            self.ended = (f"its session reached the coordinator's maximum session age (--max-session-age) at "
                          f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(session_end))}")
            log.warning("renewed session token for the last time: %s", self.ended)
        else:
            log.info("renewed session token; new expiry %s", body.get("expires_at"))
        return self._token
