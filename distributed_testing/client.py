"""The one coordinator client: which members of a group a client talks to, in what order, with
what timeouts, and where its credentials may go.

``Members`` is the policy, pure (no I/O; the clock is passed in), shared by every client: the
synchronous ``ApiClient`` here (``dt``, the pytest plugin, scripts), the worker's connection
attempts (``worker/coordinators.py``) and the dashboard's client (``dashboard/client.py``).

The credential rule (docs/security.md, "Redirects"): a request carrying a credential goes only to
a *member*, a URL the client was configured with or one a member listed in ``GET /api/v1/cluster``
(``Members.learn``), and never from an ``https`` member to an ``http`` URL. A standby's ``307
Location`` or its ``503 {"leader": URL}`` only *points* at a member: a URL that is not one is
refused (``Members.refusal``) rather than followed. Over https the cluster view comes over a
verified connection; over plain http nothing is verified, but the credential already crosses that
network in clear, so what an http member lists is trusted as far as that member is (never an
https member's list adding http URLs).

Timeouts: a connection is given ``CONNECT_TIMEOUT_S``; an answer's first byte ``FIRST_BYTE_S``
beyond a long poll's own ``?wait`` (a paused member accepts connections in the kernel and then
says nothing). A member that just failed (``RECENT_FAILURE_S``), or that a member's 503 listed as
silent (``unhealthy``), is tried after every other one, even when a standby names it as the
leader: a paused leader keeps its lease for a TTL, and the standbys keep naming it.

``ApiClient`` (synchronous, ``http.client``): a request goes to the current member, and

- a ``307``/``308`` answer or a ``503`` naming the leader sends it to that leader when it is a
  member (after asking the answering member's cluster view once, for a URL not yet known), with
  the same method and body; the leader becomes the current member;
- another ``503``, a refused or timed-out connection, a refused redirect, or (for a request that
  is safe to repeat: a GET, a cancel, a submission whose tasks all carry a ``task_id``) a lost
  or late answer sends it to the next member; a ``502`` or ``504`` (a standby's
  ``answer_lost``: the request reached the leader, whose answer did not come back; or a
  proxy's) is a lost answer too, so a request not safe to repeat is reported, never sent again;
- once every member failed, it pauses (``ROUND_BACKOFF``, :mod:`..retry`) and starts again,
  starting rounds for up to ``FAILOVER_S`` after the first failure (the failover bound, derived
  from the group's lease timing), then reports the last error. A member that failed just now is
  left out of a round in which another one answered (a standby forwards to whichever member
  leads, that one included, once it answers again).

With one URL (a single coordinator, or one address for a whole group, as a load balancer gives
it) the same holds: the next round goes to the same address, which a balancer hands to another
member. Only a refused connection or a failed TLS handshake is then reported at once: nothing
listens there, or not with that scheme, and no failover changes that (a balancer always accepts).
"""

from __future__ import annotations

import functools
import http.client
import json
import socket
import ssl
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .protocol.timing import FAILOVER_WINDOW_S
from .retry import Backoff, retry_within
from .security import tls

CONNECT_TIMEOUT_S = 1.0
FIRST_BYTE_S = 5.0
RECENT_FAILURE_S = 10.0
# The failover bound: how long after a request's first failure new rounds start. A group is without
# a leader that answers for at most FAILOVER_WINDOW_S after its leader fell silent (lease TTL, a
# standby's poll, its takeover); on top of that, two attempts that each met the silent member and
# waited out the first-byte bound (through a balancer, which the client cannot steer): 20.2 s.
FAILOVER_S = FAILOVER_WINDOW_S + 2 * FIRST_BYTE_S
ROUND_PAUSE_S = 0.25  # the pause after the first round in which every member failed; doubling to 2 s
ROUND_BACKOFF = Backoff(base_s=ROUND_PAUSE_S, factor=2.0, max_s=2.0, jitter=0.2)
MAX_REDIRECTS = 5
CLUSTER_PATH = "/api/v1/cluster"


@functools.lru_cache(maxsize=1024)
def canonical(url: str) -> str:
    """``url`` as members are compared: scheme and host in lower case, no trailing slash (cached:
    a standby compares its leader's URL at every request it forwards)."""
    parts = urllib.parse.urlsplit(url.strip())
    return urllib.parse.urlunsplit((parts.scheme.lower(), parts.netloc.lower(), parts.path.rstrip("/"), "", ""))


def _scheme(url: str) -> str:
    return urllib.parse.urlsplit(url).scheme.lower()


