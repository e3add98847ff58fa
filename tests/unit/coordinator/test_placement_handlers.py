"""Custom handlers: workers report the handler names they have (``Register.handlers``), a custom
task waits for a worker with its handler (saying so in its pending reason) instead of failing on
one without it, and ``--strict`` (``DT_STRICT``) refuses it at submit. Pure: ``now`` passed in."""

from __future__ import annotations

from typing import Any

import pytest

from distributed_testing.cli import coordinator as coord_cli
from distributed_testing.coordinator.core.commands import Send
from distributed_testing.coordinator.core.policy import Policy
from distributed_testing.coordinator.core.state import CoordinatorState
from distributed_testing.coordinator.runtime import Runtime
from distributed_testing.coordinator.store.memory import MemoryStore
from distributed_testing.errors import ConfigError, ValidationError
from distributed_testing.protocol import messages as m
from distributed_testing.tasks import spec as specs

T0 = 1000.0


def register(worker_id: str, handlers: list[str] | None) -> m.Register:
    return m.Register(worker_id=worker_id, name=worker_id, protocol_version=m.PROTOCOL_VERSION, hardware={},
                      capabilities=["cpu"], tags=[], max_concurrent=2, memory_gb=8.0, handlers=handlers)


def custom(task_id: str, name: str) -> list[specs.TaskSpec]:
    return specs.parse_tasks({"task_id": task_id, "type": "custom", "config": {"name": name}})


def assigned_to(cmds: list[Any]) -> dict[str, str]:
    return {a.task_id: c.worker_id for c in cmds if isinstance(c, Send) and isinstance(c.msg, m.AssignTasks)
            for a in c.msg.tasks}


def test_a_task_waits_for_a_worker_with_its_handler_and_says_why() -> None:
    s = CoordinatorState()
    s.register(register("basic", ["noop", "sleep"]), "s0", T0, key_id="k")
    _, cmds = s.submit(custom("c1", "train_tokenizer") + custom("c2", "noop"), T0)
    assert assigned_to(cmds) == {"c2": "basic"}
    reason = s.why_pending(s.tasks["c1"]) or ""
    assert "basic lacks custom handler 'train_tokenizer' (it has noop, sleep)" in reason, reason
    cmds = s.register(register("full", ["noop", "train_tokenizer"]), "s1", T0 + 1, key_id="k")
    assert assigned_to(cmds + s.dispatch(T0 + 1)) == {"c1": "full"}


def test_strict_refuses_a_handler_no_connected_worker_has_naming_the_field() -> None:
    s = CoordinatorState(Policy(strict=True))
    s.register(register("basic", ["noop"]), "s0", T0, key_id="k")
    with pytest.raises(ValidationError) as info:
        s.submit(custom("ok", "noop") + custom("bad", "nope"), T0)
    (error,) = info.value.errors
    assert error["field"] == "[1].config.name"
    assert "no connected worker has custom handler 'nope' (connected workers have: noop)" in error["error"]
    assert not s.tasks  # nothing of a refused submission is kept
    s.submit(custom("ok", "noop"), T0)
    lenient = CoordinatorState()
    lenient.register(register("basic", ["noop"]), "s0", T0, key_id="k")
    lenient.submit(custom("waits", "nope"), T0)  # without --strict it is accepted and waits
    assert lenient.tasks["waits"].state == "pending"


def cfg(argv: list[str], env: dict[str, str]) -> Any:
    return coord_cli.config_from_args(coord_cli.build_parser().parse_args(argv), env)


def test_strict_flag_and_env_reach_the_policy() -> None:
    assert cfg([], {}).strict is False
    assert cfg(["--strict"], {}).strict is True
    assert cfg([], {"DT_STRICT": "1"}).strict is True and cfg([], {"DT_STRICT": "false"}).strict is False
    assert cfg(["--strict"], {"DT_STRICT": "0"}).strict is True  # the flag wins
    with pytest.raises(ConfigError, match="DT_STRICT: must be 1/true/yes or 0/false/no, got 'maybe'"):
        cfg([], {"DT_STRICT": "maybe"})
    assert Runtime(cfg(["--strict"], {}), MemoryStore()).state.policy.strict is True
