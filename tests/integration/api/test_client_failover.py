"""``ApiClient`` with the URLs of an HA group, against small real HTTP servers playing a leader, a
standby and a dead member: redirects followed with the same method and body, 503 answers and
refused connections sent on to the next member, a bounded wait for a failover (with one URL too:
a load balancer's), and no retry for a request that is not safe to repeat (a lost answer, a
standby's 502/504 included) nor for a single URL that refuses connections."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from distributed_testing.cli.http import FAILOVER_S, ApiClient, ApiError
from distributed_testing.cli.submit import all_have_ids, with_task_ids
from distributed_testing.client import FIRST_BYTE_S, ROUND_BACKOFF
from distributed_testing.coordinator import group
from distributed_testing.protocol import timing
from distributed_testing.testing import refusing_port

Answer = tuple[int, dict[str, str], Any]  # status, headers, JSON body (None: drop the connection)


@contextmanager
def server(answer: Callable[[str, str, bytes], Answer]) -> Iterator[tuple[str, list[tuple[str, str, bytes]]]]:
    """An HTTP server at the yielded URL; ``answer(method, path, body)`` decides each reply. The
    list records every request it got."""
    seen: list[tuple[str, str, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append((self.command, self.path, body))
            status, headers, payload = answer(self.command, self.path, body)
            if payload is None:  # the connection dies before any answer
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            data = json.dumps(payload).encode()
            self.send_response(status)
            for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **headers}.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _any

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    finally:
        srv.shutdown()
        srv.server_close()


def ok(method: str, path: str, body: bytes) -> Answer:
    return 200, {}, {"method": method, "path": path, "body": json.loads(body or b"null")}


def dead() -> str:
    return f"http://127.0.0.1:{refusing_port()}"


def cluster_view(*urls: str) -> Answer:
    """A member's ``GET /api/v1/cluster`` answer listing ``urls``."""
    return 200, {}, {"leader": urls[-1], "members": [{"url": u} for u in urls]}


def test_a_standby_redirect_is_followed_with_the_same_method_and_body() -> None:
    with server(ok) as (leader, got):
        def redirect(_m: str, path: str, _b: bytes) -> Answer:
            if path == "/api/v1/cluster":  # how the client learns that the leader is a member
                return cluster_view(standby, leader)
            return 307, {"Location": leader + path}, {"error": "not_leader", "leader": leader}

        with server(redirect) as (standby, _):
            api = ApiClient(standby, "k")
            assert api.post("/api/v1/tasks?wait=1", {"a": 1}) == {"method": "POST", "path": "/api/v1/tasks?wait=1",
                                                                  "body": {"a": 1}}
            assert api.base_url == leader and api.urls == [standby, leader]
            api.get("/api/v1/tasks/x")
            assert [g[1] for g in got] == ["/api/v1/tasks?wait=1", "/api/v1/tasks/x"]  # straight to the leader now


def test_a_refused_member_and_a_503_naming_the_leader_send_the_request_on() -> None:
    with server(ok) as (leader, got):
        with server(lambda *_: (503, {"Retry-After": "1"}, {"error": "not_leader", "leader": leader})) as (standby, s):
            api = ApiClient([dead(), standby, leader], "k", sleep=lambda _s: pytest.fail("no pause needed"))
            assert api.get("/api/v1/workers")["path"] == "/api/v1/workers"
            assert api.base_url == leader and len(s) == 1 and len(got) == 1


def test_a_failover_is_waited_out_between_rounds_and_then_given_up() -> None:
    state = {"n": 0}

    def takes_over(method: str, path: str, body: bytes) -> Answer:
        state["n"] += 1
        return ok(method, path, body) if state["n"] > 3 else (503, {"Retry-After": "1"},
                                                              {"error": "not_leader", "leader": None})

    pauses: list[float] = []
    with server(takes_over) as (member, _):
        api = ApiClient([dead(), member], "k", sleep=pauses.append)
        assert api.get("/x")["path"] == "/x"
        assert len(pauses) == 3  # one pause per full round of both members
        gone = ApiClient([dead(), dead()], "k", failover_s=0.0, sleep=pauses.append)
        with pytest.raises(ApiError, match="cannot reach coordinator"):
            gone.get("/x")


