"""Gang scheduling of multi-node training tasks in the pure state machine: events in with ``now``,
commands out. Each test plays a scenario and checks what would reach the workers and the store."""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_support import T0, saved, sent
from sim_support import Sim as StateSim

from distributed_testing.coordinator.core.commands import Command, Notify, Save, Send
from distributed_testing.coordinator.core.policy import Policy
from distributed_testing.coordinator.core.rows import ResultRow
from distributed_testing.coordinator.core.state import CoordinatorState
from distributed_testing.protocol import messages as m
from distributed_testing.retry import Backoff
from distributed_testing.tasks import spec as specs
from distributed_testing.tasks.states import ACTIVE

GRACE = 10.0
WAIT = 30.0  # gang_max_wait_s in these tests
POLICY = Policy(worker_grace_s=GRACE, worker_ttl_s=1e9, gang_max_wait_s=WAIT,
                retry_backoff=Backoff(base_s=0.5, factor=2.0, max_s=30.0, jitter=0.0))


def training(task_id: str, nodes: int = 2, *, max_retries: int = 0, priority: int = 0, **cfg: Any) -> specs.TaskSpec:
    config = {"model": "mlp", "nodes": nodes, "batch_size": 64, "steps": 5, **cfg}
    return specs.parse_tasks({"task_id": task_id, "type": "training", "config": config,
                              "max_retries": max_retries, "priority": priority})[0]


def custom(task_id: str, priority: int = 0) -> specs.TaskSpec:
    return specs.parse_tasks({"task_id": task_id, "type": "custom", "config": {"name": "noop"}, "priority": priority})[0]


def register(wid: str, *, slots: int = 1, caps: tuple[str, ...] = ("cpu",), address: str | None = None,
             running: tuple[tuple[str, int], ...] = (), gpus: Any = None) -> m.Register:
    hardware: dict[str, Any] = {"memory_gb": 8.0}
    if gpus is not None:  # as worker/hardware.py reports them
        hardware["devices"] = {"cuda": {"available": True, "count": 1, "uuids": gpus}}
    return m.Register(worker_id=wid, name=wid, protocol_version=m.PROTOCOL_VERSION, hardware=hardware,
                      capabilities=list(caps), tags=[], max_concurrent=slots, memory_gb=8.0,
                      running=[m.TaskRef(t, a) for t, a in running],
                      address=f"10.0.0.{wid[-1]}" if address is None else address)


def metrics(nnodes: int, samples_per_s: float, precision: str = "fp32", model: str = "mlp") -> dict[str, Any]:
    return {"kind": "training", "model": model, "precision": precision, "global_batch": 64, "nnodes": nnodes,
            "global_samples_per_s": samples_per_s, "world_size": nnodes}


def node_result(task_id: str, attempt: int, rank: int, status: str = "succeeded", *, nnodes: int = 2,
                samples_per_s: float = 200.0, precision: str = "fp32", error: str | None = None,
                **output: Any) -> m.Results:
    out: dict[str, Any] = {"node_rank": rank, "nnodes": nnodes, "wall_s": 2.5 + rank, **output}
    if rank == 0 and status == "succeeded":
        out["metrics"] = metrics(nnodes, samples_per_s, precision)
    return m.Results([m.TaskResult(task_id=task_id, attempt=attempt, status=status,  # type: ignore[arg-type]
                                   started_at=T0, finished_at=T0 + 3 + rank, output=out, error=error)])


def assigns(cmds: list[Command]) -> list[tuple[str, m.TaskAssignment]]:
    return [(c.worker_id, a) for c in cmds if isinstance(c, Send) and isinstance(c.msg, m.AssignTasks) for a in c.msg.tasks]


class Sim(StateSim):
    """Checks the gang invariants after every event; ``submit`` returns only the commands."""

    def submit(self, *items: specs.TaskSpec, now: float = T0) -> list[Command]:  # type: ignore[override]
        return super().submit(*items, now=now)[1]

    def check_invariants(self) -> None:
        """No partial reservation ever: a pending gang holds no slot anywhere; an active gang holds
        one on each member that has not reported yet; no worker runs more than its slots."""
        for w in self.state.workers.values():
            assert len(w.view.running) <= w.view.max_concurrent or not w.connected, w
        for t in self.state.tasks.values():
            if t.gang is None:
                continue
            holders = {wid for wid, w in self.state.workers.items() if t.task_id in w.view.running}
            if t.state in ACTIVE:
                assert len(t.gang.members) == t.gang.nodes == len(set(t.gang.members))
                connected = {wid for wid in t.gang.members if self.state.workers[wid].connected}
                assert holders <= set(t.gang.members)
                assert holders >= connected - set(t.gang.held) - set(t.gang.awaiting), (t.task_id, holders)
            else:
                assert not holders and not t.gang.members, (t.task_id, t.state, holders)


