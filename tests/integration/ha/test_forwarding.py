"""A standby forwards every API request to the leader (coordinator/forward.py): three real
coordinator processes on PostgreSQL, and a plain HTTP client (``http.client``: it follows no
redirect, as ``curl`` without ``-L``) talking only to a standby. Submissions, long polls, reads and
the event stream answer as the leader does; the standby refuses bad credentials itself, counting
them against the original client's address, and the leader believes the address the standby
signed (``X-DT-Forwarded``) but not a forged header."""

from __future__ import annotations

import http.client
import json
import signal
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ha_support import HaGroup, Member

from distributed_testing.testing import pg_database_sync

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
NOOP = {"type": "custom", "config": {"name": "noop"}}


@pytest.fixture
def group(tmp_path: Path) -> Iterator[HaGroup]:
    with pg_database_sync(prefix="dt_ha_forward") as dsn:
        g = HaGroup(tmp_path, dsn)
        try:
            yield g
        finally:
            g.close()


def plain(url: str, method: str, path: str, key: str | None, body: Any = None, *, source: str = "127.0.0.1",
          headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    """One request from ``source`` (any 127/8 address), no redirect followed: (status, headers, JSON)."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30, source_address=(source, 0))
    data = None if body is None else json.dumps(body).encode()
    try:
        conn.request(method, path, body=data, headers={**({"Authorization": f"Bearer {key}"} if key else {}),
                                                       **({"Content-Type": "application/json"} if data else {}),
                                                       **(headers or {})})
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, dict(resp.getheaders()), json.loads(raw) if raw.startswith((b"{", b"[")) else raw
    finally:
        conn.close()


def three(group: HaGroup, *extra: str) -> tuple[Member, Member, Member]:
    a = group.start_member("a", *extra)
    group.wait_role(a, "leader")
    b, c = group.start_member("b", *extra), group.start_member("c", *extra)
    group.wait_role(b, "standby")
    group.wait_role(c, "standby")
    return a, b, c


def test_a_plain_client_submits_waits_and_reads_through_a_standby(group: HaGroup) -> None:
    a, b, _ = three(group)
    key = group.admin(a).key
    status, _, body = plain(b.url, "POST", "/api/v1/tasks", key, NOOP)
    assert status in (200, 201), body  # the leader's own answer, not a 307
    [task_id] = [t["task_id"] for t in body["tasks"]]
    status, _, task = plain(b.url, "GET", f"/api/v1/tasks/{task_id}", key)
    assert status == 200 and task["task_id"] == task_id and task["state"] == "pending"
    # a long poll: no worker, so the wait runs out and the answer says queued
    status, _, body = plain(b.url, "POST", "/api/v1/tasks?wait=1", key, {**NOOP, "task_id": "polled"})
    assert status in (200, 201, 202), body
    assert plain(a.url, "GET", "/api/v1/tasks/polled", key)[0] == 200  # it reached the leader
    # the event stream, streamed back as it is written
    parts = urllib.parse.urlsplit(b.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("GET", "/api/v1/events", headers={"Authorization": f"Bearer {key}", "Accept": "text/event-stream"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Type", "").startswith("text/event-stream")
        assert resp.readline().startswith(b"retry:")
    finally:
        conn.close()
    # one hop only: what a member forwarded is not forwarded again (stale views never loop)
    status, headers, body = plain(b.url, "GET", "/api/v1/workers", key, headers={"X-DT-Forwarded": "x;1;00"})
    assert status == 503 and headers["Retry-After"] == "1" and body["error"] == "not_leader"
    # the worker endpoint still names the leader: workers connect to it themselves
    status, _, body = plain(b.url, "GET", "/ws/worker", key)
    assert status == 503 and body["leader"] == a.url
    # a standby told to stop ends the streams it forwards, as the leader ends its own, instead of
    # waiting for each client to leave (its shutdown would wait for them)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request("GET", "/api/v1/events", headers={"Authorization": f"Bearer {key}", "Accept": "text/event-stream"})
        resp = conn.getresponse()
        assert resp.readline().startswith(b"retry:")
        assert group.procs.stop(b.proc) == 0
        assert b"keepalive" not in resp.read()  # the stream ended: EOF
    finally:
        conn.close()
    assert "ended the forwarded answer to GET /api/v1/events: this member is stopping" in b.log_text()


def test_failures_count_against_the_original_client_not_the_standby(group: HaGroup) -> None:
    a, b, _ = three(group, "--auth-fail-limit", "3")
    key = group.admin(a).key
    bad = "dtk_nope_" + "A" * 43
    # the standby refuses a bad credential itself, from the head, counting it against the client
    answers = [plain(b.url, "GET", "/api/v1/workers", bad, source="127.0.0.2")[0] for _ in range(5)]
    assert answers[0] == 401 and answers[-1] == 429, answers
    # another client through the same standby is not refused: the standby's own address is not throttled
    assert plain(b.url, "GET", "/api/v1/workers", key, source="127.0.0.3")[0] == 200
    # the same for submissions, which the standby's lean front relays (fast_http.py)
    answers = [plain(b.url, "POST", "/api/v1/tasks", bad, NOOP, source="127.0.0.5")[0] for _ in range(5)]
    assert answers[0] == 401 and answers[-1] == 429, answers
    assert plain(b.url, "POST", "/api/v1/tasks", key, NOOP, source="127.0.0.6")[0] in (200, 201)
    # the leader believes the address a standby signed: a client it refuses is refused through b too
    answers = [plain(a.url, "GET", "/api/v1/workers", bad, source="127.0.0.7")[0] for _ in range(5)]
    assert answers[-1] == 429, answers
    assert plain(b.url, "GET", "/api/v1/workers", key, source="127.0.0.7")[0] == 429
    assert plain(b.url, "POST", "/api/v1/tasks", key, NOOP, source="127.0.0.7")[0] == 429
    assert plain(b.url, "GET", "/api/v1/workers", key, source="127.0.0.8")[0] == 200
    # a forged X-DT-Forwarded straight to the leader counts as its own sender
    forged = {"X-DT-Forwarded": "127.0.0.9;1;00"}
    answers = [plain(a.url, "GET", "/api/v1/workers", bad, source="127.0.0.4", headers=forged)[0] for _ in range(5)]
    assert answers[-1] == 429
    assert plain(a.url, "GET", "/api/v1/workers", key, source="127.0.0.9")[0] == 200


def test_while_the_leader_is_paused_a_standby_answers_503_with_retry_after_then_serves(group: HaGroup) -> None:
    a, b, _ = three(group)
    key = group.admin(a).key
    a.proc.send_signal(signal.SIGSTOP)  # b and c keep naming it until its lease runs out
    try:
        answers: list[int] = []
        deadline = time.monotonic() + 12  # the lease TTL (5 s) + 2 s is the documented bound; slack for load
        while time.monotonic() < deadline and 200 not in answers:
            status, headers, body = plain(b.url, "GET", "/api/v1/workers", key)
            answers.append(status)
            if status == 503:  # the leader is silent, or a takeover is under way: nothing was sent
                assert headers["Retry-After"] == "1" and body["error"] == "not_leader", body
            if status == 504:  # sent before b saw the leader silent: the paused leader has the request
                assert body["error"] == "answer_lost", body
    finally:
        a.proc.send_signal(signal.SIGCONT)
    assert answers[-1] == 200 and set(answers) <= {200, 503, 504}, answers
