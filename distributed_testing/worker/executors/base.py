"""The one contract every task executor implements.

An executor runs one task type. ``run`` never runs user code in the worker's event loop: it
starts or reuses a child process and awaits it. The contract:

* A task that ran and did not do what it should (a failing test, a handler that raised) returns an
  :class:`ExecOutcome` with ``status="failed"`` and the details in ``output`` / ``error``.
* A task that exceeded ``ctx.timeout_s`` has its whole process group killed and returns
  ``status="timed_out"``.
* If the awaiting asyncio task is cancelled, the child's process group is killed before
  ``CancelledError`` propagates (that is how ``dt cancel`` and worker shutdown stop work).
* Invalid config or a missing library raises :class:`~distributed_testing.errors.ExecutionError`
  with a message that says what is wrong; the agent reports it as ``status="error"``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from distributed_testing.protocol.messages import GangAssignment

OutcomeStatus = Literal["succeeded", "failed", "timed_out", "cancelled", "error"]


@dataclass(frozen=True)
class TaskContext:
    """Everything an executor may know about the task it runs."""

    task_id: str
    attempt: int
    type: str
    config: dict[str, Any]
    timeout_s: float | None = None
    max_memory_mb: int | None = None
    test_root: Path = field(default_factory=Path.cwd)
    work_dir: Path | None = None
    progress: Callable[[float, str], None] | None = None
    cache: bool = False
    gang: GangAssignment | None = None  # this node's part of a multi-node training task
    interface: str | None = None  # the NIC this worker reported: training ranks bind it
    # what the worker's operator lets submitters run (docs/security.md): --allow-model-modules
    # prefixes and the guarded pytest options of --allow-test-options
    allow_model_modules: tuple[str, ...] = ()
    allow_test_options: tuple[str, ...] = ()


@dataclass
class ExecOutcome:
    status: OutcomeStatus
    output: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    started_at: float = field(default_factory=time.time)
    finished_at: float = field(default_factory=time.time)


class Executor(Protocol):
    """One task type's runner. Instances live as long as the worker agent."""

    task_type: str

    async def start(self) -> None:
        """Prepare long-lived resources (process pools). Called once before the first task."""

    async def run(self, ctx: TaskContext) -> ExecOutcome: ...

    async def close(self) -> None:
        """Kill children and free resources. Idempotent."""
