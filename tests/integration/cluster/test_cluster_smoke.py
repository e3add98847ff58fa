"""A real coordinator and real worker agents over loopback sockets run custom tasks."""

import pytest

from distributed_testing.testing import run_cluster

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


async def test_noop_and_sleep_tasks_complete(tmp_path):
    async with run_cluster(tmp_path, workers=2) as c:
        ids = await c.submit([{"type": "custom", "config": {"name": "noop"}},
                              {"type": "custom", "config": {"name": "sleep", "parameters": {"seconds": 0.2}}}])
        done = [await c.wait(i) for i in ids]
        assert [t["state"] for t in done] == ["succeeded", "succeeded"]
        assert done[1]["result"]["output"] is not None
        assert done[1]["outcome"]["duration_s"] >= 0.2


async def test_submit_with_wait_answers_with_the_outcomes(tmp_path):
    async with run_cluster(tmp_path, workers=1) as c:
        status, body = await c.request("POST", "/api/v1/tasks", params={"wait": "30"},
                                       json=[{"type": "custom", "config": {"name": "noop"}},
                                             {"type": "custom", "config": {"name": "sleep", "parameters": {"seconds": -1}}}])
        assert status == 201, body
        states = [(t["state"], t["outcome"]["status"]) for t in body["tasks"]]
        assert states == [("succeeded", "succeeded"), ("error", "error")]
        assert all(t["created"] for t in body["tasks"])


async def test_submit_wait_that_runs_out_still_accepts_and_a_bad_wait_accepts_nothing(tmp_path):
    async with run_cluster(tmp_path, workers=0) as c:  # nobody to run it
        status, body = await c.request("POST", "/api/v1/tasks", params={"wait": "0.2"},
                                       json={"task_id": "kept", "type": "custom", "config": {"name": "noop"}})
        assert status == 201, body
        assert body["tasks"] == [{"task_id": "kept", "created": True, "state": "pending", "outcome": None}]
        status, body = await c.request("POST", "/api/v1/tasks", params={"wait": "soon"},
                                       json={"task_id": "refused", "type": "custom", "config": {"name": "noop"}})
        assert status == 400 and body["errors"] == [{"field": "wait", "error": "not a number: 'soon'"}]
        status, _ = await c.request("GET", "/api/v1/tasks/refused")
        assert status == 404
        status, body = await c.request("GET", "/api/v1/tasks/kept")
        assert body["state"] == "pending"
