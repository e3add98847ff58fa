"""Benchmark batching in the pure scheduler: one slot per batch, freed when the whole batch is
done; a lone benchmark task waits at most batch_wait_s for mates."""

from distributed_testing.coordinator.core.commands import Send
from distributed_testing.coordinator.core.policy import Policy
from distributed_testing.coordinator.core.state import CoordinatorState
from distributed_testing.protocol import messages as m
from distributed_testing.tasks.spec import parse_tasks


def bench(task_id: str, model: str = "mlp", **cfg: object) -> dict[str, object]:
    return {"task_id": task_id, "type": "benchmark", "config": {"model": model, **cfg}}


def worker(s: CoordinatorState, slots: int = 1) -> None:
    s.register(m.Register(worker_id="w", name="w", protocol_version=1, hardware={}, capabilities=["cpu"],
                          tags=[], max_concurrent=slots), "sess", 0.0, key_id="k")


def assigns(cmds: list[object]) -> list[m.AssignTasks]:
    return [c.msg for c in cmds if isinstance(c, Send) and isinstance(c.msg, m.AssignTasks)]


def done(s: CoordinatorState, *ids: str, now: float) -> list[object]:
    return s.results("w", m.Results([m.TaskResult(i, s.tasks[i].attempt, "succeeded", 1.0, 2.0) for i in ids]), now)


def test_a_batch_holds_one_slot_until_every_member_is_done() -> None:
    s = CoordinatorState(Policy(batch_max=3, batch_wait_s=0.0))
    worker(s, slots=1)
    _, cmds = s.submit(parse_tasks([bench(f"b{i}") for i in range(5)]), 1.0)
    [first] = assigns(cmds)
    assert [t.task_id for t in first.tasks] == ["b0", "b1", "b2"] and first.batch_id == "batch-b0"
    assert assigns(done(s, "b0", "b1", now=2.0)) == []  # b2 still holds the batch's slot
    [second] = assigns(done(s, "b2", now=3.0))
    assert [t.task_id for t in second.tasks] == ["b3", "b4"]


def test_only_matching_models_share_a_batch() -> None:
    s = CoordinatorState(Policy(batch_max=8, batch_wait_s=0.0))
    worker(s, slots=2)
    _, cmds = s.submit(parse_tasks([bench("a1"), bench("g1", model="gpt2"), bench("a2"),
                                    bench("a3", precision="int8")]), 1.0)
    sent = {tuple(t.task_id for t in a.tasks) for a in assigns(cmds)}
    assert sent == {("a1", "a2"), ("g1",)}


def test_a_lone_task_waits_for_mates_then_goes_alone() -> None:
    s = CoordinatorState(Policy(batch_max=4, batch_wait_s=0.5, worker_ttl_s=1e9))  # no heartbeats here
    worker(s)
    _, cmds = s.submit(parse_tasks([bench("solo")]), 10.0)
    assert assigns(cmds) == [] and s.tasks["solo"].state == "pending"
    _, cmds = s.submit(parse_tasks([bench("mate")]), 10.2)
    assert assigns(cmds) == []  # two of four, still within the wait
    [a] = assigns(s.tick(10.6))
    assert [t.task_id for t in a.tasks] == ["solo", "mate"]


def test_bundle_tasks_go_alone_and_bring_their_own_model_module() -> None:
    """Each bundle task gets its own tree and sandboxed child on the worker, so none shares a
    batch; its ``module:callable`` is checked against the bundle there, not against the workers'
    ``--allow-model-modules`` here (no worker allows ``shipped``)."""
    s = CoordinatorState(Policy(batch_max=8, batch_wait_s=0.0))
    s.register(m.Register(worker_id="w", name="w", protocol_version=1, hardware={}, capabilities=["cpu"],
                          tags=[], max_concurrent=3, accept_bundles=True), "sess", 0.0, key_id="k")
    digest = "ab" * 32
    _, cmds = s.submit(parse_tasks([{**bench(f"s{i}", model="shipped:make"), "bundle": digest} for i in range(3)]), 1.0)
    [sent] = assigns(cmds)  # one message to the worker, three separate tasks
    assert [t.task_id for t in sent.tasks] == ["s0", "s1", "s2"] and sent.batch_id is None