@pytest.fixture
def sim() -> Sim:
    return Sim(POLICY)


# ------------------------------------------------------------------ placement


def test_gang_is_reserved_all_or_nothing(sim: Sim) -> None:
    sim.register(register("w1"))
    assert assigns(sim.submit(training("g", nodes=2))) == []
    assert sim.running("w1") == set()  # nothing held while it cannot be placed
    assert sim.state.why_pending(sim.task("g")) == "needs 2 worker(s), 1 connected"
    cmds = sim.register(register("w2"))
    got = assigns(cmds)
    assert [w for w, _ in got] == ["w1", "w2"]
    (_, a0), (_, a1) = got
    assert (a0.task_id, a0.attempt) == (a1.task_id, a1.attempt) == ("g", 1)
    assert a0.gang == m.GangAssignment(node_rank=0, nnodes=2, master_addr="10.0.0.1", master_port=29500,
                                       all_cuda=False, members=["w1", "w2"])
    assert a1.gang is not None and a1.gang.node_rank == 1 and a1.gang.master_addr == "10.0.0.1"
    assert "kind" not in a0.config and a0.type == "training"
    assert sim.running("w1") == sim.running("w2") == {"g"}
    t = sim.task("g")
    assert t.state == "assigned" and t.worker_id == "w1"
    assert t.history[-1]["gang"]["members"] == ["w1", "w2"]
    assert sim.state.gang_view(t)["members"] == ["w1", "w2"]


def test_rank_zero_is_the_worker_with_most_free_slots_then_lowest_id(sim: Sim) -> None:
    for wid, slots in (("w1", 1), ("w3", 2), ("w2", 2)):
        sim.register(register(wid, slots=slots))
    got = assigns(sim.submit(training("g", nodes=2)))
    gang = got[0][1].gang
    assert gang is not None and gang.members == ["w2", "w3"] and gang.master_addr == "10.0.0.2"


def test_each_member_is_a_distinct_worker_even_with_many_slots(sim: Sim) -> None:
    sim.register(register("w1", slots=8))
    assert assigns(sim.submit(training("g", nodes=2))) == []
    assert "needs 2 worker(s), 1 connected" == sim.state.why_pending(sim.task("g"))


def test_nccl_gang_goes_to_cuda_workers_only_and_says_all_cuda(sim: Sim) -> None:
    sim.register(register("w1"))
    sim.register(register("w2", caps=("cpu", "cuda")))
    sim.submit(training("g", nodes=2, backend="nccl"))
    assert sim.state.why_pending(sim.task("g")) == "needs 2 worker(s) matching hardware cuda, 1 connected"
    got = assigns(sim.register(register("w3", caps=("cpu", "cuda"))))
    assert [w for w, _ in got] == ["w2", "w3"] and all(a.gang and a.gang.all_cuda for _, a in got)


CUDA = ("cpu", "cuda")


def test_an_nccl_gang_goes_to_workers_that_do_not_share_a_gpu(sim: Sim) -> None:
    """Two workers on one machine without CUDA_VISIBLE_DEVICES both see its GPU: NCCL would refuse
    the pair ("Duplicate GPU detected"), so a third worker on its own GPU is taken instead."""
    sim.register(register("w1", slots=2, caps=CUDA, gpus=["GPU-aaa"]))
    sim.register(register("w2", slots=2, caps=CUDA, gpus=["GPU-aaa"]))
    sim.register(register("w3", caps=CUDA, gpus=["GPU-bbb"]))
    got = assigns(sim.submit(training("g", nodes=2, backend="nccl")))
    assert [w for w, _ in got] == ["w1", "w3"] and all(a.gang and a.gang.all_cuda for _, a in got)


def test_an_auto_backend_gang_on_workers_sharing_a_gpu_runs_on_gloo_and_says_why(sim: Sim) -> None:
    sim.register(register("w1", caps=CUDA, gpus=["GPU-aaa", "GPU-ccc"]))
    sim.register(register("w2", caps=CUDA, gpus=["GPU-aaa"]))
    got = assigns(sim.submit(training("g", nodes=2)))
    assert [w for w, _ in got] == ["w1", "w2"] and not any(a.gang and a.gang.all_cuda for _, a in got)
    assert sim.task("g").history[-1]["cause"].endswith("; backend gloo: the members share GPU GPU-aaa")


def test_an_explicit_nccl_gang_with_no_way_apart_is_sent_as_asked(sim: Sim) -> None:
    """The worker then fails it naming the shared GPU and the way out (executors/training.py)."""
    sim.register(register("w1", caps=CUDA, gpus=["GPU-aaa"]))
    sim.register(register("w2", caps=CUDA, gpus=["GPU-aaa"]))
    got = assigns(sim.submit(training("g", nodes=2, backend="nccl")))
    assert [w for w, _ in got] == ["w1", "w2"] and all(a.gang and a.gang.all_cuda for _, a in got)


