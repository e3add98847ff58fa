"""One address for the whole group, as its users see it: a round-robin TCP proxy (a load balancer,
``testing.RoundRobinProxy``) in front of three real coordinators on PostgreSQL, and two clients
that know only the proxy: the real ``curl -L`` and plain ``urllib``, each driven as a user's script
would (retry a 503 after its ``Retry-After``, retry a connection that failed or went silent, send a
submission again with the same ``task_id``s). Each submits, waits and reads results while the
leader is SIGKILLed, then while the next leader is SIGSTOPped. Every request must end in success,
the only failures on the way are 503s and transport errors (never a 401 from a lost credential nor
a 5xx of another kind), and every task ends ``succeeded`` exactly once with one result."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ha_support import HaGroup, Member, db_tasks

from distributed_testing.testing import RoundRobinProxy, pg_database_sync, wait_until

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

CURL = "/usr/bin/curl"
REQUEST_TIMEOUT_S = 10
Answer = tuple[int, float, Any]  # status (0: transport error), Retry-After seconds, JSON body


@pytest.fixture
def group(tmp_path: Path) -> Iterator[HaGroup]:
    with pg_database_sync(prefix="dt_ha_lb") as dsn:
        g = HaGroup(tmp_path, dsn)
        try:
            yield g
        finally:
            g.close()


def curl(url: str, key: str, method: str, path: str, body: Any = None) -> Answer:
    """``curl -L`` as a user types it; the status and Retry-After from ``--write-out``."""
    cmd = [CURL, "-sS", "-L", "-m", str(REQUEST_TIMEOUT_S), "-X", method, "-H", f"Authorization: Bearer {key}",
           "-w", "\n%{http_code} %header{retry-after}", url + path]
    if body is not None:
        cmd[1:1] = ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    done = subprocess.run(cmd, input=None if body is None else json.dumps(body).encode(), capture_output=True,
                          timeout=REQUEST_TIMEOUT_S + 5)
    if done.returncode != 0:
        return 0, 0.5, done.stderr.decode(errors="replace")
    text, _, tail = done.stdout.decode().rpartition("\n")
    code, _, retry = tail.partition(" ")
    return int(code), float(retry or 0.5), _json(text)


def plain(url: str, key: str, method: str, path: str, body: Any = None) -> Answer:
    """``urllib.request`` with its defaults."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method, headers={
        "Authorization": f"Bearer {key}", **({"Content-Type": "application/json"} if data else {})})
    try:
        with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
            return int(r.status), 0.0, _json(r.read().decode())
    except urllib.error.HTTPError as exc:
        return int(exc.code), float(exc.headers.get("Retry-After") or 0.5), _json(exc.read().decode(errors="replace"))
    except OSError as exc:
        return 0, 0.5, repr(exc)


def _json(text: str) -> Any:
    try:
        return json.loads(text or "null")
    except ValueError:
        return text


class User:
    """A user's script on one client: every request until it succeeds, every failure noted."""

    def __init__(self, name: str, call: Callable[..., Answer], url: str, key: str) -> None:
        self.name, self.call, self.url, self.key = name, call, url, key
        self.failures: list[tuple[int, Any]] = []

    def until_ok(self, method: str, path: str, body: Any = None, budget_s: float = 90.0) -> Any:
        end = time.monotonic() + budget_s
        while True:
            status, retry_after, answer = self.call(self.url, self.key, method, path, body)
            if 200 <= status < 300:
                return answer
            self.failures.append((status, answer))
            assert time.monotonic() < end, f"{self.name}: {method} {path} never succeeded: {self.failures[-5:]}"
            time.sleep(min(retry_after, 2.0))

    def run_task(self, task_id: str) -> dict[str, Any]:
        """Submit (again with the same id if the answer was lost), wait for the end, read the result."""
        self.until_ok("POST", "/api/v1/tasks", {"task_id": task_id, "type": "custom", "max_retries": 2,
                                                "config": {"name": "sleep", "parameters": {"seconds": 1.5}}})
        while (task := self.until_ok("GET", f"/api/v1/tasks/{task_id}?wait=5"))["state"] not in TERMINAL:
            pass
        results = self.until_ok("GET", f"/api/v1/results?task_id={task_id}")["results"]
        return {"state": task["state"], "results": results}


