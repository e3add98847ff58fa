"""Task executors, one per task type, behind the :class:`~.base.Executor` protocol.

:func:`default_executors` builds the set a worker runs with. The executor classes are imported
lazily (PEP 562), so a custom-handler pool child, which imports a module of this package, starts
without loading asyncio, psutil or the other executors. Nothing here imports torch or starts a
process; executors start their children in ``start()``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed_testing.worker.executors.base import ExecOutcome, Executor, TaskContext

if TYPE_CHECKING:
    from distributed_testing.worker.executors.benchmark import BenchmarkExecutor, BenchmarkOptions
    from distributed_testing.worker.executors.custom import CustomExecutor
    from distributed_testing.worker.executors.test import TestExecutor
    from distributed_testing.worker.executors.training import BenchmarkRouter, TrainingExecutor, TrainingOptions

__all__ = [
    "CustomExecutor",
    "ExecOutcome",
    "Executor",
    "TaskContext",
    "TestExecutor",
    "BenchmarkExecutor",
    "BenchmarkOptions",
    "BenchmarkRouter",
    "TrainingExecutor",
    "TrainingOptions",
    "default_executors",
]

_LAZY = {"CustomExecutor": "custom", "TestExecutor": "test", "BenchmarkExecutor": "benchmark",
         "BenchmarkOptions": "benchmark", "BenchmarkRouter": "training", "TrainingExecutor": "training",
         "TrainingOptions": "training"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def default_executors(
    max_concurrency: int = 1,
    *,
    cache_dir: Path | None = None,
    custom_pool_size: int | None = None,
    custom_handlers: Mapping[str, str] | None = None,
    custom_pythonpath: Sequence[Path] = (),
    pytest_env: Mapping[str, str] | None = None,
    benchmark: BenchmarkOptions | None = None,
    training: TrainingOptions | None = None,
) -> dict[str, Executor]:
    """The executors a worker runs, keyed by task type (``test``, ``custom``, ``benchmark``).

    ``max_concurrency`` is the worker's task slot count. The custom pool defaults to
    ``min(max_concurrency, 2 × CPU cores)`` children: more interpreters than that only contend for
    the cores, and a task beyond it waits (holding its slot) for the next free child.
    ``benchmark`` is a :class:`~.training.BenchmarkRouter`: configs with ``"kind": "training"``
    run as one node of a DDP job (``training.py``; files under ``training.run_dir``, by default
    ``<cache_dir>/training``), the rest in the benchmark child process (``benchmark.py``); one
    benchmark or training node at a time.
    Call ``start()`` on each before the first task and ``close()`` at shutdown.
    """
    import tempfile

    from distributed_testing.worker.executors.benchmark import BenchmarkExecutor
    from distributed_testing.worker.executors.custom import CustomExecutor
    from distributed_testing.worker.executors.test import TestExecutor
    from distributed_testing.worker.executors.training import BenchmarkRouter, TrainingExecutor, TrainingOptions

    if training is None:
        base = cache_dir if cache_dir is not None else Path(tempfile.gettempdir()) / "distributed_testing"
        training = TrainingOptions(run_dir=base / "training")

    executors: list[Executor] = [
        TestExecutor(extra_env=pytest_env),
        CustomExecutor(
            max_concurrency,
            pool_size=custom_pool_size or min(max_concurrency, 2 * (os.cpu_count() or 1)),
            cache_dir=cache_dir,
            handlers=custom_handlers,
            pythonpath=custom_pythonpath,
        ),
        BenchmarkRouter(BenchmarkExecutor(benchmark), TrainingExecutor(training)),
    ]
    return {e.task_type: e for e in executors}
