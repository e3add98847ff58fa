"""The environment fingerprint on test, custom and training results.

Benchmark results carry the fingerprint their benchmark child measured in (``bench/env.py``).
Every other result gets the worker's: :class:`EnvironmentProbe` runs ``python -m
distributed_testing.bench.env`` once, in a child process (the worker itself never imports torch),
as soon as the executors start (so a task's result does not wait for it), and keeps the answer for the
worker's life. The fields and the
``fingerprint_hash`` are those of a benchmark result on this machine's first accelerator (CUDA
when torch sees one, else the CPU) with torch's default threads.

:class:`WithEnvironment` wraps an executor: every outcome whose output has no ``environment``
gets the probe's. When the probe fails (no torch, a crash, a timeout) the result carries
``{"unavailable": reason}`` instead, and the worker logs the reason: a result is never held back
or failed for its fingerprint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import AsyncGenerator
from typing import Any

from .executors.base import ExecOutcome, Executor, TaskContext

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 120.0


class EnvironmentProbe:
    """This worker's environment, collected once in a child interpreter and cached."""

    def __init__(self, python: str = sys.executable, timeout_s: float = PROBE_TIMEOUT_S) -> None:
        self.python = python
        self.timeout_s = timeout_s
        self._value: dict[str, Any] | None = None
        self._lock = asyncio.Lock()
        self._prefetch: asyncio.Task[dict[str, Any]] | None = None

    def prefetch(self) -> None:
        """Start collecting now, in the background (once); :meth:`get` then finds it ready."""
        if self._prefetch is None and self._value is None:
            self._prefetch = asyncio.create_task(self.get(), name="environment-probe")

    async def ready(self, wait_s: float = 1.0) -> dict[str, Any]:
        """:meth:`get` when it answers within ``wait_s``; else ``{"unavailable": ...}`` saying the
        probe is still running: a result is never held back for its fingerprint."""
        self.prefetch()
        if self._value is not None:
            return dict(self._value)
        assert self._prefetch is not None
        try:
            async with asyncio.timeout(wait_s):
                return dict(await asyncio.shield(self._prefetch))
        except TimeoutError:
            return {"unavailable": f"the environment probe had not finished {wait_s:g} s after the task"}

    async def close(self) -> None:
        """Stop a collection still under way (its child is killed with it)."""
        if self._prefetch is not None and not self._prefetch.done():
            self._prefetch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prefetch

    async def get(self) -> dict[str, Any]:
        """The environment dict (``fingerprint_hash`` included), or ``{"unavailable": reason}``."""
        async with self._lock:
            if self._value is None:
                self._value = await self._collect()
            return dict(self._value)

    async def _collect(self) -> dict[str, Any]:
        proc = await asyncio.create_subprocess_exec(
            self.python, "-m", "distributed_testing.bench.env",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            async with asyncio.timeout(self.timeout_s):
                out, err = await proc.communicate()
        except TimeoutError:
            await _kill(proc)
            return self._unavailable(f"environment probe gave no answer within {self.timeout_s:g} s")
        except asyncio.CancelledError:  # the worker stops (close): the probe goes with it
            await _kill(proc)
            raise
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            return self._unavailable(f"environment probe exited {proc.returncode}: {tail[0]}")
        try:
            value = json.loads(out)
        except json.JSONDecodeError as exc:
            return self._unavailable(f"environment probe printed no JSON: {exc}")
        if not isinstance(value, dict) or not isinstance(value.get("fingerprint_hash"), str):
            return self._unavailable("environment probe printed no fingerprint_hash")
        return value

    @staticmethod
    def _unavailable(reason: str) -> dict[str, Any]:
        log.warning("results of this worker carry no environment fingerprint: %s", reason)
        return {"unavailable": reason}


class WithEnvironment:
    """``inner`` whose outcomes carry ``output["environment"]`` (see the module docstring)."""

    def __init__(self, inner: Executor, probe: EnvironmentProbe) -> None:
        self.inner = inner
        self.probe = probe
        self.task_type = inner.task_type
        if hasattr(inner, "run_batch"):  # the agent batches only executors that can
            self.run_batch = self._run_batch
        if hasattr(inner, "run_chain"):  # and chains (worker/core/state.py) only those that can
            self.run_chain = self._run_chain

    def __getattr__(self, name: str) -> Any:
        """Everything else is the inner executor's (``handler_names`` of the custom executor, ...)."""
        return getattr(self.inner, name)

    async def start(self) -> None:
        await self.inner.start()
        self.probe.prefetch()

    async def close(self) -> None:
        await self.inner.close()
        await self.probe.close()

    async def run(self, ctx: TaskContext) -> ExecOutcome:
        return await self._stamp(await self.inner.run(ctx))

    async def _run_batch(self, ctxs: list[TaskContext]) -> list[ExecOutcome]:
        outcomes: list[ExecOutcome] = await self.inner.run_batch(ctxs)  # type: ignore[attr-defined]
        return [await self._stamp(o) for o in outcomes]

    async def _run_chain(self, ctxs: list[TaskContext], control: Any) -> AsyncGenerator[tuple[int, ExecOutcome | None], None]:
        async with contextlib.aclosing(self.inner.run_chain(ctxs, control)) as outcomes:  # type: ignore[attr-defined]
            async for i, outcome in outcomes:
                yield i, None if outcome is None else await self._stamp(outcome)

    async def _stamp(self, outcome: ExecOutcome) -> ExecOutcome:
        if "environment" not in outcome.output:
            outcome.output["environment"] = await self.probe.ready()
        return outcome


def with_environment(executors: dict[str, Executor], probe: EnvironmentProbe) -> dict[str, Executor]:
    """Every executor wrapped in :class:`WithEnvironment` sharing ``probe``."""
    return {kind: WithEnvironment(e, probe) for kind, e in executors.items()}


async def _kill(proc: asyncio.subprocess.Process) -> None:
    """Kill the probe and reap it; one that ended on its own meanwhile is fine (uvloop raises
    ProcessLookupError for it: a worker stopping right after a refused registration ended with
    that traceback instead of its message)."""
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    await proc.wait()
