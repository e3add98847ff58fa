"""``GET /metrics``: Prometheus text that moves with real work, behind a key or on its own port."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from distributed_testing.testing import Cluster, run_cluster, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, metric: str, **labels: str) -> float:
    return samples.get((metric, tuple(sorted(labels.items()))), 0.0)


async def scrape(c: Cluster, key: str | None, url: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with c.http.get(url or c.base_url + "/metrics", headers=headers) as r:
        if r.status == 200:
            assert r.content_type == "text/plain"
        return r.status, await r.text()


async def test_metrics_move_with_real_work_and_need_a_reader(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=1, metrics_port=0) as c:
        viewer = await c.create_key("viewer")
        status, text = await scrape(c, viewer)
        assert status == 200, text
        before = parse(text)

        ids = [f"m-{i}" for i in range(3)]
        await c.submit([{"task_id": t, "type": "custom", "config": {"name": "noop"}} for t in ids])
        for t in ids:
            assert (await c.wait(t))["state"] == "succeeded"
        await c.add_worker()
        await wait_for(lambda: all(w.load for w in c.runtime.state.workers.values()), what="a heartbeat from each worker")

        # refused credentials, each counted by reason
        assert (await scrape(c, None))[0] == 401
        assert (await scrape(c, "not.a.jwt"))[0] == 401
        assert (await scrape(c, await c.create_key("worker")))[0] == 403

        status, text = await scrape(c, viewer)
        after = parse(text)
        for name in ("dt_tasks_submitted_total", "dt_tasks_dispatched_total", "dt_results_received_total",
                     "dt_task_submit_to_assign_seconds_count", "dt_task_submit_to_outcome_seconds_count"):
            assert value(after, name) - value(before, name) == 3, name
        assert value(after, "dt_tasks", state="succeeded") - value(before, "dt_tasks", state="succeeded") == 3
        assert value(after, "dt_tasks_in_memory") == len(c.runtime.state.tasks) >= 3  # within the finished cache
        assert value(after, "dt_task_submit_to_outcome_seconds_sum") > value(before, "dt_task_submit_to_outcome_seconds_sum")
        assert value(after, "dt_store_write_seconds_count") > value(before, "dt_store_write_seconds_count")
        assert value(after, "dt_store_write_records_sum") >= value(before, "dt_store_write_records_sum") + 6
        assert value(after, "dt_workers", state="ready") == 2
        assert value(after, "dt_worker_sessions") == 2
        for reason in ("missing", "invalid", "forbidden"):
            assert value(after, "dt_auth_failures_total", reason=reason) == 1, reason
        assert value(after, "dt_auth_failures_total", reason="throttled") == 0
        load = {dict(labels)["worker_id"] for (name, labels) in after if name == "dt_worker_cpu_percent"}
        assert load == {"w0", "w1"}
        w0 = c.runtime.state.workers["w0"].load
        assert value(after, "dt_worker_memory_percent", worker_id="w0", name="w0") == w0["memory_percent"]

        # the open port: the same registry, no credential needed
        assert c.metrics_port is not None
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{c.metrics_port}/metrics") as r:
            assert r.status == 200
            assert value(parse(await r.text()), "dt_tasks_submitted_total") == 3


async def test_metrics_off_takes_the_route_away(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=0, metrics="off") as c:
        status, body = await c.request("GET", "/metrics")
        assert status == 404, body
        _, doc = await c.request("GET", "/api/v1/openapi.json")
        assert "/metrics" not in doc["paths"] and "/api/v1/tasks" in doc["paths"]