@pytest.mark.parametrize("gpus", [None, [], "GPU-aaa", [1, 2], ["x" * 65], ["GPU-a"] * 300],
                         ids=["absent", "none", "not-a-list", "not-strings", "too-long", "too-many"])
def test_a_gpu_report_that_says_nothing_usable_counts_as_no_gpu_shared(sim: Sim, gpus: Any) -> None:
    sim.register(register("w1", caps=CUDA, gpus=gpus))
    sim.register(register("w2", caps=CUDA, gpus=gpus))
    got = assigns(sim.submit(training("g", nodes=2)))
    assert [w for w, _ in got] == ["w1", "w2"] and all(a.gang and a.gang.all_cuda for _, a in got)


def test_a_one_node_training_task_is_a_gang_of_one(sim: Sim) -> None:
    sim.register(register("w1"))
    ((wid, a),) = assigns(sim.submit(training("g1", nodes=1)))
    assert wid == "w1" and a.gang == m.GangAssignment(0, 1, "10.0.0.1", 29500, False, ["w1"])


def test_training_tasks_are_never_batched(sim: Sim) -> None:
    sim.register(register("w1", slots=4))
    sim.register(register("w2", slots=4))
    cmds = sim.submit(training("a", nodes=1), training("b", nodes=1))
    msgs = sent(cmds, m.AssignTasks)
    assert len(msgs) == 2 and all(msg.batch_id is None and len(msg.tasks) == 1 for _, msg in msgs)


def test_rendezvous_ports_are_unique_per_address_and_rotate(sim: Sim) -> None:
    sim.register(register("w1", slots=2, address="10.0.0.9"))
    sim.register(register("w2", slots=2, address="10.0.0.9"))
    got = assigns(sim.submit(training("a"), training("b")))
    ports = {a.task_id: a.gang.master_port for _, a in got if a.gang}
    assert ports == {"a": 29500, "b": 29501}
    sim.results("w1", node_result("a", 1, 0))
    sim.results("w2", node_result("a", 1, 1))
    got = assigns(sim.submit(training("c")))
    assert {a.gang.master_port for _, a in got if a.gang} == {29502}  # the cursor moves on; 29500 rests


def test_two_gangs_competing_for_three_workers_never_deadlock(sim: Sim) -> None:
    for wid in ("w1", "w2", "w3"):
        sim.register(register(wid))
    cmds = sim.submit(training("a"), training("b"))
    assert {a.task_id for _, a in assigns(cmds)} == {"a"}
    assert sim.running("w3") == set()  # b holds nothing while it waits
    assert "free slot at once; 1 of 3 have one now" in sim.state.why_pending(sim.task("b"))
    cmds = sim.results("w2", node_result("a", 1, 1))  # a node that is done frees its slot at once
    assert {(w, a.task_id, a.gang.node_rank) for w, a in assigns(cmds) if a.gang} == {("w2", "b", 0), ("w3", "b", 1)}
    sim.results("w1", node_result("a", 1, 0))
    assert sim.task("a").state == "succeeded" and sim.task("b").state == "assigned"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=6), st.integers(0, 2**32 - 1))
def test_random_gangs_over_three_workers_all_finish(sizes: list[int], seed: int) -> None:
    """Gangs of 1..3 nodes over 3 one-slot workers, results in random order: every gang is placed
    whole, never partially (checked after every event), and every one finishes."""
    rng = random.Random(seed)
    s = Sim(POLICY)
    for wid in ("w1", "w2", "w3"):
        s.register(register(wid))
    s.submit(*[training(f"g{i}", nodes=n) for i, n in enumerate(sizes)])
    for _ in range(len(sizes) * 4):
        active = [t for t in s.state.tasks.values() if t.state in ACTIVE]
        if not active:
            break
        t = rng.choice(active)
        g = t.gang
        left = [w for w in g.members if w not in g.held]
        wid = rng.choice(left)
        s.results(wid, node_result(t.task_id, t.attempt, g.members.index(wid), nnodes=g.nodes))
    assert all(t.state == "succeeded" for t in s.state.tasks.values())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-1, 1)), min_size=1, max_size=12),
       st.integers(0, 2**32 - 1))
