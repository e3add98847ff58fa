"""What a standby checks and how it passes requests on (coordinator/forward.py, the lean front's
relay in fast_http.py, the API middleware): a leader and a standby, real coordinator processes on
PostgreSQL, and plain HTTP clients (``http.client``, raw heads) talking to the standby."""

from __future__ import annotations

import gzip
import hashlib
import http.client
import json
import os
import signal
import socket
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from ha_support import HaGroup, Member, request

from distributed_testing.testing import pg_database_sync, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
DIGEST = "ab" * 32


class Pair:
    def __init__(self, group: HaGroup, leader: Member, standby: Member) -> None:
        self.group, self.leader, self.standby = group, leader, standby
        self.key = group.admin(leader).key


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    with pg_database_sync(prefix="dt_ha_checks") as dsn:
        g = HaGroup(tmp_path_factory.mktemp("pair"), dsn)
        try:
            a = g.start_member("a", "--dashboard")
            g.wait_role(a, "leader")
            b = g.start_member("b", "--dashboard")
            g.wait_role(b, "standby")
            yield Pair(g, a, b)
        finally:
            g.close()


def connect(url: str, timeout: float = 30) -> http.client.HTTPConnection:
    parts = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)


def head_only(url: str, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """Send a request head whose body never comes and read until the server closes the
    connection: (status, body). The answer must come from the head alone."""
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(f"{method} {path} HTTP/1.1\r\n".encode()
                     + "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode() + b"\r\n")
        data = b""
        while chunk := sock.recv(65536):  # EOF: the server closed it, not waiting for the body
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.mark.parametrize(("method", "path", "kind"), [
    ("POST", "/api/v1/tasks", "the lean front's relay"),
    ("PUT", f"/api/v1/blobs/{DIGEST}", "aiohttp's forwarding"),
])
def test_a_standby_refuses_a_bad_credential_from_the_head_before_any_body(pair: Pair, method: str, path: str,
                                                                          kind: str) -> None:
    """It used to take the body first (buffering it, and holding the connection for an hour on
    the lean front) and leave the check to the leader."""
    for auth, status in ((None, 401), ("Bearer dtk_nope_" + "A" * 43, 401)):
        headers: dict[str, Any] = {"Host": "x", "Content-Type": "application/octet-stream",
                                   "Content-Length": str(1 << 20)}
        if auth:
            headers["Authorization"] = auth
        got, body = head_only(pair.standby.url, method, path, headers)
        assert got == status and b'"AuthError"' in body, (kind, got, body)


def test_a_key_the_standby_has_not_heard_of_is_left_to_the_leader(pair: Pair) -> None:
    """A key made at the leader reaches a standby by ``LISTEN dt_keys`` a moment later: used at
    once through the standby it still works (the leader decides), and an unknown key the leader
    refuses is refused from the head, before any body (the leader is asked with ``Expect``)."""
    admin = pair.group.admin(pair.leader)
    for i in range(5):
        key = admin.ok("POST", "/api/v1/keys", json={"role": "submitter", "name": f"fresh{i}"})["key"]
        doc = {"type": "custom", "config": {"name": "noop"}, "task_id": f"fresh{i}"}
        assert request(pair.standby.url + "/api/v1/tasks", "POST", key, doc, timeout=30)[0] == 201  # the lean front's relay
        key = admin.ok("POST", "/api/v1/keys", json={"role": "submitter", "name": f"fresh{i}b"})["key"]
        assert request(pair.standby.url + f"/api/v1/tasks/fresh{i}", "GET", key, timeout=30)[0] == 200  # aiohttp's forwarding
    unknown = "Bearer dtk_nobody00_" + "A" * 43
    for method, path in (("POST", "/api/v1/tasks"), ("PUT", f"/api/v1/blobs/{DIGEST}")):
        status, body = head_only(pair.standby.url, method, path, {"Host": "x", "Authorization": unknown,
                                                                  "Content-Length": str(1 << 20)})
        assert status == 401 and b'"AuthError"' in body, (path, body)


def exchange(url: str, head: bytes, body: bytes) -> tuple[bytes, int, bytes]:
    """Send ``head`` (with ``Expect: 100-continue``), then ``body`` only once invited: (the
    interim answer or b"", final status, final body)."""
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        f = sock.makefile("rb")
        sock.sendall(head)
        interim = b""
        status_line = f.readline()
        if b" 100 " in status_line:
            interim = status_line + f.readline()  # and its blank line
            sock.sendall(body)
            status_line = f.readline()
        headers: dict[str, str] = {}
        while (line := f.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        return interim, int(status_line.split()[1]), f.read(int(headers.get("content-length", "0")))


def test_expect_100_continue_through_a_standby_is_invited_and_forwarded(pair: Pair) -> None:
    """``curl`` sends ``Expect: 100-continue`` with larger bodies: a standby invites the body of
    an authorized request and forwards it (it used to answer 503 not_leader); a refused one gets
    its refusal instead of the invitation."""
    body = b'{"type": "custom", "config": {"name": "noop"}}'
    for auth, status in ((f"Authorization: Bearer {pair.key}\r\n", 201), ("", 401)):
        head = (f"POST /api/v1/tasks HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n").encode()
        interim, got, answer = exchange(pair.standby.url, head, body)
        assert got == status, answer
        assert interim.startswith(b"HTTP/1.1 100 Continue") == (status == 201)


def test_a_compressed_body_through_a_standby_reaches_the_leader_decoded(pair: Pair) -> None:
    """The standby's aiohttp decodes the body; it used to forward it with the client's
    ``Content-Encoding: gzip`` still on, and the leader answered 400."""
    doc = json.dumps({"type": "custom", "config": {"name": "noop"}, "task_id": "gzipped"}).encode()
    headers = {"Authorization": f"Bearer {pair.key}", "Content-Type": "application/json", "Content-Encoding": "gzip"}
    conn = connect(pair.standby.url)
    try:
        conn.request("POST", "/api/v1/tasks", body=gzip.compress(doc), headers=headers)
        resp = conn.getresponse()
        assert resp.status == 201, resp.read()
        assert json.loads(resp.read())["tasks"][0]["task_id"] == "gzipped"
        # one the standby cannot decode gets the leader's own answer to it, from the standby
        conn.request("POST", "/api/v1/tasks", body=b"not gzip", headers=headers)
        resp = conn.getresponse()
        assert resp.status == 400 and json.loads(resp.read())["errors"][0]["field"] == "(body)"
    finally:
        conn.close()


def test_a_blob_over_the_app_s_body_limit_streams_through_a_standby(pair: Pair) -> None:
    """A blob between the app's body limit (16 MiB) and ``--max-bundle-file-mb`` (100 MiB): the
    standby streams it to the leader (it used to read it whole and fail with aiohttp's plain-text
    413). A declared length over a route's cap gets the leader's JSON 413 from the standby, before
    any body."""
    blob = os.urandom(17 << 20)
    digest = hashlib.sha256(blob).hexdigest()
    key = pair.group.admin(pair.leader).ok("POST", "/api/v1/keys",
                                           json={"role": "submitter", "allow_code": True})["key"]
    auth = {"Authorization": f"Bearer {key}"}  # used at once: the standby may not have heard of it yet
    conn = connect(pair.standby.url, timeout=60)
    try:
        conn.request("PUT", f"/api/v1/blobs/{digest}", body=blob,
                     headers={**auth, "Content-Type": "application/octet-stream"})
        resp = conn.getresponse()
        assert resp.status == 201, resp.read()
        resp.read()
        conn.request("GET", f"/api/v1/blobs/{digest}", headers=auth)
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read() == blob
    finally:
        conn.close()
    for method, path, length, error in (("PUT", f"/api/v1/blobs/{DIGEST}", 200 << 20, b'"TooLarge"'),
                                        ("POST", "/api/v1/tasks", 17 << 20, b'"RequestEntityTooLarge"')):
        status, body = head_only(pair.standby.url, method, path, {"Host": "x", **auth, "Content-Length": str(length),
                                                                  "Content-Type": "application/json"})
        assert status == 413 and error in body, (path, body)


def test_a_compressed_blob_over_the_app_s_body_limit_goes_through_a_standby(pair: Pair) -> None:
    """A gzip-encoded blob whose decoded size is past the app's body limit (16 MiB) but within
    ``--max-bundle-file-mb``: the standby reads it decoded up to the blob cap, as the leader does
    (it read it within the app's limit and answered 413). A body that does not decode is a 400
    naming it, from the standby and from the leader alike (the leader's blob route answered 500)."""
    blob = b"0123456789abcdef" * (17 << 16)  # 17 MiB, compresses to a few hundred KiB
    digest = hashlib.sha256(blob).hexdigest()
    key = pair.group.admin(pair.leader).ok("POST", "/api/v1/keys",
                                           json={"role": "submitter", "allow_code": True})["key"]
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/octet-stream",
               "Content-Encoding": "gzip"}
    conn = connect(pair.standby.url, timeout=60)
    try:
        conn.request("PUT", f"/api/v1/blobs/{digest}", body=gzip.compress(blob, 1), headers=headers)
        resp = conn.getresponse()
        assert resp.status == 201, resp.read()
        resp.read()
        conn.request("GET", f"/api/v1/blobs/{digest}", headers={"Authorization": headers["Authorization"]})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read() == blob
    finally:
        conn.close()
    for member in (pair.standby, pair.leader):
        conn = connect(member.url)
        try:
            conn.request("PUT", f"/api/v1/blobs/{DIGEST}", body=b"not gzip", headers=headers)
            resp = conn.getresponse()
            assert resp.status == 400, (member.url, resp.status, resp.read())
            assert json.loads(resp.read())["errors"][0]["field"] == "(body)"
        finally:
            conn.close()


@pytest.mark.timeout(60)
def test_the_dashboard_event_stream_through_a_standby_outlives_the_first_byte_bound(pair: Pair) -> None:
    """The leader writes a keepalive every 15 s into an idle stream; the standby used to give
    ``/dashboard/events`` the 5 s read bound of an ordinary answer and cut it (the browser then
    reconnected every 5 s). The first thing after the stream's start is a keepalive, not its end."""
    conn = connect(pair.standby.url)
    try:
        conn.request("POST", "/dashboard/login", body=urllib.parse.urlencode({"key": pair.key}),
                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 303, resp.status
        cookie = resp.getheader("Set-Cookie", "").split(";")[0]
        conn.request("GET", "/dashboard/events", headers={"Cookie": cookie})  # no Accept: the path alone
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Type", "").startswith("text/event-stream")
        lines = []
        while (line := resp.readline()) != b": keepalive\n":
            assert line, f"the stream ended before its first keepalive: {lines}"
            lines.append(line)
    finally:
        conn.close()


def test_a_client_leaving_a_forwarded_stream_is_logged_as_such_not_as_the_leader_breaking_off(pair: Pair) -> None:
    conn = connect(pair.standby.url)
    try:
        conn.request("GET", "/api/v1/events", headers={"Authorization": f"Bearer {pair.key}",
                                                        "Accept": "text/event-stream"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.readline().startswith(b"retry:")
    finally:
        conn.close()  # the client goes away mid-stream
    # an event for the stream to pass on (it used to fail writing it, and blame the leader)
    pair.group.admin(pair.leader).submit({"type": "custom", "config": {"name": "noop"}})
    wait_until(lambda: "went away before the leader's answer" in pair.standby.log_text(), 20,
               "the standby to notice its client left")
    assert "broke off" not in pair.standby.log_text()


def test_a_stopping_standby_ends_the_event_streams_it_forwards(pair: Pair) -> None:
    """A stream whose client stays would hold the standby's shutdown for aiohttp's whole
    shutdown timeout (60 s); the standby ends it first, as the leader ends its own streams."""
    c = pair.group.start_member("c")
    pair.group.wait_role(c, "standby")
    conn = connect(c.url, timeout=60)
    try:
        conn.request("GET", "/api/v1/events", headers={"Authorization": f"Bearer {pair.key}",
                                                        "Accept": "text/event-stream"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.readline().startswith(b"retry:")
        c.proc.send_signal(signal.SIGTERM)
        while resp.readline():  # until the standby ends it
            pass
        assert c.proc.wait(timeout=30) == 0  # well within aiohttp's 60 s
    finally:
        conn.close()
    assert "ended the forwarded answer to GET /api/v1/events: this member is stopping" in c.log_text()
