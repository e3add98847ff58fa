"""Task executors, one per task type, behind the :class:`~.base.Executor` protocol.

:func:`default_executors` builds the set a worker runs with. The executor classes are imported
lazily (PEP 562), so a custom-handler pool child, which imports a module of this package, starts
without loading asyncio, psutil or the other executors. Nothing here imports torch or starts a
process; executors start their children in ``start()``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed_testing.tasks import kinds
from distributed_testing.worker.executors.base import ExecOutcome, Executor, ExecutorSettings, TaskContext

if TYPE_CHECKING:
    from distributed_testing.worker.executors.benchmark import BenchmarkExecutor, BenchmarkOptions
    from distributed_testing.worker.executors.custom import CustomExecutor
    from distributed_testing.worker.executors.test import TestExecutor
    from distributed_testing.worker.executors.training import TrainingExecutor, TrainingOptions

__all__ = [
    "CustomExecutor",
    "ExecOutcome",
    "Executor",
    "ExecutorSettings",
    "TaskContext",
    "TestExecutor",
    "BenchmarkExecutor",
    "BenchmarkOptions",
    "TrainingExecutor",
    "TrainingOptions",
    "build_executor",
    "default_executors",
]

_LAZY = {"CustomExecutor": "custom", "TestExecutor": "test", "BenchmarkExecutor": "benchmark",
         "BenchmarkOptions": "benchmark", "TrainingExecutor": "training", "TrainingOptions": "training"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def build_executor(kind: kinds.Kind, settings: ExecutorSettings) -> Executor:
    """Import ``kind.executor`` (``package.module:factory``) and build the kind's executor;
    ConfigError-free by design: a bad path is a programming error and raises ImportError or
    AttributeError naming it."""
    module, _, attr = kind.executor.partition(":")
    factory = getattr(importlib.import_module(module), attr)
    executor: Executor = factory(settings)
    if executor.task_type != kind.name:
        raise TypeError(f"{kind.executor} built an executor for {executor.task_type!r}, not {kind.name!r}")
    return executor


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
    result_cache: Any = None,
    registry: kinds.Registry | None = None,
    confinement: Any = None,
) -> dict[str, Executor]:
    """The executors a worker runs, keyed by task type: one per kind of ``registry`` (default:
    :func:`~distributed_testing.tasks.kinds.active`), each built by its kind's factory.

    ``max_concurrency`` is the worker's task slot count. The custom pool defaults to
    ``min(max_concurrency, 2 × CPU cores)`` children: more interpreters than that only contend for
    the cores, and a task beyond it waits (holding its slot) for the next free child. Benchmarks
    and training nodes share one lock (one measurement at a time); training files go under
    ``training.run_dir``, by default ``<cache_dir>/training``; ``result_cache`` is the benchmark
    result cache (default: in memory); ``confinement`` (:func:`~distributed_testing.worker.confine.for_worker`)
    confines the children of tasks without a bundle, None leaves them unconfined. Call ``start()`` on each before the first task and
    ``close()`` at shutdown.
    """
    import tempfile

    base = cache_dir if cache_dir is not None else Path(tempfile.gettempdir()) / "distributed_testing"
    settings = ExecutorSettings(max_concurrency=max_concurrency, cache_dir=base, custom_pool_size=custom_pool_size,
                                custom_handlers=custom_handlers, custom_pythonpath=custom_pythonpath,
                                pytest_env=pytest_env, benchmark=benchmark, training=training,
                                result_cache=result_cache, confinement=confinement)
    return {k.name: build_executor(k, settings) for k in (registry or kinds.active()).kinds}
