"""Task submission, JWT and schema behaviour of the REST API, over real sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import pytest_asyncio

from distributed_testing.tasks.spec import task_json_schema
from distributed_testing.testing import Cluster, run_cluster

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]

NOOP = {"task_id": "noop-1", "type": "custom", "config": {"name": "noop"}, "priority": 1}
GUIDE_BENCHMARK = {
    "task_id": "benchmark-bert-001",
    "type": "benchmark",
    "config": {"model": "bert-base-uncased", "batch_sizes": [1, 2, 4, 8, 16], "precision": "fp32", "iterations": 10},
}


@pytest_asyncio.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async with run_cluster(tmp_path, workers=0) as c:
        yield c


async def post_raw(c: Cluster, path: str, data: bytes, key: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key or c.admin_key}", "Content-Type": "application/json"}
    async with c.http.post(c.base_url + path, data=data, headers=headers) as r:
        return r.status, await r.json(content_type=None)


async def task_count(c: Cluster) -> int:
    status, body = await c.request("GET", "/api/v1/tasks")
    assert status == 200
    return int(body["total"])


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize("data", [b'{"type": "custom", ', b"not json", b"\xff\xfe{}", b'{"a": 1}}'])
async def test_invalid_json_is_400_naming_the_body(cluster: Cluster, data: bytes) -> None:
    status, body = await post_raw(cluster, "/api/v1/tasks", data)
    assert status == 400, body
    assert body["error"] == "ValidationError"
    assert [e["field"] for e in body["errors"]] == ["(body)"]
    assert "JSON" in body["errors"][0]["error"]
    assert await task_count(cluster) == 0


async def test_empty_body_is_400(cluster: Cluster) -> None:
    status, body = await post_raw(cluster, "/api/v1/tasks", b"")
    assert status == 400 and body["errors"][0]["field"] == "(document)"


async def test_three_bad_fields_are_all_listed(cluster: Cluster) -> None:
    doc = {"type": "test", "config": {"test_file": ""}, "priority": 5000, "max_retries": -1}
    status, body = await cluster.request("POST", "/api/v1/tasks", json=doc)
    assert status == 400, body
    assert {e["field"] for e in body["errors"]} == {"config.test_file", "priority", "max_retries"}
    assert all(e["error"] for e in body["errors"])
    assert await task_count(cluster) == 0


async def test_bad_task_in_a_list_rejects_the_whole_submission(cluster: Cluster) -> None:
    doc = [NOOP, {"type": "benchmark", "config": {"model": "m", "batch_sizes": [1, 0]}}, {"type": "nope"}]
    status, body = await cluster.request("POST", "/api/v1/tasks", json=doc)
    assert status == 400, body
    assert {e["field"] for e in body["errors"]} == {"[1].config.batch_sizes[1]", "[2].type"}
    assert await task_count(cluster) == 0  # the valid first task was not accepted either


async def test_guide_examples_are_accepted(cluster: Cluster) -> None:
    doc = [
        GUIDE_BENCHMARK,
        {
            "task_id": "test-bert-001",
            "type": "test",
            "config": {"test_file": "test_bert.py", "test_args": ["--batch-size", "4"]},
        },
        {
            "task_id": "custom-001",
            "type": "custom",
            "config": {
                "name": "setup_environment",
                "parameters": {"clear_cache": True, "prepare_models": ["bert", "vit"]},
            },
        },
    ]
    status, body = await cluster.request("POST", "/api/v1/tasks", json=doc)
    assert status == 201, body
    assert body["tasks"] == [{"task_id": t["task_id"], "created": True, "state": "pending"} for t in doc]
    status, got = await cluster.request("GET", "/api/v1/tasks/benchmark-bert-001")
    assert status == 200 and got["spec"]["config"] == GUIDE_BENCHMARK["config"] and got["type"] == "benchmark"


async def test_missing_task_id_is_assigned(cluster: Cluster) -> None:
    (tid,) = await cluster.submit({"type": "custom", "config": {"name": "noop"}})
    assert tid.startswith("custom-")
    status, body = await cluster.request("GET", f"/api/v1/tasks/{tid}")
    assert status == 200 and body["state"] == "pending"


# ------------------------------------------------------------------ idempotency and conflicts


async def test_same_id_same_body_is_idempotent(cluster: Cluster) -> None:
    status, body = await cluster.request("POST", "/api/v1/tasks", json=NOOP)
    assert status == 201 and body["tasks"][0]["created"] is True
    status, body = await cluster.request("POST", "/api/v1/tasks", json=NOOP)
    assert status == 200, body
    assert body["tasks"] == [{"task_id": "noop-1", "created": False, "state": "pending"}]
    assert await task_count(cluster) == 1


async def test_same_id_different_body_is_409_and_original_untouched(cluster: Cluster) -> None:
    await cluster.submit(NOOP)
    _, before = await cluster.request("GET", "/api/v1/tasks/noop-1")
    status, body = await cluster.request(
        "POST", "/api/v1/tasks", json=[{**NOOP, "task_id": "other-1"}, {**NOOP, "priority": 2}]
    )
    assert status == 409, body
    assert body["error"] == "Conflict" and "noop-1" in body["message"]
    _, after = await cluster.request("GET", "/api/v1/tasks/noop-1")
    assert after == before
    assert after["spec"]["priority"] == 1
    assert await task_count(cluster) == 1  # other-1 was not accepted


# ------------------------------------------------------------------ JWT


async def test_token_from_api_key_works_for_rest_and_carries_the_role(cluster: Cluster) -> None:
    key = await cluster.create_key("submitter")
    status, body = await cluster.request("POST", "/api/v1/auth/token", key=key)
    assert status == 200, body
    token = body["token"]
    assert body["role"] == "submitter" and not token.startswith("dtk_")
    assert (await cluster.request("GET", "/api/v1/tasks", key=token))[0] == 200
    assert (await cluster.submit(NOOP, key=token)) == ["noop-1"]
    assert (await cluster.request("GET", "/api/v1/keys", key=token))[0] == 403
    status, body = await cluster.request("POST", "/api/v1/auth/token", key=token)  # a token can be refreshed
    assert status == 200 and body["role"] == "submitter"


async def test_revoking_the_key_makes_its_token_fail_immediately(cluster: Cluster) -> None:
    status, made = await cluster.request("POST", "/api/v1/keys", json={"role": "submitter"})
    assert status == 201
    _, tok = await cluster.request("POST", "/api/v1/auth/token", key=made["key"])
    token = tok["token"]
    assert (await cluster.request("GET", "/api/v1/tasks", key=token))[0] == 200
    status, _ = await cluster.request("POST", f"/api/v1/keys/{made['key_id']}/revoke")
    assert status == 200
    for cred in (token, made["key"]):
        status, body = await cluster.request("GET", "/api/v1/tasks", key=cred)
        assert status == 401, body
        assert (await cluster.request("POST", "/api/v1/auth/token", key=cred))[0] == 401
    # Other keys are unaffected.
    assert (await cluster.request("GET", "/api/v1/tasks"))[0] == 200


async def test_viewer_token_cannot_submit(cluster: Cluster) -> None:
    key = await cluster.create_key("viewer")
    _, tok = await cluster.request("POST", "/api/v1/auth/token", key=key)
    status, body = await cluster.request("POST", "/api/v1/tasks", json=NOOP, key=tok["token"])
    assert status == 403 and "tasks:submit" in body["message"]


async def test_tampered_token_is_401(cluster: Cluster) -> None:
    _, tok = await cluster.request("POST", "/api/v1/auth/token")
    head, payload, sig = tok["token"].split(".")
    forged = ".".join([head, payload, ("A" if sig[0] != "A" else "B") + sig[1:]])
    assert (await cluster.request("GET", "/api/v1/tasks", key=forged))[0] == 401


# ------------------------------------------------------------------ pending reason and schema


async def test_task_nobody_can_run_shows_pending_reason(cluster: Cluster) -> None:
    await cluster.submit({**NOOP, "task_id": "gpu-1", "requirements": {"hardware": ["cuda"]}})
    status, body = await cluster.request("GET", "/api/v1/tasks/gpu-1")
    assert status == 200
    assert body["state"] == "pending" and body["pending_reason"] == "no worker is connected"
    status, listing = await cluster.request("GET", "/api/v1/tasks", params={"state": "pending"})
    assert [t["pending_reason"] for t in listing["tasks"]] == ["no worker is connected"]


async def test_pending_reason_names_what_the_connected_worker_lacks(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=1) as c:
        await c.submit({**NOOP, "task_id": "gpu-1", "requirements": {"hardware": ["cuda"], "tags": ["llm"]}})
        status, body = await c.request("GET", "/api/v1/tasks/gpu-1")
        assert status == 200 and body["state"] == "pending"
        assert (
            body["pending_reason"] == "no connected worker satisfies the requirements (w0 lacks hardware cuda, tag llm)"
        )


async def test_schema_endpoint_returns_the_published_schema(cluster: Cluster) -> None:
    key = await cluster.create_key("worker")
    status, body = await cluster.request("GET", "/api/v1/schema/task", key=key)
    assert status == 200
    assert body == task_json_schema()
    jsonschema.Draft202012Validator.check_schema(body)
    validator = jsonschema.Draft202012Validator(body)
    assert validator.is_valid(GUIDE_BENCHMARK) and validator.is_valid([GUIDE_BENCHMARK, NOOP])
    assert not validator.is_valid({**NOOP, "priority": 5000})


async def test_submitter_cannot_cancel_another_submitters_task(cluster: Cluster) -> None:
    alice, bob = await cluster.create_key("submitter", name="alice"), await cluster.create_key("submitter", name="bob")
    await cluster.submit(NOOP, key=alice)
    async with cluster.http.post(
        cluster.base_url + "/api/v1/tasks/noop-1/cancel", headers={"Authorization": f"Bearer {bob}"}
    ) as resp:
        assert resp.status == 403, await resp.text()
    assert cluster.runtime.state.tasks["noop-1"].state == "pending"


async def test_workers_are_listed_a_page_at_a_time_in_id_order(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=3) as c:
        status, body = await c.request("GET", "/api/v1/workers")
        assert status == 200 and body["total"] == 3
        ids = [w["worker_id"] for w in body["workers"]]
        assert ids == sorted(ids)
        status, body = await c.request("GET", "/api/v1/workers", params={"limit": "1", "offset": "1"})
        assert status == 200 and [w["worker_id"] for w in body["workers"]] == ids[1:2] and body["total"] == 3
        for params, field in (({"limit": "0"}, "limit"), ({"offset": "-1"}, "offset"), ({"limit": "x"}, "limit"),
                              ({"state": "asleep"}, "state")):
            status, body = await c.request("GET", "/api/v1/workers", params=params)
            assert status == 400 and body["errors"][0]["field"] == field, body
