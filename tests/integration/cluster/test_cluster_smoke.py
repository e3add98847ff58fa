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