def test_random_mix_of_gangs_and_small_tasks_all_finish(jobs: list[tuple[int, int]], seed: int) -> None:
    """Gangs (1..3 nodes) and single tasks (0) of mixed priority over 3 workers of 1-2 slots,
    submitted over time, finishing in random order with time passing the gang bound: nothing is
    ever partially reserved (checked after every event) and everything finishes."""
    rng = random.Random(seed)
    s = Sim(POLICY)
    for wid, slots in (("w1", 1), ("w2", 2), ("w3", 1)):
        s.register(register(wid, slots=slots))
    now = T0
    todo = [training(f"g{i}", nodes=n, priority=p) if n else custom(f"c{i}", priority=p) for i, (n, p) in enumerate(jobs)]
    for _ in range(len(jobs) * 6):
        now += rng.choice((0.5, WAIT / 2, WAIT))
        if todo and rng.random() < 0.5:
            s.submit(todo.pop(0), now=now)
            continue
        active = [t for t in s.state.tasks.values() if t.state in ACTIVE]
        if not active:
            if todo:
                s.submit(todo.pop(0), now=now)
            continue
        t = rng.choice(active)
        if t.gang is None:
            s.results(t.worker_id, m.Results([m.TaskResult(t.task_id, t.attempt, "succeeded", now, now)]), now=now)
            continue
        wid = rng.choice([w for w in t.gang.members if w not in t.gang.held])
        s.results(wid, node_result(t.task_id, t.attempt, t.gang.members.index(wid), nnodes=t.gang.nodes), now=now)
    if todo:
        s.submit(*todo, now=now)
    while active := [t for t in s.state.tasks.values() if t.state in ACTIVE]:  # finish whatever runs
        t = active[0]
        now += 1
        if t.gang is None:
            s.results(t.worker_id, m.Results([m.TaskResult(t.task_id, t.attempt, "succeeded", now, now)]), now=now)
            continue
        for wid in [w for w in t.gang.members if w not in t.gang.held]:
            s.results(wid, node_result(t.task_id, t.attempt, t.gang.members.index(wid), nnodes=t.gang.nodes), now=now)
    assert all(t.state == "succeeded" for t in s.state.tasks.values()), {t.task_id: t.state for t in s.state.tasks.values()}


# ------------------------------------------------------------ starvation bound


def test_backfill_while_the_gang_waits_then_the_bound_reserves_its_workers(sim: Sim) -> None:
    sim.register(register("w1"))
    sim.register(register("w2"))
    assert [w for w, _ in assigns(sim.submit(custom("x"), now=T0))] == ["w1"]
    sim.submit(training("g"), now=T0)
    assert [a.task_id for _, a in assigns(sim.submit(custom("y"), now=T0 + 1))] == ["y"]  # backfill on w2
    sim.results("w2", m.Results([m.TaskResult("y", 1, "succeeded", T0, T0 + 1)]), now=T0 + 5)
    assert [a.task_id for _, a in assigns(sim.submit(custom("z"), now=T0 + 6))] == ["z"]  # still within the bound
    sim.results("w2", m.Results([m.TaskResult("z", 1, "succeeded", T0, T0 + 1)]), now=T0 + WAIT + 1)
    assert "waited past the 30s gang bound" in sim.state.why_pending(sim.task("g"))
    assert assigns(sim.submit(custom("q"), now=T0 + WAIT + 2)) == []  # w2 is kept for the gang
    assert sim.task("q").state == "pending" and sim.running("w2") == set()
    hi = assigns(sim.submit(custom("urgent", priority=5), now=T0 + WAIT + 3))
    assert [a.task_id for _, a in hi] == ["urgent"]  # higher priority still goes first
    sim.results("w2", m.Results([m.TaskResult("urgent", 1, "succeeded", T0, T0 + 1)]), now=T0 + WAIT + 4)
    cmds = sim.results("w1", m.Results([m.TaskResult("x", 1, "succeeded", T0, T0 + 1)]), now=T0 + WAIT + 5)
    assert {(w, a.task_id) for w, a in assigns(cmds)} == {("w1", "g"), ("w2", "g")}
    assert sim.task("q").state == "pending"  # after the gang, not before it


def test_gang_bound_counts_from_the_gang_submission_also_on_ticks(sim: Sim) -> None:
    sim.register(register("w1"))
    sim.register(register("w2"))
    sim.submit(custom("x"), now=T0)
    sim.submit(training("g"), now=T0)
    sim.tick(T0 + WAIT - 1)
    assert not sim.task("g").gang.protecting
    sim.tick(T0 + WAIT)
    assert sim.task("g").gang.protecting
    assert assigns(sim.submit(custom("y"), now=T0 + WAIT + 1)) == []


def test_an_unplaceable_gang_reserves_nothing_and_blocks_nobody(sim: Sim) -> None:
    sim.register(register("w1"))
    sim.register(register("w2"))
    sim.submit(training("big", nodes=3), now=T0)
    for i in range(3):  # long past the bound, smaller tasks still run
        now = T0 + WAIT * (i + 2)
        got = assigns(sim.submit(custom(f"t{i}"), now=now))
        assert [a.task_id for _, a in got] == [f"t{i}"]
        wid = got[0][0]
        sim.results(wid, m.Results([m.TaskResult(f"t{i}", 1, "succeeded", now, now)]), now=now)
    assert sim.state.why_pending(sim.task("big")) == "needs 3 worker(s), 2 connected"
    assert sim.task("big").state == "pending" and not sim.task("big").gang.protecting


