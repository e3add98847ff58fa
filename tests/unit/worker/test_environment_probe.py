"""The environment probe's failure path: a result carries the reason, never fails for it."""

from __future__ import annotations

import asyncio

from distributed_testing.worker.environment import EnvironmentProbe, WithEnvironment
from distributed_testing.worker.executors.base import ExecOutcome, TaskContext


class _Echo:
    task_type = "custom"

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def run(self, ctx: TaskContext) -> ExecOutcome:
        return ExecOutcome("succeeded", output=dict(ctx.config))


def test_a_failing_probe_leaves_the_reason_and_keeps_a_given_environment() -> None:
    wrapped = WithEnvironment(_Echo(), EnvironmentProbe(python="/bin/false"))
    assert not hasattr(wrapped, "run_batch")  # the agent batches only executors that can

    async def go() -> tuple[ExecOutcome, ExecOutcome]:
        plain = await wrapped.run(TaskContext("t", 1, "custom", {}))
        own = await wrapped.run(TaskContext("u", 1, "custom", {"environment": {"fingerprint_hash": "x"}}))
        return plain, own

    plain, own = asyncio.run(go())
    assert plain.status == "succeeded"
    assert plain.output["environment"] == {"unavailable": "environment probe exited 1: no output"}
    assert own.output["environment"] == {"fingerprint_hash": "x"}
