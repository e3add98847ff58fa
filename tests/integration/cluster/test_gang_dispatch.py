"""Gang dispatch of a multi-node training task over real sockets, with hand-driven signed workers:
what each member is told (rank, attempt, rendezvous), when results are acknowledged, and the one
combined result the API then shows."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from distributed_testing.protocol import messages as m
from distributed_testing.testing import Cluster, next_message, raw_worker, run_cluster, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

TRAINING = {"task_id": "ddp-1", "type": "training",
            "config": {"model": "mlp", "nodes": 2, "batch_size": 32, "steps": 3}}


async def send(ws: aiohttp.ClientWebSocketResponse, msg: m.Message) -> None:
    await ws.send_bytes(ws._dt_channel.seal(msg, time.time()))  # type: ignore[attr-defined]


@contextlib.asynccontextmanager
async def member(c: Cluster, worker_id: str) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    key = await c.create_key("worker")
    async with raw_worker(c.base_url, key, worker_id, autoping=False) as (ws, _registered):
        yield ws


async def task_view(c: Cluster, task_id: str, **params: str) -> dict[str, Any]:
    status, body = await c.request("GET", f"/api/v1/tasks/{task_id}", params=params or None)
    assert status == 200, body
    return dict(body)


def node_result(a: m.TaskAssignment, **output: Any) -> m.Results:
    assert a.gang is not None
    out = {"node_rank": a.gang.node_rank, "nnodes": a.gang.nnodes, "wall_s": 1.5 + a.gang.node_rank,
           "master": f"{a.gang.master_addr}:{a.gang.master_port}", **output}
    return m.Results([m.TaskResult(a.task_id, a.attempt, "succeeded", time.time() - 2, time.time(), output=out)])


async def test_two_members_get_their_ranks_and_one_combined_result(tmp_path: Any) -> None:
    async with run_cluster(tmp_path, workers=0, gang_ports=(29500, 29999)) as c:
        await c.submit(TRAINING)
        assert (await task_view(c, "ddp-1"))["pending_reason"] == "needs 2 worker(s), 0 connected"
        async with member(c, "ga") as ga:
            await wait_for(lambda: "ga" in c.runtime.sessions, what="ga registered")
            assert (await task_view(c, "ddp-1"))["pending_reason"] == "needs 2 worker(s), 1 connected"
            async with member(c, "gb") as gb:
                (a0,) = (await next_message(ga, m.AssignTasks)).tasks
                (a1,) = (await next_message(gb, m.AssignTasks)).tasks
                assert (a0.task_id, a0.attempt) == (a1.task_id, a1.attempt) == ("ddp-1", 1)
                assert a0.config == a1.config == TRAINING["config"]
                assert a0.gang is not None and a1.gang is not None
                assert (a0.gang.node_rank, a1.gang.node_rank) == (0, 1)
                assert a0.gang.members == a1.gang.members == ["ga", "gb"]
                # neither raw worker reported an address: the peer address of its connection is used
                assert a0.gang.master_addr == a1.gang.master_addr == "127.0.0.1"
                assert a0.gang.master_port == a1.gang.master_port and 29500 <= a0.gang.master_port <= 29999
                assert a0.gang.nnodes == 2 and a0.gang.all_cuda is False
                view = await task_view(c, "ddp-1")
                assert view["state"] == "assigned" and view["gang"]["members"] == ["ga", "gb"]

                await send(gb, m.TaskStarted([m.TaskRef("ddp-1", 1)], time.time()))
                await send(gb, node_result(a1))
                task = c.runtime.state.get("ddp-1")
                await wait_for(lambda: "gb" in (task.gang.held if task.gang else {}), what="node 1 result held")
                assert task.state == "running"  # one node is not the task

                metrics = {"kind": "training", "model": "mlp", "precision": "fp32", "global_batch": 32, "nnodes": 2,
                           "global_samples_per_s": 640.0}
                await send(ga, node_result(a0, metrics=metrics))
                for ws in (ga, gb):
                    ack = await next_message(ws, m.ResultAck)
                    assert [(r.task_id, r.attempt) for r in ack.tasks] == [("ddp-1", 1)]
                done = await task_view(c, "ddp-1", wait="10")
                assert done["state"] == "succeeded"
                assert done["outcome"]["members"] == ["ga", "gb"] and done["outcome"]["global_samples_per_s"] == 640.0
                out = done["result"]["output"]
                assert done["result"]["worker_id"] == "ga" and out["metrics"] == metrics
                assert [(n["node_rank"], n["worker_id"], n["address"], n["status"], n["wall_s"]) for n in out["nodes"]] == [
                    (0, "ga", "127.0.0.1", "succeeded", 1.5), (1, "gb", "127.0.0.1", "succeeded", 2.5)]
                assert out["scaling_efficiency"] is None and "nodes=1" in out["scaling_baseline"]
                status, body = await c.request("GET", "/api/v1/results", params={"task_id": "ddp-1", "model": "mlp"})
                assert status == 200 and [r["attempt"] for r in body["results"]] == [1]


async def test_a_failing_member_gets_the_other_cancelled(tmp_path: Any) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        await c.submit({**TRAINING, "task_id": "ddp-2"})
        async with member(c, "ga") as ga, member(c, "gb") as gb:
            (a0,) = (await next_message(ga, m.AssignTasks)).tasks
            await next_message(gb, m.AssignTasks)
            port = a0.gang.master_port if a0.gang else 0
            await send(ga, m.Results([m.TaskResult("ddp-2", 1, "error", time.time(), time.time(),
                                                   error=f"rendezvous port {port} already in use")]))
            cancel = await next_message(gb, m.Cancel)
            assert (cancel.task.task_id, cancel.task.attempt) == ("ddp-2", 1) and "already in use" in cancel.reason
            assert [(r.task_id, r.attempt) for r in (await next_message(ga, m.ResultAck)).tasks] == [("ddp-2", 1)]
            done = await task_view(c, "ddp-2", wait="10")
            assert done["state"] == "error" and "node 0 (ga) error" in done["outcome"]["error"]
            assert done["result"]["status"] == "error" and len(done["result"]["output"]["nodes"]) == 2
