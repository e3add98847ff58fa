"""``POST /api/v1/runs`` with a client-chosen ``run_id`` is safe to send again (dt and the plugin
send it so: a lost answer during a failover, or through a load balancer, is asked again): the same
key, name and labels get the run they made, 200 and no second run; another key, name or labels
409; a malformed id 400."""

from __future__ import annotations

from pathlib import Path

import pytest

from distributed_testing.testing import run_cluster

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
RID = "run-0123456789ab"


async def test_a_run_created_with_its_id_may_be_created_again(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        key = await c.create_key("submitter")
        body = {"run_id": RID, "name": "ci #3", "labels": {"sha": "abc"}}
        status, first = await c.request("POST", "/api/v1/runs", json=body, key=key)
        assert status == 201 and first["run_id"] == RID, first
        status, again = await c.request("POST", "/api/v1/runs", json=body, key=key)
        assert (status, again) == (200, first)
        status, listed = await c.request("GET", "/api/v1/runs", key=key)
        assert [r["run_id"] for r in listed["runs"]] == [RID]  # one run, not two
        for other, who in (({**body, "name": "ci #4"}, key), ({**body, "labels": {}}, key),
                           (body, await c.create_key("submitter"))):
            status, answer = await c.request("POST", "/api/v1/runs", json=other, key=who)
            assert status == 409 and "already exists" in str(answer), answer
        for bad in ("run-XYZ", "0123456789ab", 7):
            status, answer = await c.request("POST", "/api/v1/runs", json={"run_id": bad}, key=key)
            assert status == 400 and "run_id" in str(answer), answer
