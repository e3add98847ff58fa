"""The ``custom`` task type: run a named handler in a pool of long-lived child processes.

Config: ``{"name": str, "parameters": dict}``. Handlers and how to add more are described in
:mod:`.handlers`; the process pool in :mod:`.pool`. Outcomes:

* handler returned a dict -> ``succeeded`` with that dict as output;
* handler raised -> ``failed``, ``error`` = the traceback's last line, ``output["traceback"]``;
* ``ctx.timeout_s`` passed -> ``timed_out`` (the child's process group is killed and replaced);
* ``ctx.max_memory_mb`` exceeded by the child's process tree -> ``failed`` (killed, replaced);
* the child died (segfault, ``os._exit``) -> ``error`` with its exit code (replaced);
* unknown handler, bad parameters, a plugin that will not import -> :class:`ExecutionError`.

A task with a bundle (``ctx.bundle_root``) names its handler as ``"module:function"`` inside the
bundle (``module``'s top-level name must be a ``NAME.py`` or a directory at the bundle's root). It
never runs in the shared pool: a long-lived child serves one task after another, so one task
could leave code behind for the next or read its files. Each shipped handler gets a one-off pool
of one child started inside the sandbox (``ctx.sandbox``, :mod:`distributed_testing.worker.sandbox`)
with the task's view of the bundle as its working directory (first on ``sys.path``), the bundle unchangeable, its
scratch directory writable (``HandlerContext.work_dir``; ``cache_dir`` is None), the sandbox's
scrubbed environment and network, and the interpreter of the bundle's Python environment when it
has requirements (:func:`.base.task_python`). The same limits and outcomes apply; the child is killed after
the task.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from distributed_testing.bundles.tree import top_level_modules
from distributed_testing.errors import ExecutionError
from distributed_testing.process.childenv import child_environ
from distributed_testing.tasks.usercode import shipped_handler_error
from distributed_testing.worker.confine import Confinement
from distributed_testing.worker.executors.base import ExecOutcome, ExecutorSettings, TaskContext, task_python
from distributed_testing.worker.executors.handlers import (
    BUILTIN_HANDLERS,
    ENTRY_POINT_GROUP,
    Handler,
    HandlerContext,
    HandlerParameterError,
    HandlerRegistry,
)
from distributed_testing.worker.executors.pool import ChainControl, HandlerPool, PoolResult
from distributed_testing.worker.executors.pool_child import Request
from distributed_testing.worker.executors.proc import describe_exit
from distributed_testing.worker.sandbox import PACKAGE_PARENT, gpu_devices, gpu_environ, task_environ

__all__ = [
    "BUILTIN_HANDLERS",
    "ENTRY_POINT_GROUP",
    "CustomExecutor",
    "Handler",
    "HandlerContext",
    "HandlerParameterError",
    "parse_custom_config",
]

logger = logging.getLogger(__name__)
_JSON_DECODER = msgspec.json.Decoder(dict[str, Any])


def parse_custom_config(config: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Validate a ``custom`` task config and return ``(name, parameters)``."""
    unknown = sorted(set(config) - {"name", "parameters"})
    if unknown:
        raise ExecutionError(f"custom task config has unknown key(s): {', '.join(unknown)}")
    name = config.get("name")
    if not isinstance(name, str) or not name:
        raise ExecutionError(f"custom task config needs name as a non-empty string, got {name!r}")
    parameters = config.get("parameters", {})
    if not isinstance(parameters, dict):
        raise ExecutionError(f"custom task parameters must be an object, got {type(parameters).__name__}")
    return name, parameters


