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

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from distributed_testing.errors import ExecutionError
from distributed_testing.protocol.messages import GangAssignment
from distributed_testing.tasks.usercode import is_user_model, refusal

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
    # where the task's children's stdout/stderr goes, chunk by chunk, on the event loop: streamed
    # while it runs and kept, bounded, with its result (worker/tasklogs.py)
    output: Callable[[bytes], None] | None = None
    # where a test executor hands each test's entry (the worker's tree, the entry its result will
    # carry) as the test ends: streamed while the task runs (worker/tasklogs.py, ReportStreams)
    reports: Callable[[str, dict[str, Any]], None] | None = None
    cache: bool = False
    gang: GangAssignment | None = None  # this node's part of a multi-node training task
    interface: str | None = None  # the NIC this worker reported: training ranks bind it
    # what the worker's operator lets submitters run (docs/security.md): --allow-model-modules
    # prefixes and the guarded pytest options of --allow-test-options
    allow_model_modules: tuple[str, ...] = ()
    allow_test_options: tuple[str, ...] = ()
    # shipped code (docs/tasks.md, "Bundles"): the task's own view of the tree, its writable scratch
    # directory and the sandbox its children run in (worker/sandbox.py); None without a bundle
    bundle_root: Path | None = None
    scratch_dir: Path | None = None
    sandbox: Any = None  # worker.sandbox.Sandbox | None
    # a bundle task with Python requirements (worker/pyenv.py): its environment's interpreter and
    # the build report (digest, cached, build_s) the result output carries as ``python_env``
    python: Path | None = None
    python_env: dict[str, Any] | None = None


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


def _new_lock() -> Any:
    import asyncio  # lazily: a custom-handler pool child imports this module without asyncio

    return asyncio.Lock()


@dataclass
class ExecutorSettings:
    """Everything a task kind's executor factory (``Kind.executor``, a ``module:build`` path)
    may use to build its executor: the worker's flags and shared resources. ``exclusive`` is the
    lock that keeps benchmarks and training nodes from measuring at the same time; ``extra``
    carries options of kinds added outside this package, by kind name."""

    max_concurrency: int = 1
    cache_dir: Path = field(default_factory=lambda: Path("/tmp/distributed_testing"))
    custom_pool_size: int | None = None
    custom_handlers: Mapping[str, str] | None = None
    custom_pythonpath: Sequence[Path] = ()
    pytest_env: Mapping[str, str] | None = None
    benchmark: Any = None  # BenchmarkOptions | None
    training: Any = None  # TrainingOptions | None
    result_cache: Any = None  # bench_cache.ResultCache | None
    exclusive: Any = field(default_factory=_new_lock)  # asyncio.Lock
    confinement: Any = None  # worker.confine.Confinement | None: how tasks without a bundle are confined
    extra: dict[str, Any] = field(default_factory=dict)


def task_python(ctx: TaskContext) -> tuple[str, list[Path]]:
    """The interpreter a task's child runs (its bundle's environment when the task has Python
    requirements, else the worker's) and the directories a sandbox must show it, read-only."""
    if ctx.python is None:
        return sys.executable, []
    return str(ctx.python), [ctx.python.parent.parent]


def check_model_allowed(ctx: TaskContext) -> None:
    """Raise ExecutionError before anything starts when the task's ``module:callable`` model
    imports a module the worker's ``--allow-model-modules`` does not allow."""
    name = ctx.config.get("model") if isinstance(ctx.config, dict) else None
    if isinstance(name, str) and is_user_model(name):
        reason = refusal(name, ctx.allow_model_modules)
        if reason is not None:
            raise ExecutionError(reason)


def advertised_handlers(executors: Mapping[str, Any]) -> list[str]:
    """The custom handler names a worker with ``executors`` runs (its ``Register.handlers``):
    the ``custom`` executor's ``handler_names()``; none without one."""
    custom = executors.get("custom")
    names = getattr(custom, "handler_names", None)
    return list(names()) if callable(names) else []
