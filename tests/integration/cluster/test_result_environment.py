"""Test and custom results carry the same environment fingerprint as benchmark results (collected
once per worker by the environment probe; a benchmark result of the same worker with torch's
default threads has the same ``fingerprint_hash``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from distributed_testing.bench.env import collect_environment
from distributed_testing.testing import run_cluster

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]


async def test_test_and_custom_results_carry_the_benchmark_fingerprint(tmp_path: Path) -> None:
    (tmp_path / "test_env_probe.py").write_text("def test_ok():\n    assert True\n")
    async with run_cluster(tmp_path, workers=1, batch_wait_s=0.0, worker_overrides={"probe_environment": True}) as c:
        # a result never waits over a second for its fingerprint; on a loaded machine the probe's
        # torch import can take longer, so the test lets it finish first
        await next(iter(c.agents[0].executors.values())).probe.get()
        ids = await c.submit([
            {"task_id": "t", "type": "test", "config": {"test_file": "test_env_probe.py"}},
            {"task_id": "c", "type": "custom", "config": {"name": "noop"}},
        ])
        done = {i: await c.wait(i, timeout=100) for i in ids}
        assert all(t["state"] == "succeeded" for t in done.values()), {i: t["outcome"] for i, t in done.items()}
        env = {i: t["result"]["output"]["environment"] for i, t in done.items()}
    assert env["t"] == env["c"]  # one probe per worker
    here = collect_environment()  # what a benchmark result on this machine's CPU carries
    assert set(env["t"]) == set(here)
    for field in ("torch_version", "python_version", "cpu_model", "device_type"):
        assert env["t"][field] == here[field]