class Members:
    """The members a client may send its credential to (``urls``: configured first, then
    learned), and the order to try them in (``order``)."""

    def __init__(self, configured: Sequence[str]) -> None:
        self.urls: list[str] = list(dict.fromkeys(canonical(u) for u in configured))
        self._failed_at: dict[str, float] = {}

    def refusal(self, source: str, target: str, *, membership: bool = True) -> str | None:
        """Why a credential sent to ``source`` must not follow its pointer to ``target`` (None:
        it may); ``membership=False`` checks only the URL and the scheme."""
        src, dst = canonical(source), canonical(target)
        if _scheme(dst) not in ("http", "https") or not urllib.parse.urlsplit(dst).netloc:
            return f"refused the redirect from {src} to {target!r}: not an http(s) URL"
        if _scheme(src) == "https" and _scheme(dst) == "http":
            return (f"refused the redirect from {src} to {dst}: it would send the credential from https "
                    "to plain http")
        if membership and dst not in self.urls:
            return (f"refused the redirect from {src} to {dst}: not a member of the group this client was "
                    f"configured with or learned from a member ({', '.join(self.urls)})")
        return None

    def learn(self, view: Any, source: str) -> list[str]:
        """Take the members a ``GET /api/v1/cluster`` answer from ``source`` (a member) lists;
        returns the new ones. An https source adds no http URL."""
        members = view.get("members") if isinstance(view, dict) else None
        found = [m["url"] for m in members if isinstance(m, dict) and isinstance(m.get("url"), str)] \
            if isinstance(members, list) else []
        return self.add(found, secure_only=_scheme(source) == "https")

    def add(self, urls: Iterable[str], *, secure_only: bool = False) -> list[str]:
        allowed = ("https",) if secure_only else ("http", "https")
        new = [u for u in dict.fromkeys(canonical(u) for u in urls)
               if _scheme(u) in allowed and urllib.parse.urlsplit(u).netloc and u not in self.urls]
        self.urls.extend(new)
        return new

    def failed(self, url: str, now: float) -> None:
        self._failed_at[canonical(url)] = now

    def reported_unhealthy(self, urls: Any, now: float) -> None:
        """A member's 503 listed ``urls`` as silent (``unhealthy``): those that are members count as
        just failed, so they are tried last (a paused leader would hold a request for the whole
        first-byte bound). Nothing is sent anywhere because of it."""
        if isinstance(urls, list):
            for url in urls:
                if isinstance(url, str) and canonical(url) in self.urls:
                    self.failed(url, now)

    def succeeded(self, url: str) -> None:
        self._failed_at.pop(canonical(url), None)

    def recently_failed(self, url: str, now: float) -> bool:
        at = self._failed_at.get(canonical(url))
        return at is not None and now - at < RECENT_FAILURE_S

    def order(self, now: float, start: str | None = None) -> list[str]:
        """Every member once, from ``start`` on in list order, those that failed in the last
        ``RECENT_FAILURE_S`` last (the longest ago first)."""
        i = self.urls.index(canonical(start)) if start is not None and canonical(start) in self.urls else 0
        ring = self.urls[i:] + self.urls[:i]
        fresh = [u for u in ring if not self.recently_failed(u, now)]
        stale = sorted((u for u in ring if self.recently_failed(u, now)), key=lambda u: self._failed_at[u])
        return fresh + stale


def first_byte_timeout(path: str, base: float = FIRST_BYTE_S) -> float:
    """How long an answer to ``path`` may take to start: ``base``, plus a long poll's ``?wait``."""
    return base + wait_of(path)


def wait_of(path: str) -> float:
    """The seconds a request to ``path`` (with its query) asks to wait (``?wait=S``); 0 for none."""
    if "wait" not in path:
        return 0.0
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
    try:
        return max(0.0, float(query.get("wait", ["0"])[-1]))
    except ValueError:
        return 0.0