class CustomExecutor:
    """Runs custom handlers in a pool of ``pool_size`` children (default ``max_concurrency``).

    ``cache_dir`` is the handlers' cache directory (``HandlerContext.cache_dir``, made at
    :meth:`start`; ``setup_environment`` clears it): the worker's is ``<cache dir>/handlers``
    (:func:`build`), beside the training runs' directories. ``handlers`` adds
    ``name -> "module:function"`` handlers next to the built-ins and entry points; ``pythonpath``
    is prepended to the children's import path. With ``confinement`` the pool's children run in
    it (:class:`.pool.HandlerPool`), ``cache_dir`` writable and nothing else of the worker's cache
    directory in reach (a running training task's result, say).
    """

    task_type = "custom"

    def __init__(
        self,
        max_concurrency: int = 1,
        *,
        pool_size: int | None = None,
        cache_dir: Path | None = None,
        handlers: Mapping[str, str] | None = None,
        pythonpath: Sequence[Path] = (),
        use_entry_points: bool = True,
        start_timeout_s: float = 60.0,
        confinement: Confinement | None = None,
    ) -> None:
        size = pool_size if pool_size is not None else max_concurrency
        self.registry = HandlerRegistry(handlers, use_entry_points=use_entry_points)
        self.pool = HandlerPool(
            size,
            handlers=handlers,
            pythonpath=pythonpath,
            use_entry_points=use_entry_points,
            start_timeout_s=start_timeout_s,
            confinement=confinement,
            writable=[] if cache_dir is None else [cache_dir],
        )
        self._cache_path = cache_dir
        self._cache_dir = None if cache_dir is None else str(cache_dir)
        self._started = False

    def handler_names(self) -> list[str]:
        """Every handler this executor can run, sorted."""
        return self.registry.names()

    async def start(self) -> None:
        """Start the pool's children (a second call does nothing)."""
        if not self._started:
            if self._cache_path is not None:  # bound into confined children: it must exist first
                self._cache_path.mkdir(parents=True, exist_ok=True)
            await self.pool.start()
            self._started = True

    async def close(self) -> None:
        """Kill every pool child. Idempotent."""
        await self.pool.close()

    async def run(self, ctx: TaskContext) -> ExecOutcome:
        """Run the handler named in ``ctx.config``; outcomes as in the module docstring."""
        name, parameters = parse_custom_config(ctx.config)
        if ctx.bundle_root is not None:
            return await self._run_shipped(ctx, name, parameters)
        if name not in self.registry:
            raise ExecutionError(f"unknown custom handler {name!r}; known handlers: {', '.join(self.handler_names())}")
        if not self._started:
            raise RuntimeError("CustomExecutor.run() called before start()")
        started = time.time()
        request = Request(
            seq=0,
            name=name,
            parameters=parameters,
            task_id=ctx.task_id,
            attempt=ctx.attempt,
            cache_dir=self._cache_dir,
            work_dir=None if ctx.work_dir is None else str(ctx.work_dir),
            timeout_s=ctx.timeout_s,
        )
        result = await self.pool.call(request, timeout_s=ctx.timeout_s, max_memory_mb=ctx.max_memory_mb,
                                      output=ctx.output)
        outcome = _outcome(name, result, ctx)
        outcome.started_at = started
        outcome.finished_at = time.time()
        return outcome

    async def run_chain(self, ctxs: Sequence[TaskContext],
                        control: ChainControl) -> AsyncGenerator[tuple[int, ExecOutcome | None], None]:
        """Several queued tasks of the shared pool on one child in one exchange (``HandlerPool.chain``),
        yielding ``(index, outcome)`` as each ends, in order, with the outcomes of :meth:`run`; None
        for a task the child skipped (``control.skip``: it never began); one killed through
        ``control.withdraw`` ends ``cancelled``. Tasks after the last one
        yielded never began. ExecutionError before anything ran when one of them cannot run here
        (a shipped one, an unknown handler, a bad config): the caller runs them one by one.
        Use it with ``contextlib.aclosing``."""
        requests: list[Request] = []
        for ctx in ctxs:
            name, parameters = parse_custom_config(ctx.config)
            if ctx.bundle_root is not None or name not in self.registry or not self._started:
                raise ExecutionError(f"task {ctx.task_id} cannot run in a chain")
            # positional, in Request's field order (one per task of a chain): seq, name, parameters, task_id,
            # attempt, cache_dir, work_dir, timeout_s
            requests.append(Request(0, name, parameters, ctx.task_id, ctx.attempt, self._cache_dir,
                                    None if ctx.work_dir is None else str(ctx.work_dir), ctx.timeout_s))
        started = time.time()
        async with contextlib.aclosing(self.pool.chain(requests, control, timeouts=[c.timeout_s for c in ctxs],
                                                       max_memory_mb=ctxs[0].max_memory_mb,
                                                       outputs=[c.output for c in ctxs])) as replies:
            async for i, result in replies:
                if result.kind == "skipped":
                    yield i, None
                    continue
                if result.kind == "cancelled":
                    outcome = ExecOutcome("cancelled", error="cancelled while in a chain")
                else:
                    outcome = _outcome(requests[i].name, result, ctxs[i])
                outcome.started_at, outcome.finished_at = started, time.time()
                started = outcome.finished_at
                yield i, outcome

    async def _run_shipped(self, ctx: TaskContext, name: str, parameters: dict[str, Any]) -> ExecOutcome:
        """A bundle's ``module:function`` handler in its own sandboxed child (module docstring)."""
        assert ctx.bundle_root is not None
        root = ctx.bundle_root.resolve()
        if (bad := shipped_handler_error(name, top_level_modules(root))) is not None:
            raise ExecutionError(bad)
        if ctx.sandbox is None or ctx.scratch_dir is None:
            raise ExecutionError("a custom task with a bundle needs the worker's sandbox and a scratch directory")
        scratch = ctx.scratch_dir
        env = {**task_environ(gpu_environ(child_environ()), scratch), "PYTHONPATH": str(PACKAGE_PARENT)}
        python, env_dirs = task_python(ctx)  # the bundle's environment when it has requirements
        argv = [python, *HandlerPool.child_argv({name: name}, use_entry_points=False)[1:]]
        argv = ctx.sandbox.wrap(argv, ro=env_dirs, rw=[root, scratch], cwd=root, env=env, devices=gpu_devices(),
                                shm_mb=ctx.max_memory_mb, scratch=scratch)
        pool = HandlerPool(1, command=argv, env=env, cwd=root)
        started = time.time()
        try:
            await pool.start()
            request = Request(seq=0, name=name, parameters=parameters, task_id=ctx.task_id, attempt=ctx.attempt,
                              work_dir=str(ctx.sandbox.seen(scratch, scratch)), timeout_s=ctx.timeout_s)
            result = await pool.call(request, timeout_s=ctx.timeout_s, max_memory_mb=ctx.max_memory_mb,
                                     output=ctx.output)
        finally:
            await pool.close()
        outcome = _outcome(name, result, ctx)
        outcome.started_at = started
        outcome.finished_at = time.time()
        return outcome


