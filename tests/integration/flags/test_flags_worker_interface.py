"""``dt-worker --interface NAME`` (and DT_INTERFACE): the address a worker reports for multi-node
rendezvous, and the NIC its training nodes bind (pre-flight, gloo/NCCL); a missing NIC stops the
worker at start with exit 2 and a message naming the flag or variable."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import psutil
import pytest
from flags_support import StartWorker, worker_config

from distributed_testing.cli import worker as worker_cli
from distributed_testing.testing import Cluster, run_cluster

pytestmark = pytest.mark.timeout(60)
MISSING = "dt-no-such0"


def other_nic() -> tuple[str, str]:
    """An up, non-loopback interface with an IPv4 address (skips the test when there is none)."""
    stats = psutil.net_if_stats()
    for name, addresses in psutil.net_if_addrs().items():
        for a in addresses:
            if a.family == socket.AF_INET and not a.address.startswith("127.") and name in stats and stats[name].isup:
                return name, a.address
    pytest.skip("this machine has no non-loopback interface with an IPv4 address")


@pytest.mark.parametrize(("argv", "env", "needle"), [
    (["--interface", MISSING], {}, f"--interface: network interface '{MISSING}' does not exist on this machine (it has: "),
    ([], {"DT_INTERFACE": MISSING}, f"DT_INTERFACE: network interface '{MISSING}' does not exist on this machine"),
])
def test_a_missing_interface_stops_the_worker_at_start(
        clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        argv: list[str], env: dict[str, str], needle: str) -> None:
    for k, v in env.items():
        clean_env.setenv(k, v)
    code = worker_cli.main(["--api-key", "dtk_a_b", *argv])
    assert code == 2
    err = capsys.readouterr().err
    assert f"dt-worker: {needle}" in err and "lo" in err


def test_the_flag_wins_over_the_variable() -> None:
    assert worker_config(["--interface", "lo"], {"DT_INTERFACE": MISSING}).interface == "lo"
    assert worker_config([], {"DT_INTERFACE": "lo"}).interface == "lo"
    assert worker_config([], {}).interface is None


async def registered_address(c: Cluster, worker_id: str) -> str:
    return c.runtime.state.workers[worker_id].address


@pytest.mark.asyncio
async def test_interface_sets_the_rendezvous_address_reported_at_registration(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    nic, nic_address = other_nic()
    async with run_cluster(tmp_path, workers=0) as c:
        key = await c.create_key("worker")
        common = ["--coordinator", c.base_url, "--api-key", key]
        await start_cli_worker(c, [*common, "--worker-id", "plain"])
        await start_cli_worker(c, [*common, "--worker-id", "flagged", "--interface", nic])
        await start_cli_worker(c, [*common, "--worker-id", "by-variable"], env={"DT_INTERFACE": nic})
        # without it: the local address of the connection to the coordinator (loopback here)
        assert await registered_address(c, "plain") == "127.0.0.1"
        assert await registered_address(c, "flagged") == nic_address
        assert await registered_address(c, "by-variable") == nic_address


async def train_on_one_worker(tmp_path: Path, start_cli_worker: StartWorker, flags: list[str], *,
                              nproc_per_node: int) -> dict[str, Any]:
    """A one-node training task on one CLI worker started with ``flags``; returns the succeeded task."""
    async with run_cluster(tmp_path, workers=0) as c:
        argv = ["--coordinator", c.base_url, "--api-key", await c.create_key("worker"),
                "--db-path", str(tmp_path / "w.duckdb"), *flags]
        await start_cli_worker(c, argv)
        [tid] = await c.submit({"type": "training", "timeout_s": 100, "config": {
            "model": "mlp", "nodes": 1, "nproc_per_node": nproc_per_node,
            "batch_size": 4 * nproc_per_node, "steps": 2, "warmup_steps": 0}})
        task = await c.wait(tid, timeout=100)
    assert task["state"] == "succeeded", task["outcome"]
    return task


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_training_nodes_bind_the_interface(tmp_path: Path, start_cli_worker: StartWorker) -> None:
    nic, nic_address = other_nic()
    task = await train_on_one_worker(tmp_path, start_cli_worker, ["--interface", nic], nproc_per_node=2)
    output = task["result"]["output"]
    assert output["local_address"] == nic_address  # the pre-flight bound the NIC's address
    assert output["interface"] == nic  # and gloo/NCCL were pointed at it
    log = Path(output["log_path"])
    assert log.is_relative_to(tmp_path / "w-cache" / "training")  # under the worker's state dir
    assert output["metrics"]["world_size"] == 2


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_without_the_flag_ranks_bind_the_nic_of_the_coordinator_connection(
        tmp_path: Path, start_cli_worker: StartWorker) -> None:
    """No --interface: the NIC holding the connection's local address (loopback here) is bound,
    so gloo never picks another NIC by hostname."""
    task = await train_on_one_worker(tmp_path, start_cli_worker, [], nproc_per_node=1)
    loopback = next(name for name, addrs in psutil.net_if_addrs().items()
                    if any(a.address == "127.0.0.1" for a in addrs))
    assert task["result"]["output"]["interface"] == loopback
