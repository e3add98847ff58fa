"""A request a standby forwarded that reached the leader, whose answer then did not come back
(coordinator/forward.py): three real coordinator processes on PostgreSQL. The standby answers 504
or 502 ``answer_lost``, never the 503 ``not_leader`` that sends a client to the next member, so a
submission without task ids reaches the group once: ``ApiClient`` does not send it again. (It
used to get 503, and ``ApiClient`` re-sent the tasks to the next leader: they ran twice.)"""

from __future__ import annotations

import http.client
import json
import signal
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ha_support import HaGroup, Member, db_tasks

from distributed_testing.client import ApiClient, ApiError
from distributed_testing.testing import pg_database_sync, wait_until

pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]
NOOP = {"type": "custom", "config": {"name": "noop"}}  # no task_id: not safe to send twice


@pytest.fixture
def group(tmp_path: Path) -> Iterator[HaGroup]:
    with pg_database_sync(prefix="dt_ha_lost") as dsn:
        g = HaGroup(tmp_path, dsn)
        try:
            yield g
        finally:
            g.close()


def three(group: HaGroup) -> tuple[Member, Member, Member]:
    a = group.start_member("a")
    group.wait_role(a, "leader")
    b, c = group.start_member("b"), group.start_member("c")
    group.wait_role(b, "standby")
    group.wait_role(c, "standby")
    return a, b, c


def test_a_submission_whose_leader_froze_after_taking_it_is_not_sent_again(group: HaGroup) -> None:
    """The lean front's relay: the leader stored the tasks, then froze (SIGSTOP) while the
    ``?wait`` answer was pending; the standby gives up on it (504), and the client reports it."""
    a, b, c = three(group)
    key = group.admin(a).key
    api = ApiClient([b.url, c.url], key)  # two members: a 503 would send it to the other one
    outcome: dict[str, Any] = {}

    def submit() -> None:
        try:
            outcome["answer"] = api.post("/api/v1/tasks?wait=60", NOOP)
        except ApiError as exc:
            outcome["error"] = exc

    t = threading.Thread(target=submit)
    t.start()
    wait_until(lambda: len(db_tasks(group.dsn)) == 1, 30, "the leader to store the task")
    a.proc.send_signal(signal.SIGSTOP)
    try:
        t.join(120)
        assert not t.is_alive()
        err = outcome.get("error")
        assert isinstance(err, ApiError), outcome
        assert err.status == 504 and err.body["error"] == "answer_lost", (err.status, err.body)
        assert "may have been carried out" in err.body["message"]
        assert len(db_tasks(group.dsn)) == 1  # submitted once
    finally:
        a.proc.send_signal(signal.SIGCONT)


def test_a_leader_killed_after_taking_a_forwarded_request_is_a_lost_answer_not_a_503(group: HaGroup) -> None:
    """aiohttp's forwarding (a chunked body: the lean front hands it to aiohttp): the leader
    dies with the request in hand; the standby's answer says the answer was lost."""
    a, b, _ = three(group)
    key = group.admin(a).key
    parts = urllib.parse.urlsplit(b.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    outcome: dict[str, Any] = {}

    def submit() -> None:
        conn.request("POST", "/api/v1/tasks?wait=60", body=iter([json.dumps(NOOP).encode()]), encode_chunked=True,
                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        outcome["status"], outcome["body"] = resp.status, json.loads(resp.read())

    t = threading.Thread(target=submit)
    t.start()
    try:
        wait_until(lambda: len(db_tasks(group.dsn)) == 1, 30, "the leader to store the task")
        group.kill(a)
        t.join(60)
        assert not t.is_alive()
        # 502: the connection broke; 504: the watch saw another member take the lease first
        assert outcome["status"] in (502, 504) and outcome["body"]["error"] == "answer_lost", outcome
    finally:
        conn.close()


def test_a_stopping_standby_hands_back_the_long_polls_it_forwards_at_once(group: HaGroup) -> None:
    """SIGTERM to a standby that forwards ``?wait`` polls: it answers them lost at once (the POST's
    client is told it may have been carried out; a GET goes on to the leader) and exits, instead of
    holding its stop until each wait ends (it waited out a 60 s poll before)."""
    a = group.start_member("a")
    group.wait_role(a, "leader")
    b = group.start_member("b")
    group.wait_role(b, "standby")
    key = group.admin(a).key
    outcome: dict[str, Any] = {}

    def submit() -> None:  # one member, as a plain client: nothing is sent again
        try:
            outcome["answer"] = ApiClient([b.url], key).post("/api/v1/tasks?wait=200", NOOP)
        except ApiError as exc:
            outcome["error"] = exc

    t = threading.Thread(target=submit)
    t.start()
    wait_until(lambda: len(db_tasks(group.dsn)) == 1, 30, "the leader to store the task")
    [task_id] = db_tasks(group.dsn)
    polled: dict[str, Any] = {}
    poll = threading.Thread(target=lambda: polled.update(
        ApiClient([b.url, a.url], key).get(f"/api/v1/tasks/{task_id}", {"wait": "3"})))
    poll.start()
    b.proc.send_signal(signal.SIGTERM)
    assert b.proc.wait(100) == 0
    t.join(10)
    poll.join(30)
    err = outcome.get("error")
    assert isinstance(err, ApiError) and err.status == 504 and err.body["error"] == "answer_lost", outcome
    assert "this member is stopping" in err.body["message"]
    assert polled["task_id"] == task_id and polled["state"] == "pending"
    assert len(db_tasks(group.dsn)) == 1
