"""Dashboard sign-in sessions: an API key exchanged for a random session id kept in a cookie.

The key stays on the server, in this process's memory, and is used as the Bearer credential of
the user's REST calls; the browser holds only the session id (cookie ``dt_session``: HttpOnly,
SameSite=Strict, Secure when the request came over TLS) and the session's CSRF token, which every
action (cancel, drain, sign-out) must echo in ``X-CSRF-Token``. Sessions end on sign-out or after
``ttl_s``; a dashboard restart ends them all. Pure apart from ``secrets``: time is passed in.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass

COOKIE = "dt_session"
CSRF_HEADER = "X-CSRF-Token"
DEFAULT_TTL_S = 8 * 3600.0
READ_ROLES = frozenset({"admin", "submitter", "viewer"})


@dataclass(frozen=True)
class Session:
    session_id: str
    credential: str
    key_id: str
    role: str
    csrf: str
    expires_at: float

    @property
    def can_cancel(self) -> bool:
        return self.role in ("admin", "submitter")

    @property
    def can_drain(self) -> bool:
        return self.role == "admin"

    def csrf_ok(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token.encode(), self.csrf.encode())


class SessionStore:
    def __init__(self, ttl_s: float = DEFAULT_TTL_S) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        self.ttl_s = ttl_s
        self._by_id: dict[str, Session] = {}

    def create(self, credential: str, key_id: str, role: str, now: float) -> Session:
        self._expire(now)
        s = Session(secrets.token_urlsafe(32), credential, key_id, role, secrets.token_urlsafe(32), now + self.ttl_s)
        self._by_id[s.session_id] = s
        return s

    def get(self, session_id: str | None, now: float) -> Session | None:
        s = self._by_id.get(session_id or "")
        if s is None or s.expires_at <= now:
            if s is not None:
                del self._by_id[s.session_id]
            return None
        return s

    def end(self, session_id: str) -> None:
        self._by_id.pop(session_id, None)

    def _expire(self, now: float) -> None:
        for sid in [sid for sid, s in self._by_id.items() if s.expires_at <= now]:
            del self._by_id[sid]

    def __len__(self) -> int:
        return len(self._by_id)
