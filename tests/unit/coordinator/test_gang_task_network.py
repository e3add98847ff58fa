"""Shipped training across machines (issue 40): a training task with a bundle runs its ranks in
each worker's sandbox, whose network is the worker's ``--task-network`` (``host`` under
``--sandbox none``), reported at registration (``Register.task_network``). Ranks on several
machines meet only on ``host``, one node's on ``loopback`` too. The pure state machine places such
a task only where its ranks meet, refuses it at submit naming ``--task-network`` when no connected
worker that runs shipped code could, and says in its pending reason what it waits for while such
workers are away. (It was placed on two ``loopback`` workers and ended in ``error`` there.)"""

from __future__ import annotations

from typing import Any

import pytest
from sim_support import Sim, sent

from distributed_testing.coordinator.core.placement import WorkerView, network_refusal, pick_gang, ranks_network
from distributed_testing.coordinator.core.policy import Policy
from distributed_testing.errors import ValidationError
from distributed_testing.protocol import messages as m
from distributed_testing.tasks import spec as specs
from distributed_testing.worker.core.registration import shipped_network

DIGEST = "ab" * 32


def shipped_training(task_id: str, nodes: int = 2) -> specs.TaskSpec:
    return specs.parse_tasks({"task_id": task_id, "type": "training", "bundle": DIGEST,
                              "config": {"model": "mymodel:factory", "nodes": nodes, "batch_size": 64, "steps": 5}})[0]


def register(wid: str, network: Any, *, accept_bundles: bool = True) -> m.Register:
    return m.Register(worker_id=wid, name=wid, protocol_version=m.PROTOCOL_VERSION, hardware={}, capabilities=["cpu"],
                      tags=[], max_concurrent=1, memory_gb=8.0, address=f"10.0.0.{wid[-1]}",
                      accept_bundles=accept_bundles, task_network=network)


def placed_on(cmds: list[Any]) -> list[str]:
    return [wid for wid, _ in sent(cmds, m.AssignTasks)]


def sim(*workers: m.Register) -> Sim:
    s = Sim(Policy(worker_ttl_s=1e9))
    for reg in workers:
        s.register(reg)
    return s


def test_a_gang_with_a_bundle_goes_only_to_workers_whose_ranks_meet_across_machines() -> None:
    s = sim(register("w1", "loopback"), register("w2", "host"), register("w3", "host"), register("w4", "loopback"))
    _, cmds = s.submit(shipped_training("ddp"))
    assert sorted(placed_on(cmds)) == ["w2", "w3"]
    one = sim(register("w1", "none"), register("w2", "loopback"))  # one node meets on its own loopback
    _, cmds = one.submit(shipped_training("solo", nodes=1))
    assert placed_on(cmds) == ["w2"]


@pytest.mark.parametrize(("networks", "nodes", "field"), [
    (("loopback", "loopback"), 2, "config.nodes"),
    (("none", "loopback"), 3, "config.nodes"),
    (("none",), 1, "bundle"),
])
def test_refused_at_submit_naming_the_flag_when_no_connected_worker_could(
        networks: tuple[str, ...], nodes: int, field: str) -> None:
    s = sim(*(register(f"w{i}", n) for i, n in enumerate(networks)), register("w9", "host", accept_bundles=False))
    with pytest.raises(ValidationError) as err:
        s.submit(shipped_training("ddp", nodes))
    [e] = err.value.errors
    assert e["field"] == field and "--task-network" in e["error"] and f"w0 with --task-network {networks[0]}" in e["error"]
    assert "ddp" not in s.state.tasks


def test_it_waits_saying_what_for_while_such_workers_are_away_and_runs_when_they_come() -> None:
    s = sim(register("w8", "host", accept_bundles=False))  # runs no shipped code: not judged at submit
    accepted, cmds = s.submit(shipped_training("ddp"))
    assert accepted[0]["created"] and placed_on(cmds) == []
    reason = s.state.why_pending(s.task("ddp"))
    assert reason is not None and "--task-network host, or --sandbox none" in reason, reason
    assert s.state.unschedulable(s.task("ddp"))  # dt --fail-if-unschedulable stops on it
    assert placed_on(s.register(register("w1", "loopback")) + s.register(register("w2", "host"))) == []
    assert sorted(placed_on(s.register(register("w3", "host")))) == ["w2", "w3"]


def test_a_worker_that_does_not_report_its_network_is_placed_as_before() -> None:
    s = sim(register("w1", None), register("w2", None))
    _, cmds = s.submit(shipped_training("ddp"))
    assert sorted(placed_on(cmds)) == ["w1", "w2"]
    assert network_refusal("host", 2, [WorkerView("w1", frozenset(), frozenset(), 8.0, 1, accept_bundles=True)]) is None


def test_only_shipped_training_needs_a_network() -> None:
    assert ranks_network(True, 2) == "host" and ranks_network(True, 1) == "loopback"
    assert ranks_network(False, 2) == "" and ranks_network(True, 0) == ""
    plain = specs.parse_tasks({"task_id": "own", "type": "training",
                               "config": {"model": "mlp", "nodes": 2, "batch_size": 64, "steps": 5}})[0]
    s = sim(register("w1", "loopback"), register("w2", "none"))
    _, cmds = s.submit(plain)  # the operator's own code keeps the host's network
    assert sorted(placed_on(cmds)) == ["w1", "w2"]
    ws = [WorkerView(f"w{i}", frozenset(), frozenset(), 8.0, 1, accept_bundles=True, task_network="loopback")
          for i in range(2)]
    assert pick_gang(s.task("own").key, 2, ws) is not None


def test_a_worker_reports_the_network_its_shipped_code_gets() -> None:
    assert shipped_network("bwrap", "loopback") == "loopback" and shipped_network("bwrap", "host") == "host"
    assert shipped_network("none", "loopback") == "host"  # unconfined: the host's network
    with pytest.raises(ValueError, match="--task-network 'lan'"):
        shipped_network("bwrap", "lan")
