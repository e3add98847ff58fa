"""User models (``module:callable``) go only to workers whose operator allows the module, and a
submission no connected worker allows is refused. Pure: the state machine, ``now`` passed in."""

from __future__ import annotations

from typing import Any

import pytest

from distributed_testing.coordinator.core.commands import Send
from distributed_testing.coordinator.core.state import CoordinatorState
from distributed_testing.errors import ValidationError
from distributed_testing.protocol import messages as m
from distributed_testing.tasks import spec as specs

T0 = 1000.0


def register(worker_id: str, modules: tuple[str, ...] = ()) -> m.Register:
    return m.Register(worker_id=worker_id, name=worker_id, protocol_version=m.PROTOCOL_VERSION,
                      hardware={"memory_gb": 8.0}, capabilities=["cpu"], tags=[], max_concurrent=2,
                      memory_gb=8.0, model_modules=list(modules))


def bench(task_id: str, model: str) -> list[specs.TaskSpec]:
    doc: dict[str, Any] = {"task_id": task_id, "type": "benchmark", "config": {"model": model, "iterations": 1}}
    return specs.parse_tasks(doc)


def assigned_to(cmds: list[Any]) -> dict[str, str]:
    return {a.task_id: c.worker_id for c in cmds if isinstance(c, Send) and isinstance(c.msg, m.AssignTasks)
            for a in c.msg.tasks}


def test_submit_is_refused_when_no_connected_worker_allows_the_module() -> None:
    s = CoordinatorState()
    s.register(register("w1", ("mypkg.models",)), "s1", T0, key_id="k")
    with pytest.raises(ValidationError) as info:
        s.submit(bench("evil", "os:system"), T0)
    (error,) = info.value.errors
    assert error["field"] == "config.model"
    assert "no connected worker allows module 'os'" in error["error"] and "--allow-model-modules os" in error["error"]
    assert "evil" not in s.tasks
    with pytest.raises(ValidationError, match="'mypkg.modelsX'"):
        s.submit(bench("near", "mypkg.modelsX:make"), T0)
    # built-in and registry models need no permission
    s.submit(bench("builtin", "mlp") + bench("hf", "bert-base-uncased"), T0)
    assert {"builtin", "hf"} <= set(s.tasks)


def test_only_allowing_workers_get_the_task_and_it_waits_with_a_reason_when_they_leave() -> None:
    s = CoordinatorState()
    s.register(register("plain"), "s0", T0, key_id="k")
    s.register(register("allows", ("mypkg.models",)), "s1", T0, key_id="k")
    _, cmds = s.submit(bench("u1", "mypkg.models.small:make") + bench("u2", "mypkg.models:make")
                       + bench("u3", "mypkg.models:other"), T0)
    placed = assigned_to(cmds + s.dispatch(T0 + 1))  # past the benchmark batching wait
    assert len(placed) == 2 and set(placed.values()) == {"allows"}, placed  # "plain" is free but does not allow it
    waiting = next(t for t in s.tasks.values() if t.state == "pending")
    reason = s.why_pending(waiting) or ""
    assert "waiting for a free slot on 1 eligible worker" in reason
    s.disconnect("allows", "s1", T0 + 1)
    reason = s.why_pending(waiting) or ""
    assert "plain lacks permission to import model module mypkg.models" in reason, reason
    assert "--allow-model-modules" in reason
