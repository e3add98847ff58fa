"""A two-node training task with a bundle through a real coordinator and real worker agents over
the WebSocket (issue 40): each worker reports the network its shipped code gets
(``Register.task_network``), so the coordinator refuses the task at submit (400 naming
``--task-network``) while every connected worker that runs shipped code has the default
``loopback``, and once one with ``host`` is connected accepts it and keeps it pending, saying that
it waits for a second such worker. (It was placed on two ``loopback`` workers and ended in
``error`` there: "needs its ranks to reach each other".) Nothing trains here."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from distributed_testing.bundles.upload import upload
from distributed_testing.testing import run_cluster
from distributed_testing.worker.sandbox import available

# accept-bundles workers probe bwrap at start (a child process)
pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(90), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

SHIPPED = {"accept_bundles": True, "sandbox": "bwrap"}  # --task-network left at its default, loopback


async def test_a_shipped_gang_is_refused_on_loopback_workers_and_waits_for_host_ones(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "shipped_model.py").write_text("def factory():\n    raise RuntimeError('never run here')\n")
    async with run_cluster(tmp_path / "c", workers=2, worker_overrides=SHIPPED) as c:
        key = await c.create_key("submitter", allow_code=True)
        digest = await asyncio.to_thread(upload, c.base_url, key, bundle)
        doc = {"type": "training", "bundle": digest,
               "config": {"model": "shipped_model:factory", "nodes": 2, "batch_size": 4, "steps": 1}}
        status, body = await c.request("POST", "/api/v1/tasks", key=key, json=doc)
        assert status == 400, body
        [error] = body["errors"]
        assert error["field"] == "config.nodes" and "w0 with --task-network loopback" in error["error"], error
        assert "worker flag --task-network host (or --sandbox none)" in error["error"], error
        await c.add_worker(**SHIPPED, task_network="host")
        [tid] = await c.submit(doc, key=key)
        status, task = await c.request("GET", f"/api/v1/tasks/{tid}")
        assert status == 200 and task["state"] == "pending", task
        assert "needs 2 worker(s)" in task["pending_reason"] and "--task-network host" in task["pending_reason"], task
        assert task["pending_reason"].endswith(", 1 connected"), task
