"""Benchmark tasks: real PyTorch / OpenVINO measurements in a child process.

The child is ``python -m distributed_testing.bench.child`` in its own process group (so a timeout
or cancel kills everything it started), with its own thread settings and ``CUDA_VISIBLE_DEVICES``.
One benchmark runs at a time on a worker, so measurements never contend. Several tasks that share
a model arrive as one batch and go to the child as one request: the model loads once.

With ``cache_models`` the child lives on between tasks and keeps its loaded models; otherwise each
task (or batch) gets a fresh child, so nothing one task did can skew the next. A crash or an
out-of-memory kill of the child becomes an ``error`` result naming the exit; the next task starts
a new child.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from .base import ExecOutcome, TaskContext
from .proc import describe_exit, kill_and_reap

log = logging.getLogger(__name__)
MAX_LINE = 64 * 1024 * 1024


@dataclass(frozen=True)
class BenchmarkOptions:
    """Worker-wide benchmark settings (from the worker's flags)."""

    cache_models: bool = False
    mixed_precision: bool = False
    optimize_for: str | None = None
    cuda_streams: int | None = None
    threads: int | None = None
    cuda_visible_devices: str | None = None


class BenchmarkExecutor:
    task_type = "benchmark"

    def __init__(self, options: BenchmarkOptions | None = None) -> None:
        self.options = options or BenchmarkOptions()
        self._lock = asyncio.Lock()
        self._child: asyncio.subprocess.Process | None = None
        self._ids = itertools.count(1)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        if self._child is not None:
            await kill_and_reap(self._child)
            self._child = None

    async def run(self, ctx: TaskContext) -> ExecOutcome:
        return (await self.run_batch([ctx]))[0]

    async def run_batch(self, ctxs: list[TaskContext]) -> list[ExecOutcome]:
        """Run every task in one child request, in order; one outcome per task."""
        async with self._lock:
            started = time.time()
            try:
                return await self._request(ctxs, started)
            finally:
                if not self.options.cache_models:
                    await self.close()

    def _config(self, ctx: TaskContext) -> dict[str, Any]:
        cfg = dict(ctx.config)
        if self.options.optimize_for is not None:
            cfg.setdefault("optimize_for", self.options.optimize_for)
        if self.options.cuda_streams is not None:
            cfg.setdefault("cuda_streams", self.options.cuda_streams)
        return cfg

    async def _spawn(self) -> asyncio.subprocess.Process:
        args = [sys.executable, "-m", "distributed_testing.bench.child"]
        if self.options.threads is not None:
            args += ["--threads", str(self.options.threads)]
        if self.options.mixed_precision:
            args.append("--mixed-precision")
        env = dict(os.environ)
        if self.options.cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.options.cuda_visible_devices
        return await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=None, env=env,
            start_new_session=True, limit=MAX_LINE)

    async def _request(self, ctxs: list[TaskContext], started: float) -> list[ExecOutcome]:
        if self._child is None or self._child.returncode is not None:
            self._child = await self._spawn()
        child = self._child
        assert child.stdin is not None and child.stdout is not None
        req_id = next(self._ids)
        child.stdin.write(json.dumps({"id": req_id, "configs": [self._config(c) for c in ctxs]}).encode() + b"\n")
        timeouts = [c.timeout_s for c in ctxs]
        timeout = None if any(t is None for t in timeouts) else sum(t for t in timeouts if t is not None)
        try:
            async with asyncio.timeout(timeout):
                await child.stdin.drain()
                line = await child.stdout.readline()
        except TimeoutError:
            await self.close()
            return [ExecOutcome("timed_out", error=f"benchmark exceeded its timeout of {timeout:g}s; process group killed",
                                started_at=started, finished_at=time.time()) for _ in ctxs]
        except asyncio.CancelledError:
            await self.close()
            raise
        except (ConnectionError, OSError) as exc:
            line = b""
            log.warning("benchmark child pipe broke: %s", exc)
        if not line:
            code = await kill_and_reap(child)
            self._child = None
            reason = f"benchmark process died ({describe_exit(code)}) before answering; out of memory is a common cause"
            return [ExecOutcome("error", error=reason, output={"retryable": False}, started_at=started,
                                finished_at=time.time()) for _ in ctxs]
        return _outcomes(json.loads(line), len(ctxs), started)


def _outcomes(reply: dict[str, Any], n: int, started: float) -> list[ExecOutcome]:
    finished = time.time()
    if "error" in reply:
        err = reply["error"]
        return [ExecOutcome("error", error=f"{err.get('type')}: {err.get('message')}", started_at=started,
                            finished_at=finished) for _ in range(n)]
    out: list[ExecOutcome] = []
    for entry in reply.get("results", []):
        if "error" in entry:
            err = entry["error"]
            status = "failed" if err.get("type") == "OutOfMemory" else "error"
            out.append(ExecOutcome(status, output={"error_type": err.get("type")},
                                   error=f"{err.get('type')}: {err.get('message')}",
                                   started_at=started, finished_at=finished))
        else:
            out.append(ExecOutcome("succeeded", output=entry, started_at=started, finished_at=finished))
    if len(out) != n:
        raise RuntimeError(f"benchmark child answered {len(out)} results for {n} tasks")
    return out