def test_pending_reason_names_constrained_workers(sim: Sim) -> None:
    sim.register(register("w1"))
    sim.register(register("w2"))
    sim.run(sim.state.heartbeat("w2", m.Heartbeat("constrained", [], 99.0, 1.0, 0, "cpu"), T0))
    sim.submit(training("g"))
    assert "2 connected but only 1 accepting work" in sim.state.why_pending(sim.task("g"))


# ------------------------------------------------------------------- results


def test_success_stores_one_combined_row_and_acks_only_after_it(sim: Sim) -> None:
    sim.register(register("w1"))
    sim.register(register("w2"))
    sim.submit(training("g"))
    sim.run(sim.state.started("w2", m.TaskStarted([m.TaskRef("g", 1)], T0), T0))
    assert sim.task("g").state == "running"
    first = sim.results("w2", node_result("g", 1, 1))
    assert first == []  # held: no row, no ack, nothing final
    assert sim.running("w2") == set() and sim.running("w1") == {"g"}
    cmds = sim.results("w1", node_result("g", 1, 0, samples_per_s=300.0))
    (row,) = saved(cmds, ResultRow)
    assert (row.task_id, row.attempt, row.worker_id, row.status) == ("g", 1, "w1", "succeeded")
    assert row.output["global_samples_per_s"] == 300.0 and row.output["metrics"]["nnodes"] == 2
    assert [(n["node_rank"], n["worker_id"], n["address"], n["status"], n["wall_s"]) for n in row.output["nodes"]] == [
        (0, "w1", "10.0.0.1", "succeeded", 2.5), (1, "w2", "10.0.0.2", "succeeded", 3.5)]
    assert row.output["scaling_efficiency"] is None
    assert "run the same task with nodes=1" in row.output["scaling_baseline"]
    acks = sent(cmds, m.ResultAck)
    assert sorted((w, [(r.task_id, r.attempt) for r in a.tasks]) for w, a in acks) == [("w1", [("g", 1)]), ("w2", [("g", 1)])]
    saves_at = max(i for i, c in enumerate(cmds) if isinstance(c, Save))
    assert all(i > saves_at for i, c in enumerate(cmds) if isinstance(c, Send) and isinstance(c.msg, m.ResultAck))
    t = sim.task("g")
    assert t.state == "succeeded" and t.outcome["members"] == ["w1", "w2"]
    assert t.outcome["global_samples_per_s"] == 300.0 and t.outcome["scaling_efficiency"] is None
    assert any(isinstance(c, Notify) for c in cmds)
    assert sim.state.gang_view(t)["members"] == []


def test_scaling_efficiency_against_the_latest_matching_single_node_run(sim: Sim) -> None:
    sim.register(register("w1"))
    sim.register(register("w2"))
    for tid, sps, now in (("one-a", 100.0, T0), ("one-b", 120.0, T0 + 1), ("one-bf16", 50.0, T0 + 2)):
        sim.submit(training(tid, nodes=1, precision="bf16" if "bf16" in tid else "fp32"), now=now)
        wid = sim.task(tid).gang.members[0]
        sim.results(wid, node_result(tid, 1, 0, nnodes=1, samples_per_s=sps,
                                     precision="bf16" if "bf16" in tid else "fp32"), now=now)
    assert sim.task("one-b").outcome["scaling_efficiency"] is None
    assert "is the baseline" in sim.task("one-b").outcome["scaling_baseline"]
    sim.submit(training("two"), now=T0 + 3)
    sim.results("w2", node_result("two", 1, 1), now=T0 + 4)
    (row,) = saved(sim.results("w1", node_result("two", 1, 0, samples_per_s=200.0), now=T0 + 4), ResultRow)
    assert row.output["scaling_efficiency"] == pytest.approx(100.0 / 120.0, abs=1e-6)
    assert row.output["scaling_baseline"] == {"task_id": "one-b", "attempt": 1, "global_samples_per_s": 120.0, "nnodes": 1}
    assert sim.task("two").outcome["scaling_efficiency"] == row.output["scaling_efficiency"]
    # a restarted coordinator finds the same baseline in the task outcomes it reads from the store
    again = CoordinatorState(POLICY)
    again.restore(sim.snapshot(), T0 + 5)
    assert again.gangs.baselines.lookup(metrics(2, 0.0)) is None  # finished tasks are not in the snapshot
    again.note_baselines(sim.rows().values())
    assert again.gangs.baselines.lookup(metrics(2, 0.0))["task_id"] == "one-b"
    assert again.gangs.baselines.lookup(metrics(2, 0.0, precision="bf16"))["task_id"] == "one-bf16"
    assert again.gangs.baselines.lookup(metrics(2, 0.0, model="cnn")) is None