class ApiError(Exception):
    """An HTTP error from the coordinator (``status`` 0: could not reach it); ``body``: the
    answer's body, decoded JSON or else its text (None without one)."""

    def __init__(self, status: int, message: str, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class _Next(Exception):
    """This member cannot answer now: try ``leader`` if named, else the next one. ``conclusive``:
    waiting will not change it (a refused connection, a failed TLS handshake), so a client with
    this one member reports it at once."""

    def __init__(self, error: ApiError, leader: str | None = None, *, conclusive: bool = False) -> None:
        super().__init__(str(error))
        self.error = error
        self.leader = leader
        self.conclusive = conclusive


class ApiClient:
    """Synchronous JSON requests to a group's members (module docstring). ``timeout_s`` bounds
    an answer's first byte (``first_byte_timeout``); ``ssl_context`` verifies https members
    (the system's CAs when None); ``failover_s`` is the failover bound (0: the first round's
    failure is reported)."""

    def __init__(self, base_url: str | Sequence[str], credential: str, timeout_s: float = FIRST_BYTE_S,
                 ssl_context: ssl.SSLContext | None = None, *, failover_s: float = FAILOVER_S,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
        self.members = Members([base_url] if isinstance(base_url, str) else base_url)
        if not self.members.urls:
            raise ValueError("at least one coordinator URL")
        self.base_url = self.members.urls[0]  # where requests go first (the leader, once known)
        self.credential = credential
        self.timeout_s = timeout_s
        self.ssl_context = ssl_context  # None: the system CAs (http.client's default context)
        self.failover_s = failover_s
        self._sleep = sleep
        self._clock = clock

    @property
    def urls(self) -> list[str]:
        return self.members.urls

    def get(self, path: str, params: dict[str, str] | None = None) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        return self._request("GET", path + query, None, repeatable=True)[1]

    def post(self, path: str, body: Any, *, repeatable: bool = False) -> Any:
        """``repeatable``: sending it twice does no harm (a submission whose tasks all carry ids, a
        cancel), so an answer lost or late is asked for again, of another member if there is one."""
        return self._request("POST", path, body, repeatable=repeatable)[1]

    def request(self, method: str, path: str, body: Any = None, *, repeatable: bool = False) -> Any:
        """Any method (``get``/``post`` are this with their defaults): the decoded JSON answer, or
        ``ApiError``. ``repeatable`` as for ``post`` (a GET is not assumed to be: say so)."""
        return self._request(method, path, body, repeatable=repeatable)[1]

    def call(self, method: str, path: str, body: Any = None, *, repeatable: bool = False,
             timeout_s: float | None = None) -> tuple[int, Any]:
        """``request`` that hands back the final answer, whatever its status, as ``(status,
        body)`` (a 2xx body decoded JSON; another one as ``ApiError.body``), failing over as
        ``request`` does; ``ApiError`` only when no member answered (status 0). ``timeout_s``:
        this call's first-byte bound instead of the client's."""
        try:
            return self._request(method, path, body, repeatable=repeatable, timeout_s=timeout_s)
        except ApiError as exc:
            if exc.status == 0:
                raise
            return exc.status, exc.body

    def _request(self, method: str, path: str, body: Any, *, repeatable: bool,
                 timeout_s: float | None = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        try:
            return retry_within(lambda: self._round(method, path, data, repeatable, timeout_s), backoff=ROUND_BACKOFF,
                                within_s=self.failover_s, retry_on=(_Next,), what=f"{method} {path}",
                                clock=self._clock, sleep=self._sleep)
        except _Next as nxt:
            raise nxt.error from nxt

    def _round(self, method: str, path: str, data: bytes | None, repeatable: bool,
               timeout_s: float | None) -> tuple[int, Any]:
        """One round: the current member, then each other one at most once (redirects to the
        leader followed); the answer, or _Next (the last failure) once none is left, with the
        member to start the next round at made current. ApiError: an answer to report."""
        tried: set[str] = set()
        answered = False  # a member answered in this round (a standby: it forwards to any leader)
        redirects = 0
        while True:
            url = self.base_url
            try:
                answer = self._once(url, method, path, data, repeatable, timeout_s)
                self.members.succeeded(url)
                return answer
            except _Next as nxt:
                tried.add(url)
                if nxt.leader and canonical(nxt.leader) != url and redirects < MAX_REDIRECTS:
                    leader, refused = self._vet(url, nxt.leader)
                    if refused is not None:
                        nxt = _Next(ApiError(nxt.error.status, refused, nxt.error.body), conclusive=True)
                    elif not self.members.recently_failed(leader, self._clock()):
                        redirects += 1
                        self.base_url = leader
                        continue
                now = self._clock()
                if nxt.error.status == 0:
                    self.members.failed(url, now)
                else:
                    answered = True
                if nxt.conclusive and len(self.members.urls) == 1:
                    raise nxt.error from nxt
                left = [u for u in self.members.order(now, url) if u not in tried
                        and not (answered and self.members.recently_failed(u, now))]
                if not left:
                    self.base_url = self.members.order(now, url)[0]
                    raise nxt from None
                self.base_url = left[0]

    def _vet(self, source: str, leader: str) -> tuple[str, str | None]:
        """``(leader, why it is refused or None)``; a URL not yet a member is looked up once in
        ``source``'s cluster view (``source`` is a member)."""
        if canonical(leader) not in self.members.urls and self.members.refusal(source, leader, membership=False) is None:
            try:
                self.members.learn(self._once(source, "GET", CLUSTER_PATH, None, True)[1], source)
            except (ApiError, _Next):
                pass  # the redirect stays refused, and says why
        return canonical(leader), self.members.refusal(source, leader)

    def _once(self, url: str, method: str, path: str, data: bytes | None, repeatable: bool,
              timeout_s: float | None = None) -> tuple[int, Any]:
        status, headers, raw = self._exchange(url, method, path, data, repeatable, timeout_s)
        if status < 300:
            return status, json.loads(raw or b"null")
        if status in (307, 308) and (location := headers.get("Location")):
            raise _Next(ApiError(status, f"HTTP {status} to {location}", _decoded(raw)), _base_of(location, path))
        error = ApiError(status, _describe(status, raw), _decoded(raw))
        if status == 503:
            body = _json(raw)
            self.members.reported_unhealthy(body.get("unhealthy"), self._clock())
            leader = body.get("leader")
            raise _Next(error, leader if isinstance(leader, str) and leader else None)
        if status in (502, 504):  # a lost answer: the request may have been carried out
            self.members.reported_unhealthy(_json(raw).get("unhealthy"), self._clock())
            if repeatable:
                raise _Next(error)
        raise error

    def _exchange(self, url: str, method: str, path: str, data: bytes | None, repeatable: bool,
                  timeout_s: float | None = None) -> tuple[int, http.client.HTTPMessage, bytes]:
        """One HTTP exchange with a member: connect within ``CONNECT_TIMEOUT_S``, the answer's
        first byte within ``first_byte_timeout``; _Next when another member may be asked."""
        parts = urllib.parse.urlsplit(url)
        conn: http.client.HTTPConnection = (
            http.client.HTTPSConnection(parts.netloc, timeout=CONNECT_TIMEOUT_S, context=self.ssl_context)
            if parts.scheme == "https" else http.client.HTTPConnection(parts.netloc, timeout=CONNECT_TIMEOUT_S))
        headers = {"Authorization": f"Bearer {self.credential}", "Content-Type": "application/json"}
        try:
            try:
                conn.connect()
            except (OSError, http.client.HTTPException) as exc:
                cert = tls.describe_tls_error(exc, url)
                if cert is not None:
                    raise ApiError(0, f"cannot reach coordinator: {cert}") from exc
                hint = (f" (the TLS handshake failed: if the coordinator serves plain http, use "
                        f"http://{parts.netloc})" if parts.scheme == "https"
                        and isinstance(exc, ssl.SSLError | ConnectionResetError) else "")
                raise _Next(ApiError(0, f"cannot reach coordinator at {url}: {_reason(exc)}{hint}"),
                            conclusive=bool(hint) or isinstance(exc, ConnectionRefusedError)) from exc
            assert conn.sock is not None
            conn.sock.settimeout(first_byte_timeout(path, self.timeout_s if timeout_s is None else timeout_s))
            try:
                conn.request(method, parts.path + path, body=data, headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.msg, resp.read()
            except (OSError, http.client.HTTPException) as exc:
                error = ApiError(0, f"cannot reach coordinator at {url}: {_reason(exc)}")
                if repeatable:
                    raise _Next(error) from exc
                raise error from exc
        finally:
            conn.close()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


def _base_of(location: str, path: str) -> str:
    """The coordinator's base URL in a redirect to ``base + path``."""
    if location.endswith(path):
        return location[: len(location) - len(path)].rstrip("/")
    parts = urllib.parse.urlsplit(location)
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, "", "", ""))


def _decoded(raw: bytes) -> Any:
    """An error answer's body: its JSON, else its text (None when empty)."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return raw.decode(errors="replace")


def _json(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def _describe(code: int, raw: bytes) -> str:
    body = _json(raw)
    if not body:
        return f"HTTP {code}"
    errors = body.get("errors") or []
    if errors:  # the message repeats these on one line: each is said once, on its own line
        return f"HTTP {code} {body.get('error', '')}:" + "".join(f"\n  {e.get('field')}: {e.get('error')}"
                                                                 for e in errors)
    return f"HTTP {code} {body.get('error', '')}: {body.get('message', '')}"
