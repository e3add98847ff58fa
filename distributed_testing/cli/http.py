"""A small synchronous JSON client for the REST API (the CLI needs nothing more).

Several coordinator URLs (the members of an HA group, ``DT_COORDINATOR_URL=http://a:8080,http://b:8080``):
a request goes to the current one, and

- a ``307``/``308`` answer (a standby) is followed with the same method and body, and the leader
  it names becomes the current coordinator;
- a ``503`` answer naming the leader (``{"error": "not_leader", "leader": URL}``) sends the
  request there; another ``503``, a refused connection, or (for a request that is safe to repeat:
  a GET, or a submission whose tasks all carry a ``task_id``) a connection reset before the answer
  sends it to the next coordinator;
- once every known coordinator failed, it pauses ``ROUND_PAUSE_S`` and starts again, for up to
  ``FAILOVER_S`` in all (a leader's failover takes a few seconds), then reports the last error.

With one URL (and no redirect that named another) nothing is retried: errors are reported at once.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from ..security import tls

FAILOVER_S = 20.0
ROUND_PAUSE_S = 0.25
MAX_REDIRECTS = 5


class ApiError(Exception):
    """An HTTP error from the coordinator (``status`` 0: could not reach it)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are followed by ``ApiClient`` itself (urllib would turn a POST's 307 into an error
    and re-send a GET without telling us where the leader is)."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> None:
        return None


class _Next(Exception):
    """This coordinator cannot answer now: try ``leader`` if named, else the next one."""

    def __init__(self, error: ApiError, leader: str | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.leader = leader


class ApiClient:
    def __init__(self, base_url: str | Sequence[str], credential: str, timeout_s: float = 60.0,
                 ssl_context: ssl.SSLContext | None = None, *, failover_s: float = FAILOVER_S,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.urls = [base_url] if isinstance(base_url, str) else list(dict.fromkeys(base_url))
        if not self.urls:
            raise ValueError("at least one coordinator URL")
        self.base_url = self.urls[0]  # the coordinator requests go to first (the leader, once known)
        self.credential = credential
        self.timeout_s = timeout_s
        self.ssl_context = ssl_context  # https: verifies the chain and host name (system CAs when None)
        self.failover_s = failover_s
        self._sleep = sleep
        handlers: list[Any] = [_NoRedirect()]
        if ssl_context is not None:
            handlers.append(urllib.request.HTTPSHandler(context=ssl_context))
        self._opener = urllib.request.build_opener(*handlers)

    def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        return self._request("GET", path + query, None, repeatable=True)

    def post(self, path: str, body: Any, *, repeatable: bool = False) -> Any:
        """``repeatable``: sending it twice does no harm (a submission whose tasks all carry ids),
        so a connection lost before the answer may be retried on another coordinator."""
        return self._request("POST", path, body, repeatable=repeatable)

    def _request(self, method: str, path: str, body: Any, *, repeatable: bool) -> Any:
        data = None if body is None else json.dumps(body).encode()
        deadline = time.monotonic() + self.failover_s
        failed: set[str] = set()
        redirects = 0
        while True:
            url = self.base_url
            try:
                return self._once(url, method, path, data, repeatable)
            except _Next as nxt:
                if nxt.leader and nxt.leader != url and redirects < MAX_REDIRECTS:
                    redirects += 1
                    self._use(nxt.leader)
                    continue
                failed.add(url)
                if len(self.urls) == 1:
                    raise nxt.error from nxt
                left = [u for u in self.urls if u not in failed]
                if not left:
                    if time.monotonic() >= deadline:
                        raise nxt.error from nxt
                    self._sleep(ROUND_PAUSE_S)
                    failed.clear()
                    redirects = 0
                    left = self.urls
                self.base_url = left[(left.index(url) + 1) % len(left)] if url in left else left[0]

    def _use(self, leader: str) -> None:
        if leader not in self.urls:
            self.urls.append(leader)
        self.base_url = leader

    def _once(self, url: str, method: str, path: str, data: bytes | None, repeatable: bool) -> Any:
        req = urllib.request.Request(url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.credential}", "Content-Type": "application/json"})
        try:
            with self._opener.open(req, timeout=self.timeout_s + 35) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            if exc.code in (307, 308) and (location := exc.headers.get("Location")):
                raise _Next(ApiError(exc.code, f"HTTP {exc.code} to {location}"), _base_of(location, path)) from exc
            error = ApiError(exc.code, _describe(exc.code, raw))
            if exc.code == 503:
                leader = _json(raw).get("leader")
                raise _Next(error, leader.rstrip("/") if isinstance(leader, str) and leader else None) from exc
            raise error from exc
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            cert = tls.describe_tls_error(reason if isinstance(reason, BaseException) else exc, url)
            if cert is not None:
                raise ApiError(0, f"cannot reach coordinator: {cert}") from exc
            error = ApiError(0, f"cannot reach coordinator at {url}: {reason}")
            unsent = isinstance(reason, ConnectionRefusedError)
            lost = isinstance(reason, ConnectionResetError | http.client.RemoteDisconnected | BrokenPipeError)
            if unsent or (lost and repeatable):
                raise _Next(error) from exc
            raise error from exc


def _base_of(location: str, path: str) -> str:
    """The coordinator's base URL in a redirect to ``base + path``."""
    if location.endswith(path):
        return location[: len(location) - len(path)].rstrip("/")
    parts = urllib.parse.urlsplit(location)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, "", "", ""))


def _json(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def _describe(code: int, raw: bytes) -> str:
    try:
        body = json.loads(raw or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"HTTP {code}"
    if not isinstance(body, dict):
        return f"HTTP {code}"
    errors = body.get("errors") or []
    if errors:  # the message repeats these on one line: each is said once, on its own line
        return f"HTTP {code} {body.get('error', '')}:" + "".join(f"\n  {e.get('field')}: {e.get('error')}"
                                                                 for e in errors)
    return f"HTTP {code} {body.get('error', '')}: {body.get('message', '')}"