def test_missing_metrics_give_null_efficiency_not_a_crash(sim: Sim) -> None:
    sim.register(register("w1"))
    sim.submit(training("g", nodes=1))
    bad = m.Results([m.TaskResult("g", 1, "succeeded", T0, T0 + 1, output={"metrics": {"model": "mlp"}})])
    (row,) = saved(sim.results("w1", bad), ResultRow)
    assert row.output["scaling_efficiency"] is None and "no training metrics" in row.output["scaling_baseline"]
    assert sim.task("g").state == "succeeded"


# ------------------------------------------------------------------- failure


def test_one_member_failing_cancels_the_others_and_requeues_the_gang(sim: Sim) -> None:
    sim.register(register("w1"))
    sim.register(register("w2"))
    sim.register(register("w3"))
    sim.submit(training("g", max_retries=1))
    cmds = sim.results("w2", node_result("g", 1, 1, "error", error="rank 1 exited with 1"), now=T0 + 1)
    assert sent(cmds, m.Cancel) == [("w1", m.Cancel(m.TaskRef("g", 1), "gang attempt 1 ended: node 1 (w2) error: "
                                                  "rank 1 exited with 1"))]
    assert [w for w, _ in sent(cmds, m.ResultAck)] == ["w2"]
    (row,) = saved(cmds, ResultRow)
    assert (row.attempt, row.status, row.worker_id) == (1, "error", "w2")
    assert [n["status"] for n in row.output["nodes"]] == [None, "error"]
    t = sim.task("g")
    assert t.state == "pending" and t.retries_used == 1 and t.not_before == T0 + 1 + 0.5
    assert sim.running("w1") == sim.running("w2") == set()  # every member's slot is free
    got = assigns(sim.tick(T0 + 2))
    assert {a.attempt for _, a in got} == {2} and len(got) == 2
    assert {a.gang.master_port for _, a in got if a.gang} == {29501}  # another port for the retry
    # the cancelled node of attempt 1 reports late: stored and acknowledged, never the outcome
    late = sim.results("w1", node_result("g", 1, 0, "cancelled"), now=T0 + 3)
    assert [r.attempt for r in saved(late, ResultRow)] == [1] and [w for w, _ in sent(late, m.ResultAck)] == ["w1"]
    assert sim.task("g").state == "assigned" and sim.task("g").attempt == 2


def test_failure_without_retries_ends_the_task(sim: Sim) -> None:
    sim.register(register("w1"))
    sim.register(register("w2"))
    sim.submit(training("g"))
    sim.results("w1", node_result("g", 1, 0))  # node 0 done, held
    cmds = sim.results("w2", node_result("g", 1, 1, "error", error="preflight: w2 cannot reach 10.0.0.1:29500"))
    t = sim.task("g")
    assert t.state == "error" and "cannot reach 10.0.0.1:29500" in t.outcome["error"]
    assert sent(cmds, m.Cancel) == []  # nobody left running
    assert sorted(w for w, _ in sent(cmds, m.ResultAck)) == ["w1", "w2"]  # the held success is acked too


def test_explicitly_non_retryable_error_and_failed_status_end_at_once() -> None:
    for status, extra, final in (("error", {"retryable": False}, "error"), ("failed", {}, "failed")):
        s = Sim(POLICY)
        s.register(register("w1"))
        s.register(register("w2"))
        s.submit(training("g", max_retries=3))
        s.results("w2", node_result("g", 1, 1, status, error="bad", **extra))
        assert s.task("g").state == final and s.task("g").retries_used == 0


def test_a_lost_member_fails_the_attempt_for_everyone(sim: Sim) -> None:
    sim.register(register("w1"))
    sim.register(register("w2"))
    sim.submit(training("g", max_retries=1))
    sim.disconnect("w2", now=T0 + 1)
    assert sim.tick(T0 + 1 + GRACE - 0.1) == []
    cmds = sim.tick(T0 + 1 + GRACE)
    assert [w for w, _ in sent(cmds, m.Cancel)] == ["w1"]
    (row,) = saved(cmds, ResultRow)
    assert row.worker_id == "w2" and "lost" in (row.error or "")
    assert sim.task("g").state == "pending" and sim.task("g").retries_used == 1


