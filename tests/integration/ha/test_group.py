"""An HA group of real coordinator processes on a private PostgreSQL database.

Shared keys and revocations, standby answers (503 naming the leader to a worker), ``/api/v1/cluster``
and its roles, a SIGKILLed leader replaced with every task finishing once, a SIGSTOPped leader
that, resumed after its replacement, wrote and assigned nothing and rejoined as a standby, and
``dt submit --wait`` across a leader's death (its run read from the new leader). Failover times are printed (``-s`` shows them)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from ha_support import ROOT, HaGroup, db_tasks, request

from distributed_testing.protocol import messages as m
from distributed_testing.protocol.signing import Channel, derive_session_key
from distributed_testing.testing import Rest, pg_database_sync, wait_until

pytestmark = pytest.mark.timeout(90)
TERMINAL = {"succeeded", "failed", "timed_out", "cancelled", "error"}


@pytest.fixture(scope="module")
def dsn() -> Iterator[str]:
    with pg_database_sync(prefix="dt_ha_group") as url:
        yield url


@pytest.fixture
def group(tmp_path: Path, dsn: str) -> Iterator[HaGroup]:
    asyncio.run(_reset(dsn))
    g = HaGroup(tmp_path, dsn)
    try:
        yield g
    finally:
        g.close()


async def _reset(dsn: str) -> None:
    """Each test starts on an empty database (the module shares one)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        tables = [r["tablename"] for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        if tables:
            await conn.execute("DROP TABLE " + ", ".join(f'"{t}"' for t in tables) + " CASCADE")
    finally:
        await conn.close()


def two_members(group: HaGroup) -> tuple[Any, Any, Rest]:
    a = group.start_member("a")
    group.wait_role(a, "leader")
    b = group.start_member("b")
    group.wait_role(b, "standby")
    return a, b, group.admin(a)


def test_standby_answers_keys_reach_every_member_and_cluster_roles(group: HaGroup) -> None:
    a, b, admin = two_members(group)
    health = b.health()
    assert health is not None and health["leader"] == a.url and health["epoch"] is None
    # every other request is forwarded to the leader (test_forwarding.py), the worker endpoint 503
    status, headers, body = request(b.url + "/ws/worker", key=admin.key)
    assert status == 503 and body["leader"] == a.url and headers["Retry-After"] == "1"
    # /api/v1/cluster: any valid credential, on every member
    for who in (a, b):
        assert request(who.url + "/api/v1/cluster")[0] == 401
        assert request(who.url + "/api/v1/cluster", key="dtk_nope_" + "A" * 43)[0] == 401
    worker_key = admin.create_key("worker")
    wait_until(lambda: request(b.url + "/api/v1/cluster", key=worker_key)[0] == 200, 5,
               "a key made on the leader to work on the standby")  # documented: within a second
    view = request(b.url + "/api/v1/cluster", key=worker_key)[2]
    assert view["leader"] == a.url
    roles = {mm["url"]: mm["role"] for mm in view["members"]}
    assert roles == {a.url: "leader", b.url: "standby"} and all(mm["healthy"] for mm in view["members"])
    # a revocation through the leader reaches the standby (LISTEN dt_keys)
    key_id = next(k["key_id"] for k in admin.ok("GET", "/api/v1/keys")["keys"] if k["role"] == "worker")
    admin.ok("POST", f"/api/v1/keys/{key_id}/revoke")
    wait_until(lambda: request(b.url + "/api/v1/cluster", key=worker_key)[0] == 401, 5,
               "the revocation to reach the standby")  # documented: within a second
    # a JWT issued by one member is accepted by the others: the signing secret is the group's
    token = admin.ok("POST", "/api/v1/auth/token")["token"]
    assert request(b.url + "/api/v1/cluster", key=token)[0] == 200
    # DT_ADVERTISE_URL is what the group lists (and would send clients to)
    c = group.start_member("c", env={"DT_ADVERTISE_URL": "http://c.example:9/"})
    group.wait_role(c, "standby")
    wait_until(lambda: "http://c.example:9" in {mm["url"] for mm in admin.ok("GET", "/api/v1/cluster")["members"]},
               10, "the third member's advertised URL")


def test_rotating_the_group_secret_reaches_every_member(group: HaGroup) -> None:
    a, b, admin = two_members(group)
    token = admin.ok("POST", "/api/v1/auth/token")["token"]
    assert request(b.url + "/api/v1/cluster", key=token)[0] == 200
    rotate = subprocess.run([sys.executable, "run_coordinator.py", "--db-path", group.dsn, "--rotate-jwt-secret"],
                            cwd=ROOT, capture_output=True, timeout=60)
    assert rotate.returncode == 0 and b"rotated the group's token-signing secret" in rotate.stderr
    for member in (a, b):  # no restart: the members reload it on the notification
        wait_until(lambda m=member: request(m.url + "/api/v1/cluster", key=token)[0] == 401, 5,
                   f"{member.name} to refuse the old secret's token")  # documented: within a second
    fresh = admin.ok("POST", "/api/v1/auth/token")["token"]
    assert request(b.url + "/api/v1/cluster", key=fresh)[0] == 200
    # a graceful stop of the leader: exit 0, it leaves the member list and hands the lease over
    assert group.procs.stop(a.proc) == 0
    group.wait_role(b, "leader", timeout=5)  # a released lease is taken within a standby poll
    view = request(b.url + "/api/v1/cluster", key=fresh)[2]
    assert [mm["url"] for mm in view["members"]] == [b.url] and view["leader"] == b.url


def test_a_killed_leader_is_replaced_and_every_task_finishes_once(group: HaGroup) -> None:
    a, b, admin = two_members(group)
    key = admin.create_key("worker")
    # w2 is told only of the leader: --high-availability learns the standby from GET /api/v1/cluster
    for w, urls in (("w1", [a.url, b.url]), ("w2", [a.url])):
        group.start_worker(w, urls, key, "--high-availability", "--max-concurrent-tasks", "2")
    wait_until(lambda: len(admin.workers()) == 2 and all(w["state"] == "ready" for w in admin.workers().values()),
               60, "both workers to register")
    ids = admin.submit([{"task_id": f"t{i}", "type": "custom", "max_retries": 3,
                         "config": {"name": "sleep", "parameters": {"seconds": 0.3}}} for i in range(40)])
    wait_until(lambda: sum(t["state"] == "succeeded" for t in admin.tasks().values()) >= 8, 60, "a few tasks done")
    killed = group.kill(a)
    group.wait_role(b, "leader", timeout=5)  # documented: within about a second of the leader's death
    took = time.time()
    new_leader = Rest(b.url, admin.key)
    wait_until(lambda: all(t["state"] in TERMINAL for t in db_tasks(group.dsn).values()), 60, "every task to end")
    tasks = db_tasks(group.dsn)
    assert sorted(tasks) == sorted(ids) and {t["state"] for t in tasks.values()} == {"succeeded"}
    for t in tasks.values():
        assigned = [h for h in t["history"] if h["to"] == "assigned"]
        assert len({h["attempt"] for h in assigned}) == len(assigned)  # no attempt assigned twice
        assert sum(h["to"] == "succeeded" for h in t["history"]) == 1  # one outcome
    workers = new_leader.workers()
    assert {w: workers[w]["state"] for w in ("w1", "w2")} == {"w1": "ready", "w2": "ready"}  # both switched
    later = [h["at"] for t in tasks.values() for h in t["history"] if h["to"] == "assigned" and h["at"] > killed]
    print(f"\nfailover: kill -> new leader {took - killed:.2f}s (polled), kill -> next assignment "
          f"{min(later) - killed:.2f}s")


async def _raw_worker(url: str, key: str, worker_id: str) -> tuple[aiohttp.ClientSession, Any, Channel]:
    """A hand-driven worker asking for a 20 s heartbeat interval (a 60 s TTL): it stays connected
    to a paused coordinator, as a worker with a long interval would."""
    ids: list[str] = []

    async def on_end(_s: Any, _c: Any, params: aiohttp.TraceRequestEndParams) -> None:
        ids.append(params.response.headers.get("X-DT-Session", ""))

    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(on_end)
    http = aiohttp.ClientSession(trace_configs=[trace])
    ws = await http.ws_connect(url.replace("http://", "ws://") + "/ws/worker",
                               headers={"Authorization": f"Bearer {key}"}, autoping=False)
    ch = Channel(derive_session_key(key, ids[0]))
    await ws.send_bytes(ch.seal(m.Register(worker_id=worker_id, name=worker_id, protocol_version=m.PROTOCOL_VERSION,
                                           hardware={}, capabilities=["cpu"], tags=[], max_concurrent=1,
                                           heartbeat_interval_s=20.0), time.time()))
    return http, ws, ch


async def _next(ws: Any, ch: Channel, timeout: float = 15) -> m.Message | None:
    """The next signed message, or None once the coordinator closed the connection."""
    while True:
        frame = await ws.receive(timeout=timeout)
        if frame.type == aiohttp.WSMsgType.BINARY:
            return ch.open(frame.data, time.time())
        if frame.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING):
            return None


