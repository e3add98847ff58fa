"""Dashboard sign-in sessions: an API key exchanged for a random session id kept in a cookie.

The key stays on the server, in this process's memory, and is used as the Bearer credential of
the user's REST calls; the browser holds only the session id (cookie ``dt_session``: HttpOnly,
SameSite=Strict, Secure when the request came over TLS) and the session's CSRF token, which every
action (cancel, drain, sign-out) must echo in ``X-CSRF-Token``. Sessions end on sign-out or after
``ttl_s``; a dashboard restart ends them all. Pure apart from ``secrets``: time is passed in.

Event streams are counted: at most ``MAX_STREAMS_PER_SESSION`` open at once per session and
``MAX_STREAMS_PER_KEY`` per key (over all its sessions), so one viewer cannot hold every
connection the dashboard has (``open_stream`` says no; the route answers 429).
"""

from __future__ import annotations

import hmac
import secrets
from collections import Counter
from dataclasses import dataclass

COOKIE = "dt_session"
CSRF_HEADER = "X-CSRF-Token"
DEFAULT_TTL_S = 8 * 3600.0
READ_ROLES = frozenset({"admin", "submitter", "viewer"})
# A page holds one stream; a browser opens at most 6 connections per host over HTTP/1.1, so a
# session past 8 is not a person with tabs open.
MAX_STREAMS_PER_SESSION = 8
MAX_STREAMS_PER_KEY = 32


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
    def can_rerun(self) -> bool:
        """Submit a run's tasks again (``tasks:submit``); the coordinator also wants the run's own key or an admin."""
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
        self._streams: Counter[str] = Counter()  # open event streams per session id and per "key:" id

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

    def open_stream(self, s: Session) -> bool:
        """Count a new event stream of ``s``; False (nothing counted) when ``s`` or its key holds
        as many as it may. Every True is paired with one ``close_stream``."""
        key = "key:" + s.key_id
        if self._streams[s.session_id] >= MAX_STREAMS_PER_SESSION or self._streams[key] >= MAX_STREAMS_PER_KEY:
            return False
        self._streams[s.session_id] += 1
        self._streams[key] += 1
        return True

    def close_stream(self, s: Session) -> None:
        for name in (s.session_id, "key:" + s.key_id):
            self._streams[name] -= 1
            if self._streams[name] <= 0:
                del self._streams[name]

    def _expire(self, now: float) -> None:
        for sid in [sid for sid, s in self._by_id.items() if s.expires_at <= now]:
            del self._by_id[sid]

    def __len__(self) -> int:
        return len(self._by_id)