def test_a_member_reconnecting_within_grace_keeps_the_gang(sim: Sim) -> None:
    sim.register(register("w1"))
    sim.register(register("w2"))
    sim.submit(training("g"))
    sim.disconnect("w2", now=T0 + 1)
    cmds = sim.register(register("w2", running=(("g", 1),)), now=T0 + 2)
    assert sent(cmds, m.Cancel) == [] and sim.running("w2") == {"g"}
    assert sim.tick(T0 + 100) == [] and sim.task("g").state == "assigned"


def test_cancel_stops_every_member(sim: Sim) -> None:
    sim.register(register("w1"))
    sim.register(register("w2"))
    sim.register(register("w3"))
    sim.submit(training("g", nodes=3))
    sim.results("w3", node_result("g", 1, 2, nnodes=3))
    cmds = sim.run(sim.state.cancel("g", T0 + 1, "cancelled by alice"))
    assert sorted(w for w, _ in sent(cmds, m.Cancel)) == ["w1", "w2"]
    assert [w for w, _ in sent(cmds, m.ResultAck)] == ["w3"]
    assert sim.task("g").state == "cancelled" and all(sim.running(w) == set() for w in ("w1", "w2", "w3"))
    late = sim.results("w1", node_result("g", 1, 0, "cancelled"))
    assert sim.task("g").state == "cancelled" and [w for w, _ in sent(late, m.ResultAck)] == ["w1"]


def test_cancel_of_a_pending_gang(sim: Sim) -> None:
    sim.submit(training("g"))
    sim.run(sim.state.cancel("g", T0 + 1))
    sim.register(register("w1"))
    assert assigns(sim.register(register("w2"))) == [] and sim.task("g").state == "cancelled"


def test_hand_back_by_a_member_requeues_without_using_a_retry(sim: Sim) -> None:
    sim.register(register("w1"))
    sim.register(register("w2"))
    sim.register(register("w3"))
    sim.submit(training("g"))
    cmds = sim.run(sim.state.goodbye("w2", m.Goodbye("draining", [m.TaskRef("g", 1)]), T0 + 1))
    assert [w for w, _ in sent(cmds, m.Cancel)] == ["w1"]
    t = sim.task("g")
    assert t.retries_used == 0 and t.state == "assigned" and t.attempt == 2
    assert t.gang.members == ["w1", "w3"]  # placed again at once, without the draining worker


def test_a_member_that_abandoned_its_provisional_assignment_ends_the_attempt_at_no_retry_cost(sim: Sim) -> None:
    sim.register(register("w1"))
    sim.register(register("w2"))
    sim.submit(training("g", max_retries=0))
    sim.disconnect("w2", T0 + 1)  # its session ended before the assignment's confirm reached it
    back = msgspec.structs.replace(register("w2"), abandoned=[m.TaskRef("g", 1)])
    cmds = sim.register(back, now=T0 + 2)
    assert ("w1", m.Cancel(m.TaskRef("g", 1), "gang attempt 1 ended: node assignment abandoned by w2: its "
                            "session ended before it was confirmed")) in sent(cmds, m.Cancel)
    t = sim.task("g")
    assert t.retries_used == 0 and t.state == "assigned" and t.attempt == 2  # not the 10 s grace, no retry


def test_a_member_whose_result_arrived_before_its_session_ended_keeps_it(sim: Sim) -> None:
    """A worker sends a provisional attempt's result at once and, if its session ends before the
    confirm, still lists the attempt as abandoned; the coordinator holds that result (so it did
    not crash), and the result stands."""
    sim.register(register("w1"))
    sim.register(register("w2"))
    sim.submit(training("g", max_retries=0))
    sim.results("w2", node_result("g", 1, 1))
    sim.disconnect("w2", T0 + 1)
    back = msgspec.structs.replace(register("w2"), abandoned=[m.TaskRef("g", 1)])
    assert sent(sim.register(back, now=T0 + 2), m.Cancel) == []
    sim.results("w1", node_result("g", 1, 0), now=T0 + 3)
    t = sim.task("g")
    assert t.state == "succeeded" and t.attempt == 1


# ------------------------------------------------------------------- restart


def run_gang_then_restart(sim: Sim) -> Sim:
    sim.register(register("w1"))
    sim.register(register("w2"))
    sim.submit(training("g", max_retries=1))
    sim.run(sim.state.started("w1", m.TaskStarted([m.TaskRef("g", 1)], T0), T0))
    again = Sim(POLICY)
    again.state.restore(sim.snapshot(), T0 + 10)
    again.journal = list(sim.journal)
    return again