def _outcome(name: str, result: PoolResult, ctx: TaskContext) -> ExecOutcome:
    if result.kind == "timed_out":
        return ExecOutcome("timed_out", error=f"custom handler {name!r} timed out after {ctx.timeout_s:g} s")
    if result.kind == "memory":
        return ExecOutcome("failed", error=f"custom handler {name!r}: {result.memory_error}")
    if result.kind == "died":
        code = result.returncode
        assert code is not None
        return ExecOutcome(
            "error",
            output={"exit_code": code, "stderr_tail": result.stderr_tail},
            error=f"custom handler {name!r}: child {result.child_pid} died ({describe_exit(code)})",
        )
    reply = result.reply
    assert reply is not None
    if reply.kind == "ok":
        return ExecOutcome("succeeded", output=_JSON_DECODER.decode(reply.output_json))
    if reply.kind == "raised":
        return ExecOutcome("failed", output={"traceback": reply.traceback}, error=reply.error)
    raise ExecutionError(f"custom handler {name!r}: {reply.error}")


def build(settings: ExecutorSettings) -> CustomExecutor:
    """The ``custom`` kind's executor (``tasks.kinds``): a pool of ``min(slots, 2 × cores)``
    children unless ``custom_pool_size`` says otherwise. Handlers get a cache directory of their
    own, ``handlers`` in the worker's: the training runs beside it are none of theirs (a confined
    handler could otherwise rewrite a running training task's result, and ``clear_cache`` delete
    it)."""
    return CustomExecutor(settings.max_concurrency,
                          pool_size=settings.custom_pool_size or min(settings.max_concurrency, 2 * (os.cpu_count() or 1)),
                          cache_dir=settings.cache_dir / "handlers", handlers=settings.custom_handlers,
                          pythonpath=settings.custom_pythonpath, confinement=settings.confinement)
