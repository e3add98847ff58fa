"""One address for the whole group, as its users see it (issue 28): a round-robin TCP proxy (a load
balancer, ``testing.RoundRobinProxy``) in front of three real coordinators on PostgreSQL (each in a
network namespace of its own, ``HaCluster``), and two clients
that know only the proxy: the real ``curl -L`` and plain ``urllib``, each driven as a user's script
would (retry a 503 after its ``Retry-After``, retry a connection that failed or went silent, send a
submission again with the same ``task_id``s). Each submits, waits and reads results while the
leader is SIGKILLed, then SIGSTOPped, then cut off (the last where ``ip netns`` is permitted).
Every request must end in success,
the only failures on the way are 503s, a standby's 502/504 ``answer_lost`` (the request reached
the leader, its answer did not come back) and transport errors (never a 401 from a lost credential
nor a 5xx of another kind), and every task ends ``succeeded`` exactly once with one result."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from chaos_group import HaCluster, group_behind_proxy

from distributed_testing.testing import wait_until
from distributed_testing.testing.netns import NetNs

pytestmark = [pytest.mark.timeout(400), pytest.mark.slow]

CURL = "/usr/bin/curl"
# A request routed to the paused member hangs until this, then goes again (the proxy, like a real
# balancer, sees that member accept and say nothing); the long polls ask for less (WAIT_S).
REQUEST_TIMEOUT_S = 5
WAIT_S = 2
Answer = tuple[int, float, Any]  # status (0: transport error), Retry-After seconds, JSON body


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
        while (task := self.until_ok("GET", f"/api/v1/tasks/{task_id}?wait={WAIT_S}"))["state"] not in TERMINAL:
            pass
        results = self.until_ok("GET", f"/api/v1/results?task_id={task_id}")["results"]
        return {"state": task["state"], "results": results}


TERMINAL = {"succeeded", "failed", "timed_out", "cancelled", "error"}


def _state(cluster: HaCluster, task_id: str) -> str | None:
    status, body = cluster.api.request("GET", f"/api/v1/tasks/{task_id}", params={"result": "0"})
    return str(body["state"]) if status == 200 else None


def test_curl_and_urllib_through_a_load_balancer_ride_through_a_kill_a_pause_and_a_cut(
        tmp_path: Path, namespaces: list[NetNs]) -> None:
    kinds = ("kill", "pause", "cut") if namespaces else ("kill", "pause")
    with group_behind_proxy(tmp_path, "dt_chaos_lb", namespaces) as (cluster, proxy):
        users = [User("curl", curl, proxy.url, cluster.api.key), User("urllib", plain, proxy.url, cluster.api.key)]
        outcomes = _rounds(cluster, users, kinds)
        ids = [f"{u.name}-{k}-{w}" for u in users for k in kinds for w in ("before", "after")]
        assert sorted(outcomes) == sorted(ids)
        for task_id, seen in outcomes.items():
            assert seen["state"] == "succeeded" and len(seen["results"]) == 1, (task_id, seen)
        for task_id in ids:
            history = cluster.api.ok("GET", f"/api/v1/tasks/{task_id}", params={"result": "0"})["history"]
            assert sum(h["to"] == "succeeded" for h in history) == 1, history  # one outcome
            assigned = [h["attempt"] for h in history if h["to"] == "assigned"]
            assert len(set(assigned)) == len(assigned), history  # no attempt assigned twice
        for u in users:  # what the scripts met on the way: "not now", never a lost credential
            # 502/504 answer_lost: a standby sent the request on and lost the leader's answer (the
            # script repeats it: a submission with the same task_id is a no-op)
            assert all(status in (0, 503) or (status in (502, 504) and isinstance(answer, dict)
                                              and answer.get("error") == "answer_lost")
                       for status, answer in u.failures), u.failures
            print(f"\n{u.name}: {len(u.failures)} retried failures: {sorted({str(s) for s, _ in u.failures})}")
        if not namespaces:
            print(f"no cut: {NetNs.unavailable()}")


def _rounds(cluster: HaCluster, users: list[User], kinds: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per kind: both users run a task submitted before the disruption and one after it."""
    outcomes: dict[str, dict[str, Any]] = {}
    errors: list[BaseException] = []

    def both(tag: str) -> list[threading.Thread]:
        def one(user: User) -> None:
            try:
                outcomes[f"{user.name}-{tag}"] = user.run_task(f"{user.name}-{tag}")
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(u,)) for u in users]
        for t in threads:
            t.start()
        return threads

    for kind in kinds:
        before = both(f"{kind}-before")
        wait_until(lambda k=kind: all(_state(cluster, f"{u.name}-{k}-before") not in (None, "pending")  # type: ignore[misc]
                                      for u in users), 60, "the first tasks to be given to the worker")
        wait_until(lambda: cluster.leader() is not None, 60, "a leader")
        i = cluster.leader()
        assert i is not None
        {"kill": cluster.kill_member, "pause": cluster.pause_member, "cut": cluster.cut_member}[kind](i)
        after = both(f"{kind}-after")
        for t in before + after:
            t.join(200)
        assert not errors, errors
        if kind == "kill":
            cluster.start_member(i)
        elif kind == "pause":
            cluster.resume_member(i)
        else:
            cluster.restore_member(i)
    return outcomes