def test_restart_keeps_a_gang_whose_members_reannounce(sim: Sim) -> None:
    s = run_gang_then_restart(sim)
    assert s.state.gang_view(s.task("g"))["members"] == ["w1", "w2"]
    for wid in ("w1", "w2"):
        assert sent(s.register(register(wid, running=(("g", 1),)), now=T0 + 11), m.Cancel) == []
    assert s.running("w1") == s.running("w2") == {"g"}
    assert s.tick(T0 + 10 + GRACE) == []
    # the restored gang still holds its port: another gang whose rank 0 has the same address gets another
    s.register(register("w3", address="10.0.0.1"), now=T0 + 12)
    s.register(register("w4"), now=T0 + 12)
    s.submit(training("h"), now=T0 + 12)
    assert (s.task("h").gang.master_addr, s.task("h").gang.master_port) == ("10.0.0.1", 29501)
    s.results("w2", node_result("g", 1, 1), now=T0 + 12)
    (row,) = saved(s.results("w1", node_result("g", 1, 0), now=T0 + 12), ResultRow)
    assert row.status == "succeeded" and s.task("g").state == "succeeded"


def test_restart_member_that_does_not_return_fails_the_attempt(sim: Sim) -> None:
    s = run_gang_then_restart(sim)
    s.register(register("w1", running=(("g", 1),)), now=T0 + 11)
    cmds = s.tick(T0 + 10 + GRACE)
    assert [w for w, _ in sent(cmds, m.Cancel)] == ["w1"]
    assert s.task("g").state == "pending" and s.task("g").retries_used == 1


def test_restart_member_that_finished_meanwhile_resends_its_result(sim: Sim) -> None:
    """Results held unacknowledged are lost with the coordinator; the workers re-send them after
    registering, and a member that no longer runs the task is given the grace period for it."""
    s = run_gang_then_restart(sim)
    s.register(register("w1", running=(("g", 1),)), now=T0 + 11)
    assert sent(s.register(register("w2"), now=T0 + 11), m.Cancel) == []
    assert s.task("g").state == "running"
    assert s.results("w2", node_result("g", 1, 1), now=T0 + 11.1) == []  # held again, not yet acked
    s.tick(T0 + 11 + GRACE)
    assert s.task("g").state == "running"
    s.results("w1", node_result("g", 1, 0), now=T0 + 30)
    assert s.task("g").state == "succeeded"


def test_member_back_without_the_task_and_without_a_result_fails_after_grace(sim: Sim) -> None:
    s = run_gang_then_restart(sim)
    s.register(register("w1", running=(("g", 1),)), now=T0 + 11)
    s.register(register("w2"), now=T0 + 11)
    s.tick(T0 + 11 + GRACE - 0.1)
    assert s.task("g").state == "running"
    cmds = s.tick(T0 + 11 + GRACE)
    assert [w for w, _ in sent(cmds, m.Cancel)] == ["w1"]
    assert "re-registered without the task" in s.task("g").history[-1]["cause"]


def test_reannouncing_a_superseded_gang_attempt_is_cancelled(sim: Sim) -> None:
    sim.register(register("w1"))
    sim.register(register("w2"))
    sim.register(register("w3"))
    sim.submit(training("g", max_retries=2))
    sim.results("w2", node_result("g", 1, 1, "error", error="boom"))
    sim.tick(T0 + 5)
    assert sim.task("g").attempt == 2
    cmds = sim.register(register("w3", running=(("g", 1),)), now=T0 + 6)
    assert ("w3", m.Cancel(m.TaskRef("g", 1), "superseded or unknown attempt")) in sent(cmds, m.Cancel)


def test_a_held_result_survives_its_worker_reconnecting(sim: Sim) -> None:
    sim.register(register("w1"))
    sim.register(register("w2"))
    sim.submit(training("g"))
    sim.results("w2", node_result("g", 1, 1))
    sim.disconnect("w2", now=T0 + 1)
    assert sent(sim.register(register("w2"), now=T0 + 2), m.Cancel) == []  # it no longer runs it: fine
    sim.tick(T0 + 2 + GRACE)
    assert sim.task("g").state == "assigned" and sim.task("g").gang.awaiting == {}
    cmds = sim.results("w1", node_result("g", 1, 0))
    assert sim.task("g").state == "succeeded" and sorted(w for w, _ in sent(cmds, m.ResultAck)) == ["w1", "w2"]


def test_gang_attempt_row_keys_match_the_store_rule_first_row_wins(sim: Sim) -> None:
    """The combined row is saved before any late node result of the same attempt, so the store,
    which keeps the first row per (task_id, attempt), keeps the combined one."""
    sim.register(register("w1"))
    sim.register(register("w2"))
    sim.submit(training("g", max_retries=1))
    sim.results("w1", node_result("g", 1, 0, "error", error="bind failed: port 29500 in use"))
    sim.results("w2", node_result("g", 1, 1, "cancelled"))
    rows = [r for r in sim.journal if isinstance(r, ResultRow) and (r.task_id, r.attempt) == ("g", 1)]
    assert [r.status for r in rows] == ["error", "cancelled"] and "nodes" in rows[0].output
