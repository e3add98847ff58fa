"""A trivial task kind, ``echo``, added outside the package: everything a new kind needs is its
registry entry (:data:`ECHO`) and one executor module (this file's :class:`EchoExecutor` and
:func:`build`). ``test_task_kind_registry.py`` runs it through a real coordinator and worker."""

from __future__ import annotations

from typing import Annotated

import msgspec

from distributed_testing.tasks.kinds import Kind
from distributed_testing.worker.executors.base import ExecOutcome, ExecutorSettings, TaskContext


class EchoConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Say ``message`` ``repeat`` times."""

    message: Annotated[str, msgspec.Meta(min_length=1)]
    repeat: Annotated[int, msgspec.Meta(ge=1, le=10)] = 1


class EchoExecutor:
    task_type = "echo"

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def run(self, ctx: TaskContext) -> ExecOutcome:
        cfg = msgspec.convert(ctx.config, EchoConfig)  # validated at submit: decoded, not re-checked
        return ExecOutcome("succeeded", output={"echo": " ".join([cfg.message] * cfg.repeat)})


def build(settings: ExecutorSettings) -> EchoExecutor:
    return EchoExecutor()


ECHO = Kind("echo", EchoConfig, "echo_kind:build", hardware=lambda cfg: ("cpu",))