TERMINAL = {"succeeded", "failed", "timed_out", "cancelled", "error"}


def _leader(group: HaGroup) -> Member:
    def find() -> Member | None:
        return next((m for m in group.members.values() if m.proc.poll() is None and m.role() == "leader"), None)

    wait_until(lambda: find() is not None, 30, "a leader")
    leader = find()
    assert leader is not None
    return leader


def _started(dsn: str, task_ids: list[str]) -> bool:
    tasks = db_tasks(dsn)
    return all(tasks.get(t, {}).get("state") not in (None, "pending") for t in task_ids)


def test_curl_and_urllib_through_a_load_balancer_ride_through_a_kill_and_a_pause(group: HaGroup) -> None:
    a = group.start_member("a")
    group.wait_role(a, "leader")
    b, c = group.start_member("b"), group.start_member("c")
    group.wait_role(b, "standby")
    group.wait_role(c, "standby")
    admin = group.admin(a)
    members = [a, b, c]
    group.start_worker("w1", [m.url for m in members], admin.create_key("worker"), "--high-availability",
                       "--max-concurrent-tasks", "4")
    wait_until(lambda: "w1" in admin.workers(), 60, "the worker to register")
    proxy = RoundRobinProxy([("127.0.0.1", int(m.url.rsplit(":", 1)[1])) for m in members])
    users = [User("curl", curl, proxy.url, admin.key), User("urllib", plain, proxy.url, admin.key)]
    outcomes: dict[str, dict[str, Any]] = {}
    errors: list[BaseException] = []

    def both(task_ids: list[str]) -> list[threading.Thread]:
        def one(user: User, task_id: str) -> None:
            try:
                outcomes[task_id] = user.run_task(task_id)
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(u, f"{u.name}-{t}")) for u in users for t in task_ids]
        for t in threads:
            t.start()
        return threads

    paused: Member | None = None
    try:
        for kind in ("kill", "pause"):
            before = both([f"{kind}-before"])
            wait_until(lambda k=kind: _started(group.dsn, [f"{u.name}-{k}-before" for u in users]),  # type: ignore[misc]
                       30, "the first tasks to be given to the worker")
            leader = _leader(group)
            if kind == "kill":
                group.kill(leader)
            else:
                leader.proc.send_signal(signal.SIGSTOP)
                paused = leader
            after = both([f"{kind}-after"])
            for t in before + after:
                t.join(200)
            assert not errors, errors
    finally:
        if paused is not None:
            paused.proc.send_signal(signal.SIGCONT)
        proxy.close()
    ids = [f"{u.name}-{k}-{w}" for u in users for k in ("kill", "pause") for w in ("before", "after")]
    assert sorted(outcomes) == sorted(ids)
    for task_id, seen in outcomes.items():
        assert seen["state"] == "succeeded" and len(seen["results"]) == 1, (task_id, seen)
    tasks = db_tasks(group.dsn)
    for task_id in ids:
        history = tasks[task_id]["history"]
        assert sum(h["to"] == "succeeded" for h in history) == 1, history  # one outcome
        assigned = [h["attempt"] for h in history if h["to"] == "assigned"]
        assert len(set(assigned)) == len(assigned), history  # no attempt assigned twice
    for u in users:  # what the scripts met on the way: "not now", never a lost credential
        assert {status for status, _ in u.failures} <= {0, 503}, u.failures
        print(f"\n{u.name}: {len(u.failures)} retried failures: "
              f"{sorted({str(s) for s, _ in u.failures})}")
