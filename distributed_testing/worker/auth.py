"""The worker's credentials: an API key, or a JWT that it renews before it expires.

With ``--api-key`` the key itself authenticates every handshake. With ``--token`` or
``--token-file`` the worker renews the JWT at two thirds of its lifetime through
``POST /api/v1/auth/token`` and hands the new one to the live session (``auth_renew``), so a
session outlives the token it opened with. ``--token-file`` is re-read at each reconnect, so an
external tool may rotate it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import aiohttp
import jwt

from ..config import read_token_file
from ..errors import AuthError, ConfigError

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
                 token_file: Path | None = None) -> None:
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

    async def current(self) -> str:
        if self.api_key:
            return self.api_key
        if self.token_file is not None:
            on_disk = read_token_file(self.token_file)
            if on_disk != self._file_token:  # rotated by an external tool since we last looked
                self._file_token = self._token = on_disk
        assert self._token is not None
        return self._token

    def renew_in(self, now: float) -> float | None:
        """Seconds until the token should be renewed; None when nothing expires."""
        if self.api_key or self._token is None:
            return None
        exp = token_expiry(self._token)
        if exp is None:
            return None
        issued_left = exp - now
        return max(0.0, issued_left * 2 / 3)

    async def renew(self) -> str:
        assert self._token is not None
        url = f"{self.coordinator_url}/api/v1/auth/token"
        async with aiohttp.ClientSession() as http:
            async with http.post(url, headers={"Authorization": f"Bearer {self._token}"}) as resp:
                body = await resp.json(content_type=None)
                if resp.status != 200:
                    raise AuthError(f"token renewal refused: HTTP {resp.status}: {body.get('message', body)}")
        self._token = str(body["token"])
        log.info("renewed session token; new expiry %s", body.get("expires_at"))
        return self._token
