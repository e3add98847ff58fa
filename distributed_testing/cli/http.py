"""A small synchronous JSON client for the REST API (the CLI needs nothing more)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from ..security import tls


class ApiError(Exception):
    """An HTTP error from the coordinator (``status`` 0: could not reach it)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ApiClient:
    def __init__(self, base_url: str, credential: str, timeout_s: float = 60.0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.base_url = base_url
        self.credential = credential
        self.timeout_s = timeout_s
        self.ssl_context = ssl_context  # https: verifies the chain and host name (system CAs when None)

    def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        return self._request("GET", path + query, None)

    def post(self, path: str, body: Any) -> Any:
        return self._request("POST", path, body)

    def _request(self, method: str, path: str, body: Any) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.credential}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s + 35, context=self.ssl_context) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, _describe(exc)) from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            cert = tls.describe_tls_error(reason if isinstance(reason, BaseException) else exc, self.base_url)
            if cert is not None:
                raise ApiError(0, f"cannot reach coordinator: {cert}") from exc
            raise ApiError(0, f"cannot reach coordinator at {self.base_url}: {reason}") from exc


def _describe(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read() or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"HTTP {exc.code}"
    errors = body.get("errors") or []
    if errors:  # the message repeats these on one line: each is said once, on its own line
        return f"HTTP {exc.code} {body.get('error', '')}:" + "".join(f"\n  {e.get('field')}: {e.get('error')}"
                                                                     for e in errors)
    return f"HTTP {exc.code} {body.get('error', '')}: {body.get('message', '')}"