def test_a_paused_leader_is_fenced_then_rejoins_as_a_standby(group: HaGroup) -> None:
    a, b, admin = two_members(group)
    key = admin.create_key("worker")

    async def scenario() -> list[m.Message]:
        http, ws, ch = await _raw_worker(a.url, key, "raw")
        try:
            assert isinstance(await _next(ws, ch), m.Registered)
            admin.submit({"task_id": "first", "type": "custom", "config": {"name": "noop"}})
            assign = await _next(ws, ch)
            while not isinstance(assign, m.AssignTasks):
                assign = await _next(ws, ch)
            if assign.provisional:  # everything the leader sends before the pause is read before it
                while not isinstance(await _next(ws, ch), m.Confirm):
                    pass
            admin.submit({"task_id": "second", "type": "custom", "config": {"name": "noop"}})  # waits: no slot
            wait_until(lambda: admin.ok("GET", "/api/v1/tasks/second")["state"] == "pending", 10, "second pending")
            a.proc.send_signal(signal.SIGSTOP)
            await asyncio.to_thread(group.wait_role, b, "leader", 10)  # the lease TTL (5 s) and slack
            # the result reaches the paused process's socket; it would free the slot for "second"
            first = assign.tasks[0]
            now = time.time()
            await ws.send_bytes(ch.seal(m.Results([m.TaskResult(task_id=first.task_id, attempt=first.attempt,
                                                                 status="succeeded", started_at=now, finished_at=now,
                                                                 output={}, worker_id="raw")]), time.time()))
            a.proc.send_signal(signal.SIGCONT)
            seen: list[m.Message] = []
            while (msg := await _next(ws, ch)) is not None:
                seen.append(msg)
            return seen
        finally:
            await ws.close()
            await http.close()

    after_resume = asyncio.run(scenario())
    assert not any(isinstance(msg, (m.AssignTasks, m.ResultAck, m.Confirm)) for msg in after_resume), after_resume
    group.wait_role(a, "standby", timeout=30)  # a new standby term, on the same port
    wait_until(lambda: (a.health() or {}).get("leader") == b.url, 10, "the old leader to point at the new one")
    assert "lost the leadership" in a.log_text()
    new = Rest(b.url, admin.key)
    tasks = db_tasks(group.dsn)
    assert tasks["first"]["outcome"] is None and new.results(task_id="first") == []  # the paused one wrote nothing
    assert [h["to"] for h in tasks["second"]["history"]] == ["pending"]  # and assigned nothing


