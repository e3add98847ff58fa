"""Every REST route x every kind of caller, against a real coordinator over real sockets.

The expected matrix is written from the documented role table (security/roles.py docstring), not
read from ``ROLE_PERMISSIONS``, and a denied call is checked to have changed nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from distributed_testing.bundles import manifest as mf
from distributed_testing.coordinator.api import ROUTES
from distributed_testing.protocol import messages as m
from distributed_testing.protocol.signing import Channel, derive_session_key
from distributed_testing.security.keys import KEY_PREFIX
from distributed_testing.tasks.spec import task_json_schema
from distributed_testing.testing import Cluster, raw_worker, run_cluster, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]

ROLES = ("admin", "submitter", "worker", "viewer")
BAD_CALLERS = ("no-credentials", "garbage", "unknown-key", "forged-secret", "malformed-header", "revoked", "expired")
CALLERS = ROLES + BAD_CALLERS
READERS = frozenset({"admin", "submitter", "viewer"})
SUBMITTERS = frozenset({"admin", "submitter"})


@pytest_asyncio.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with run_cluster(tmp_path, workers=0) as c:
        yield c


async def create_key(c: Cluster, role: str, **extra: Any) -> dict[str, Any]:
    status, body = await c.request("POST", "/api/v1/keys", json={"role": role, **extra})
    assert status == 201, body
    return dict(body)


async def submit(c: Cluster, task_id: str | None = None, **extra: Any) -> str:
    task_id = task_id or f"t-{uuid.uuid4().hex[:8]}"
    await c.submit({"task_id": task_id, "type": "custom", "config": {"name": "noop"}, **extra})
    return task_id


async def headers_for(c: Cluster, caller: str) -> dict[str, str]:
    """The Authorization header each kind of caller sends."""
    if caller in ROLES:
        return {"Authorization": f"Bearer {c.admin_key if caller == 'admin' else await c.create_key(caller)}"}
    if caller == "no-credentials":
        return {}
    if caller == "garbage":
        return {"Authorization": "Bearer not.a.jwt"}
    if caller == "unknown-key":
        return {"Authorization": f"Bearer {KEY_PREFIX}zzzzzzzz_{'A' * 43}"}
    if caller == "forged-secret":  # a real key id with a made-up secret
        key_id = c.admin_key.split("_")[1]
        return {"Authorization": f"Bearer {KEY_PREFIX}{key_id}_{'B' * 43}"}
    if caller == "malformed-header":
        return {"Authorization": f"Basic {c.admin_key}"}
    if caller == "revoked":
        made = await create_key(c, "admin")
        status, body = await c.request("POST", f"/api/v1/keys/{made['key_id']}/revoke")
        assert status == 200 and body["revoked_at"] is not None, body
        return {"Authorization": f"Bearer {made['key']}"}
    if caller == "expired":
        made = await create_key(c, "admin", expires_in_s=0.05)
        await wait_for(lambda: c.runtime.clock() >= made["expires_at"], timeout=5, what="key to expire")
        return {"Authorization": f"Bearer {made['key']}"}
    raise AssertionError(caller)


@dataclass
class Call:
    path: str
    json: Any = None
    ctx: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Route:
    method: str
    template: str
    allowed: frozenset[str] | None  # None: public
    ok: int
    setup: Callable[[Cluster], Awaitable[Call]]
    took_effect: Callable[[Cluster, Call], bool] | None = None
    check_body: Callable[[Cluster, Call, Any], None] | None = None


def fixed(path: str) -> Callable[[Cluster], Awaitable[Call]]:
    async def setup(c: Cluster) -> Call:
        return Call(path)

    return setup


async def setup_create_key(c: Cluster) -> Call:
    name = f"made-{uuid.uuid4().hex[:8]}"
    return Call("/api/v1/keys", json={"role": "viewer", "name": name}, ctx={"name": name})


async def setup_revoke(c: Cluster, suffix: str) -> Call:
    victim = await create_key(c, "viewer")
    return Call(f"/api/v1/keys/{victim['key_id']}{suffix}", ctx={"key_id": victim["key_id"]})


async def setup_submit(c: Cluster) -> Call:
    tid = f"t-{uuid.uuid4().hex[:8]}"
    return Call(
        "/api/v1/tasks", json={"task_id": tid, "type": "custom", "config": {"name": "noop"}}, ctx={"task_id": tid}
    )


async def setup_existing_task(c: Cluster, suffix: str = "") -> Call:
    tid = await submit(c)
    return Call(f"/api/v1/tasks/{tid}{suffix}", ctx={"task_id": tid})


BLOB = b"print('shipped')\n"
BLOB_DIGEST = hashlib.sha256(BLOB).hexdigest()


async def setup_stored(c: Cluster, kind: str, owner: str = "uploader") -> Call:
    """A blob, or a manifest listing it, already stored and held by key id ``owner`` (read routes)."""
    await c.runtime.blobs.put(BLOB_DIGEST, BLOB, c.runtime.clock(), owner)
    if kind == "blobs":
        return Call(f"/api/v1/blobs/{BLOB_DIGEST}")
    data = mf.encode(mf.Manifest([mf.FileEntry("main.py", BLOB_DIGEST, len(BLOB))]))
    await c.runtime.blobs.put(hashlib.sha256(data).hexdigest(), data, c.runtime.clock(), owner, bundle=True)
    return Call(f"/api/v1/bundles/{hashlib.sha256(data).hexdigest()}")


def key_revoked(c: Cluster, call: Call) -> bool:
    return c.runtime.keys[call.ctx["key_id"]].revoked_at is not None


def check_schema(c: Cluster, call: Call, body: Any) -> None:
    assert body == task_json_schema()


def check_task(c: Cluster, call: Call, body: Any) -> None:
    assert body["task_id"] == call.ctx["task_id"]


def check_token(c: Cluster, call: Call, body: Any) -> None:
    assert isinstance(body["token"], str) and body["expires_at"] > c.runtime.clock()


def check_health(c: Cluster, call: Call, body: Any) -> None:
    assert body["status"] == "ok"


def check_no_hashes(c: Cluster, call: Call, body: Any) -> None:
    assert body["keys"] and all("hash" not in k for k in body["keys"])


def check_cancelled(c: Cluster, call: Call, body: Any) -> None:
    assert body["task_id"] == call.ctx["task_id"] and body["state"] == "cancelled"


def task_cancelled(c: Cluster, call: Call) -> bool:
    return c.runtime.state.tasks[call.ctx["task_id"]].state == "cancelled"


async def setup_drain(c: Cluster) -> Call:
    agent = await c.add_worker()  # a real worker: an allowed call drains it and it leaves
    wid = agent.config.worker_id
    return Call(f"/api/v1/workers/{wid}/drain", json={"deadline_s": 5, "reason": "matrix"}, ctx={"worker_id": wid})


def worker_draining(c: Cluster, call: Call) -> bool:
    w = c.runtime.state.workers[call.ctx["worker_id"]]
    return w.health == "draining" and not w.view.accepting


async def setup_release(c: Cluster) -> Call:
    wid = f"gone-{uuid.uuid4().hex[:8]}"  # registered with its own key, then disconnected
    async with raw_worker(c.base_url, await c.create_key("worker"), wid):
        pass
    await wait_for(lambda: not c.runtime.state.workers[wid].connected, what=f"{wid} to disconnect")
    return Call(f"/api/v1/workers/{wid}/release", ctx={"worker_id": wid})


def worker_released(c: Cluster, call: Call) -> bool:
    return c.runtime.state.workers[call.ctx["worker_id"]].key_id == ""


async def setup_run(c: Cluster, suffix: str = "", key: str | None = None) -> Call:
    """A run (made with ``key``, else the admin key) holding one task that stays pending (no workers)."""
    status, run = await c.request("POST", "/api/v1/runs", json={"name": "matrix"}, key=key)
    assert status == 201, run
    tid = f"t-{uuid.uuid4().hex[:8]}"
    await c.submit({"task_id": tid, "run_id": run["run_id"], "type": "custom", "config": {"name": "noop"}}, key=key)
    return Call(f"/api/v1/runs/{run['run_id']}{suffix}", json={} if suffix else None,
                ctx={"task_id": tid, "run_id": run["run_id"]})


def run_task_cancelled(c: Cluster, call: Call) -> bool:
    return c.runtime.state.tasks[call.ctx["task_id"]].state == "cancelled"


def run_rerun(c: Cluster, call: Call) -> bool:
    return any(tid.startswith(call.ctx["task_id"] + "@") for tid in c.runtime.state.tasks)


CASES = [
    Route("GET", "/healthz", None, 200, fixed("/healthz"), check_body=check_health),
    Route("GET", "/api/v1/health", None, 200, fixed("/api/v1/health"),
          check_body=lambda c, call, body: body["role"] == "single" and body["leader"] == c.base_url),
    Route("GET", "/api/v1/cluster", frozenset(ROLES), 200, fixed("/api/v1/cluster"),
          check_body=lambda c, call, body: [mm["url"] for mm in body["members"]] == [c.base_url] == [body["leader"]]),
    Route("POST", "/api/v1/auth/token", frozenset(ROLES), 200, fixed("/api/v1/auth/token"), check_body=check_token),
    Route(
        "POST",
        "/api/v1/keys",
        frozenset({"admin"}),
        201,
        setup_create_key,
        took_effect=lambda c, call: any(k.name == call.ctx["name"] for k in c.runtime.keys.values()),
    ),
    Route("GET", "/api/v1/keys", frozenset({"admin"}), 200, fixed("/api/v1/keys"), check_body=check_no_hashes),
    Route(
        "POST",
        "/api/v1/keys/{key_id}/revoke",
        frozenset({"admin"}),
        200,
        lambda c: setup_revoke(c, "/revoke"),
        took_effect=key_revoked,
    ),
    Route(
        "DELETE",
        "/api/v1/keys/{key_id}",
        frozenset({"admin"}),
        200,
        lambda c: setup_revoke(c, ""),
        took_effect=key_revoked,
    ),
    Route(
        "POST",
        "/api/v1/tasks",
        SUBMITTERS,
        201,
        setup_submit,
        took_effect=lambda c, call: call.ctx["task_id"] in c.runtime.state.tasks,
    ),
    Route("GET", "/api/v1/tasks", READERS, 200, fixed("/api/v1/tasks")),
    Route("GET", "/api/v1/tasks/{task_id}", READERS, 200, setup_existing_task, check_body=check_task),
    Route("GET", "/api/v1/tasks/{task_id}/logs", READERS, 200, lambda c: setup_existing_task(c, "/logs"),
          check_body=lambda c, call, body: body["task_id"] == call.ctx["task_id"] and body["text"] == ""),
    Route("GET", "/api/v1/tasks/{task_id}/reports", READERS, 200, lambda c: setup_existing_task(c, "/reports"),
          check_body=lambda c, call, body: body["task_id"] == call.ctx["task_id"] and body["tests"] == []),
    Route(
        "POST",
        "/api/v1/tasks/{task_id}/cancel",
        SUBMITTERS,
        200,
        lambda c: setup_existing_task(c, "/cancel"),
        took_effect=task_cancelled,
        check_body=check_cancelled,
    ),
    Route("POST", "/api/v1/runs", SUBMITTERS, 201, lambda c: fixed("/api/v1/runs")(c),
          check_body=lambda c, call, body: body["run_id"].startswith("run-")),
    Route("GET", "/api/v1/runs", READERS, 200, fixed("/api/v1/runs")),
    Route("GET", "/api/v1/runs/{run_id}", READERS, 200, setup_run,
          check_body=lambda c, call, body: [t["task_id"] for t in body["tasks"]] == [call.ctx["task_id"]]),
    Route("POST", "/api/v1/runs/{run_id}/cancel", SUBMITTERS, 200, lambda c: setup_run(c, "/cancel"),
          took_effect=run_task_cancelled),
    Route("POST", "/api/v1/runs/{run_id}/rerun", SUBMITTERS, 201, lambda c: setup_run(c, "/rerun"),
          took_effect=run_rerun),
    Route("GET", "/api/v1/overview", READERS, 200, fixed("/api/v1/overview")),
    Route("GET", "/api/v1/events", READERS, 200, fixed("/api/v1/events")),
    Route("GET", "/api/v1/workers", READERS, 200, fixed("/api/v1/workers")),
    Route(
        "POST",
        "/api/v1/workers/{worker_id}/drain",
        frozenset({"admin"}),
        202,
        setup_drain,
        took_effect=worker_draining,
    ),
    Route(
        "POST",
        "/api/v1/workers/{worker_id}/release",
        frozenset({"admin"}),
        200,
        setup_release,
        took_effect=worker_released,
    ),
    Route("GET", "/api/v1/results", READERS, 200, fixed("/api/v1/results")),
    Route("GET", "/api/v1/schema/task", frozenset(ROLES), 200, fixed("/api/v1/schema/task"), check_body=check_schema),
    Route("GET", "/api/v1/openapi.json", frozenset(ROLES), 200, fixed("/api/v1/openapi.json"),
          check_body=lambda c, call, body: body["openapi"].startswith("3.1")),
    Route("GET", "/metrics", READERS, 200, fixed("/metrics"),
          check_body=lambda c, call, body: "dt_tasks_submitted_total" in body),
    # Uploading needs a key created with --allow-code, which none of these callers has (the admin
    # key included); tests/integration/bundles/test_bundle_api.py uses one.
    Route("POST", "/api/v1/blobs/missing", frozenset(), 200, fixed("/api/v1/blobs/missing")),
    Route("PUT", "/api/v1/blobs/{digest}", frozenset(), 201, fixed(f"/api/v1/blobs/{BLOB_DIGEST}")),
    Route("POST", "/api/v1/blobs", frozenset(), 200, fixed("/api/v1/blobs")),
    Route("PUT", "/api/v1/bundles/{digest}", frozenset(), 201, fixed(f"/api/v1/bundles/{BLOB_DIGEST}")),
    Route("GET", "/api/v1/blobs/{digest}", frozenset({"admin", "submitter", "worker"}), 200,
          lambda c: setup_stored(c, "blobs"), check_body=lambda c, call, body: body == BLOB.decode()),
    Route("GET", "/api/v1/bundles/{digest}", frozenset({"admin", "submitter", "worker"}), 200,
          lambda c: setup_stored(c, "bundles")),
]

def expected_status(r: Route, caller: str) -> int:
    if r.allowed is None:
        return r.ok
    if caller in BAD_CALLERS:
        return 401
    return r.ok if caller in r.allowed else 403


def matrix() -> list[Any]:
    params = []
    for r in CASES:
        for caller in CALLERS:
            params.append(
                pytest.param(
                    r,
                    caller,
                    id=f"{r.method} {r.template} as {caller}",
                    marks=[],
                )
            )
    return params


async def test_every_route_in_the_table_is_covered() -> None:
    assert {(method, path) for method, path, _, _ in ROUTES} == {(r.method, r.template) for r in CASES}
    assert len(CASES) == len(ROUTES)


@pytest.mark.parametrize(("route", "caller"), matrix())
async def test_route_access(cluster: Cluster, route: Route, caller: str) -> None:
    headers = await headers_for(cluster, caller)
    call = await route.setup(cluster)
    if route.template.startswith("/api/v1/runs/{run_id}/") and caller == "submitter":
        # a submitter may cancel or re-run only its own runs (an admin any): made with the caller's key
        call = await setup_run(cluster, route.template.removeprefix("/api/v1/runs/{run_id}"),
                               headers["Authorization"].split()[1])
    if route.template == "/api/v1/tasks/{task_id}/cancel" and caller == "submitter":
        # a submitter may cancel only its own tasks (an admin any): submit this one as the caller
        tid = f"t-{uuid.uuid4().hex[:8]}"
        await cluster.submit({"task_id": tid, "type": "custom", "config": {"name": "noop"}},
                             key=headers["Authorization"].split()[1])
        call = Call(f"/api/v1/tasks/{tid}/cancel", ctx={"task_id": tid})
    want = expected_status(route, caller)
    if route.method == "GET" and route.template.startswith(("/api/v1/blobs/", "/api/v1/bundles/")):
        # a submitter reads what its own key uploaded; a worker only what a task it runs names, which
        # tests/integration/bundles/test_bundle_access.py shows: this one runs none (404, as for no blob)
        if caller == "submitter":
            call = await setup_stored(cluster, route.template.split("/")[3], headers["Authorization"].split("_")[1])
        want = 404 if caller == "worker" else want
    async with cluster.http.request(
        route.method, cluster.base_url + call.path, json=call.json, headers=headers
    ) as resp:
        body = await resp.json() if resp.content_type == "application/json" else (
            "" if resp.content_type == "text/event-stream" else await resp.text())  # a stream never ends
        assert resp.status == want, (resp.status, body)
        if want == 401:
            assert resp.headers.get("WWW-Authenticate") == "Bearer"
            assert body["error"] == "AuthError"
            assert cluster.admin_key not in str(body)  # never echoes the credential
        elif want == 403:
            assert body["error"] == "PermissionDenied"
            assert caller in body["message"]
    if route.took_effect is not None:
        if want == route.ok:
            assert route.took_effect(cluster, call), "an allowed call had no effect"
        else:
            assert not route.took_effect(cluster, call), "a denied call changed state"
    if want == route.ok and route.check_body is not None:
        route.check_body(cluster, call, body)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/v1/tasks/no-such-task"),
        ("POST", "/api/v1/keys/nokey123/revoke"),
        ("DELETE", "/api/v1/keys/nokey123"),
        pytest.param("POST", "/api/v1/tasks/no-such-task/cancel"),
        ("POST", "/api/v1/workers/no-such-worker/drain"),
        ("POST", "/api/v1/workers/no-such-worker/release"),
        ("GET", "/api/v1/runs/run-000000000000"),
        ("POST", "/api/v1/runs/run-000000000000/cancel"),
        ("POST", "/api/v1/runs/run-000000000000/rerun"),
    ],
)
async def test_unknown_ids_are_404_for_allowed_callers(cluster: Cluster, method: str, path: str) -> None:
    async with cluster.http.request(
        method, cluster.base_url + path, headers={"Authorization": f"Bearer {cluster.admin_key}"}
    ) as resp:
        assert resp.status == 404, await resp.text()
        assert (await resp.json())["error"] == "NotFound"


@pytest.mark.parametrize("path", ["/api/v1/tasks/no-such-task", "/api/v1/keys/nokey123/revoke"])
async def test_unknown_ids_do_not_leak_to_unauthorised_callers(cluster: Cluster, path: str) -> None:
    method = "POST" if path.endswith("revoke") else "GET"
    status, _ = await cluster.request(method, path, key="")
    assert status == 401
    status, _ = await cluster.request(method, path, key=await cluster.create_key("worker"))
    assert status == 403


# ------------------------------------------------------------------ worker WebSocket


def ws_url(c: Cluster) -> str:
    return c.base_url.replace("http://", "ws://") + "/ws/worker"


@pytest.mark.parametrize(
    ("caller", "status"),
    [
        ("admin", 403),
        ("submitter", 403),
        ("viewer", 403),
        ("no-credentials", 401),
        ("garbage", 401),
        ("unknown-key", 401),
        ("forged-secret", 401),
        ("malformed-header", 401),
        ("revoked", 401),
        ("expired", 401),
    ],
)
async def test_worker_websocket_refuses_non_worker_credentials_at_handshake(
    cluster: Cluster, caller: str, status: int
) -> None:
    headers = await headers_for(cluster, caller)
    with pytest.raises(aiohttp.WSServerHandshakeError) as info:
        async with cluster.http.ws_connect(ws_url(cluster), headers=headers):
            pass
    assert info.value.status == status
    assert cluster.runtime.sessions == {}


async def test_worker_websocket_refuses_revoked_worker_key(cluster: Cluster) -> None:
    made = await create_key(cluster, "worker")
    status, _ = await cluster.request("DELETE", f"/api/v1/keys/{made['key_id']}")
    assert status == 200
    with pytest.raises(aiohttp.WSServerHandshakeError) as info:
        async with cluster.http.ws_connect(ws_url(cluster), headers={"Authorization": f"Bearer {made['key']}"}):
            pass
    assert info.value.status == 401


@contextlib.asynccontextmanager
async def registered_worker(c: Cluster, credential: str, worker_id: str = "probe") -> AsyncIterator[Any]:
    """A hand-driven worker session: handshake with ``credential``, signed register, registered reply."""
    session_ids: list[str] = []

    async def on_end(_s: Any, _ctx: Any, params: aiohttp.TraceRequestEndParams) -> None:
        session_ids.append(params.response.headers.get("X-DT-Session", ""))

    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(on_end)
    async with (
        aiohttp.ClientSession(trace_configs=[trace]) as http,
        http.ws_connect(ws_url(c), headers={"Authorization": f"Bearer {credential}"}) as ws,
    ):
        assert session_ids and session_ids[0], "no session id header at the handshake"
        ch = Channel(derive_session_key(credential, session_ids[0]))
        reg = m.Register(
            worker_id=worker_id,
            name=worker_id,
            protocol_version=m.PROTOCOL_VERSION,
            hardware={},
            capabilities=["cpu"],
            tags=[],
            max_concurrent=1,
        )
        await ws.send_bytes(ch.seal(reg, c.runtime.clock()))
        msg = await ws.receive(timeout=10)
        assert msg.type == aiohttp.WSMsgType.BINARY, msg
        reply = ch.open(msg.data, c.runtime.clock())
        assert isinstance(reply, m.Registered) and reply.worker_id == worker_id
        assert reply.session_id == session_ids[0]
        await wait_for(lambda: worker_id in c.runtime.sessions, timeout=5, what="worker session")
        yield ws


async def test_worker_websocket_accepts_worker_key_and_registers(cluster: Cluster) -> None:
    async with registered_worker(cluster, await cluster.create_key("worker")):
        status, body = await cluster.request("GET", "/api/v1/workers")
        assert status == 200
        assert [(w["worker_id"], w["state"]) for w in body["workers"]] == [("probe", "ready")]


async def test_worker_websocket_accepts_a_worker_token(cluster: Cluster) -> None:
    _, tok = await cluster.request("POST", "/api/v1/auth/token", key=await cluster.create_key("worker"))
    async with registered_worker(cluster, tok["token"]):
        pass


async def test_worker_websocket_refuses_a_submitter_token(cluster: Cluster) -> None:
    _, tok = await cluster.request("POST", "/api/v1/auth/token", key=await cluster.create_key("submitter"))
    with pytest.raises(aiohttp.WSServerHandshakeError) as info:
        async with cluster.http.ws_connect(ws_url(cluster), headers={"Authorization": f"Bearer {tok['token']}"}):
            pass
    assert info.value.status == 403


async def test_revoking_a_worker_key_closes_its_live_session(cluster: Cluster) -> None:
    made = await create_key(cluster, "worker")
    async with registered_worker(cluster, made["key"]) as ws:
        status, _ = await cluster.request("POST", f"/api/v1/keys/{made['key_id']}/revoke")
        assert status == 200
        msg = await ws.receive(timeout=10)
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED), msg
        await wait_for(lambda: "probe" not in cluster.runtime.sessions, timeout=5, what="session to end")