def test_a_member_a_standby_reports_silent_is_left_out_while_another_answers() -> None:
    """A paused leader accepts connections and says nothing: a client that asked it would wait the
    whole first-byte bound. The standby's 503 lists it as ``unhealthy``, so while the standby
    answers (it forwards to whichever member leads) the client never connects to it."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel completes the handshake; nobody ever answers
    silent_url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    state = {"n": 0}

    def standby(method: str, path: str, body: bytes) -> Answer:
        state["n"] += 1
        return ok(method, path, body) if state["n"] > 2 else (
            503, {"Retry-After": "1"}, {"error": "not_leader", "leader": None, "unhealthy": [silent_url]})

    pauses: list[float] = []
    try:
        with server(standby) as (member, _):
            api = ApiClient([member, silent_url], "k", timeout_s=30.0, sleep=pauses.append)
            assert api.get("/x")["path"] == "/x"
            assert len(pauses) == 2  # rounds of the standby alone
        silent.setblocking(False)
        with pytest.raises(BlockingIOError):
            silent.accept()  # no connection ever reached it
    finally:
        silent.close()


LOST = {"error": "answer_lost", "message": "the request was sent to the leader", "unhealthy": []}
NOT_LEADER = {"error": "not_leader", "leader": None, "unhealthy": []}


def test_one_url_retries_what_is_safe_to_repeat_and_reports_the_rest() -> None:
    """One address for a whole group, as a load balancer gives it: behind it a standby that lost
    the leader's answer (504), one that sees no leader (503), a dropped connection, then the new
    leader. What is safe to repeat (a GET, a submission whose tasks all have ids, a cancel) rides
    it out at that one address; a submission without ids is reported at the first lost answer,
    sent once. (With one URL nothing was retried: each of these ended at the first failure.)"""
    script: list[Answer] = []

    def balancer(method: str, path: str, body: bytes) -> Answer:
        return script.pop(0) if script else ok(method, path, body)

    def failover() -> list[Answer]:
        return [(504, {}, LOST), (503, {"Retry-After": "1"}, NOT_LEADER), (0, {}, None)]

    pauses: list[float] = []
    with server(balancer) as (one, seen):
        api = ApiClient(one, "k", sleep=pauses.append)
        for call in (lambda: api.get("/api/v1/tasks/t1"),
                     lambda: api.post("/api/v1/tasks", [{"task_id": "t1"}], repeatable=True),
                     lambda: api.post("/api/v1/tasks/t1/cancel", None, repeatable=True)):
            script[:] = failover()
            seen.clear()
            assert call()["method"] in ("GET", "POST")
            assert len(seen) == 4 and len(pauses) == 3  # the same address each time, a pause between
            pauses.clear()
        script[:] = failover()
        seen.clear()
        with pytest.raises(ApiError) as err:
            api.post("/api/v1/tasks", {"type": "custom"})
        assert err.value.status == 504 and err.value.body["error"] == "answer_lost" and len(seen) == 1


def test_one_url_gives_up_after_the_failover_bound_and_a_refused_one_at_once() -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    with server(lambda *_: (503, {}, {"error": "StoreError", "message": "disk"})) as (one, seen):
        with pytest.raises(ApiError, match="503 StoreError: disk"):
            ApiClient(one, "k", sleep=sleep, clock=lambda: now[0]).get("/x")
    assert FAILOVER_S <= now[0] < FAILOVER_S + ROUND_BACKOFF.max_s * 1.2 + 1e-9 and len(seen) > 5
    # nothing listens there: a wrong URL or a stopped coordinator, which no failover changes
    api = ApiClient(dead(), "k", sleep=lambda _s: pytest.fail("a refused connection is not retried"))
    with pytest.raises(ApiError, match="cannot reach coordinator") as err:
        api.get("/x")
    assert err.value.status == 0


def test_the_failover_bound_follows_from_the_group_s_lease() -> None:
    assert FAILOVER_S == timing.LEASE_TTL_S + timing.STANDBY_POLL_S + timing.TAKEOVER_S + 2 * FIRST_BYTE_S
    assert group.LEASE_TTL_S is timing.LEASE_TTL_S and group.STANDBY_POLL_S is timing.STANDBY_POLL_S


def test_a_lost_answer_is_retried_only_for_a_request_safe_to_repeat() -> None:
    with server(ok) as (good, got), server(lambda *_: (0, {}, None)) as (dropping, _):
        with pytest.raises(ApiError, match="cannot reach"):
            ApiClient([dropping, good], "k").post("/api/v1/tasks", {"type": "custom"})
        assert got == []  # a submission without ids may have been accepted: not sent twice
        assert ApiClient([dropping, good], "k").post("/api/v1/tasks", {"task_id": "t"}, repeatable=True)["body"] == {
            "task_id": "t"}
        assert ApiClient([dropping, good], "k").get("/y")["path"] == "/y"


@pytest.mark.parametrize("status", [502, 504])
def test_a_standby_s_lost_answer_is_resent_only_when_safe_to_repeat(status: int) -> None:
    """A standby's 502/504 ``answer_lost``: the leader got the request, so it may have been carried
    out; unlike a 503 (nothing sent), it is not sent to the next member unless safe to repeat."""
    lost = {"error": "answer_lost", "message": "the request was sent to the leader", "unhealthy": []}
    with server(ok) as (good, got), server(lambda *_: (status, {}, lost)) as (standby, _):
        with pytest.raises(ApiError) as err:
            ApiClient([standby, good], "k").post("/api/v1/tasks", {"type": "custom"})
        assert err.value.status == status and err.value.body["error"] == "answer_lost"
        assert got == []  # a submission without ids: not sent twice
        assert ApiClient([standby, good], "k").post("/api/v1/tasks", {"task_id": "t"}, repeatable=True)["body"] == {
            "task_id": "t"}
        assert ApiClient([standby, good], "k").get("/y")["path"] == "/y"


def test_dt_submit_names_every_task_so_a_resend_is_the_same_tasks() -> None:
    doc = [{"type": "custom", "config": {}}, {"task_id": "mine", "type": "test"}, "not a task"]
    named = with_task_ids(doc)
    assert named[0]["task_id"].startswith("custom-dt") and named[1]["task_id"] == "mine" and named[2] == "not a task"
    assert with_task_ids({"type": "x"})["task_id"].startswith("x-dt")
    assert all_have_ids(named[:2]) and not all_have_ids(named) and not all_have_ids([])