def test_dt_submit_wait_survives_the_leader_being_killed(group: HaGroup, tmp_path: Path) -> None:
    a, b, admin = two_members(group)
    group.start_worker("w1", [a.url, b.url], admin.create_key("worker"), "--high-availability",
                       "--max-concurrent-tasks", "2")
    wait_until(lambda: "w1" in admin.workers(), 60, "the worker to register")
    doc = tmp_path / "tasks.json"
    # both end after the kill, on the new leader: one succeeds, one times out (exit 1)
    doc.write_text(json.dumps([{"type": "custom", "config": {"name": "sleep", "parameters": {"seconds": 3}}},
                               {"type": "custom", "timeout_s": 2,
                                "config": {"name": "sleep", "parameters": {"seconds": 30}}}]))
    dt = subprocess.Popen([sys.executable, "-m", "distributed_testing.cli.dt", "--coordinator", f"{a.url},{b.url}",
                           "--api-key", admin.key, "submit", str(doc), "--wait", "--progress", "plain"],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert dt.stdout is not None
    ids = [dt.stdout.readline().decode().strip() for _ in range(2)]  # printed once accepted
    assert all(i.startswith("custom-dt") for i in ids)  # named by dt: a re-send would be the same tasks
    group.kill(a)
    out, err = dt.communicate(timeout=60)
    assert dt.returncode == 1, err.decode()  # one task timed out, the other succeeded
    tasks = db_tasks(group.dsn)
    assert (tasks[ids[0]]["state"], tasks[ids[1]]["state"]) == ("succeeded", "timed_out")
    summary = err.decode()
    assert "succeeded" in summary and "timed_out" in summary
    # the run dt made on the old leader is the new leader's too (its record is in PostgreSQL)
    (line,) = [ln for ln in summary.splitlines() if ln.startswith("run run-")]
    run = Rest(b.url, admin.key).ok("GET", f"/api/v1/runs/{line.split()[1]}")
    assert run["state"] == "failed" and run["counts"] == {"succeeded": 1, "timed_out": 1}, run
    assert [t["task_id"] for t in run["tasks"]] == [ids[1], ids[0]]  # the failure first
