"""Benchmark tasks: real PyTorch / OpenVINO measurements in a child process.

The child is ``python -m distributed_testing.bench.child`` in its own process group (so a timeout
or cancel kills everything it started), with its own thread settings and ``CUDA_VISIBLE_DEVICES``.
One benchmark runs at a time on a worker, so measurements never contend. Several tasks that share
a model arrive as one batch and go to the child as one request: the model loads once.

With ``cache_models`` the child lives on between tasks and keeps its loaded models; otherwise each
task (or batch) gets a fresh child, so nothing one task did can skew the next. A crash or an
out-of-memory kill of the child becomes an ``error`` result naming the exit; the next task starts
a new child. With the worker's confinement (:mod:`..confine`) the child runs in it, writing only
to a scratch directory of its own, removed with the child.

The child's stderr (its log, and whatever a model prints) goes to the worker's log at INFO, each
line marked ``benchmark child <pid>:`` and its control characters escaped, never straight to the
worker's own stderr, where it could pass for a line of the worker's; a child that dies before
answering leaves the tail of it in the result (``stderr_tail``).

While a task runs, each batch size it finishes is its progress (``TaskContext.progress``, a
``progress`` message to the coordinator): the fraction done and the child's line, ``cnn b8 fp32:
1.23 ms (3 of 6)``.

Every successful result is stored in the worker's :class:`~..bench_cache.ResultCache`, keyed by
config and environment fingerprint. A task with ``cache: true`` is first looked up there: the
child reports the fingerprint of the task's backend and device (``op: fingerprint``, remembered
for the child's lifetime), and on a hit the stored result is returned without measuring, marked
``from_cache: true`` with ``cached_from_task`` and ``cached_at``; in a batch only the misses go
to the child. Measured results say ``from_cache: false``. A failing cache is logged and the task
runs as a miss.

A task with a bundle (``ctx.bundle_root``) gets a child of its own, started inside the sandbox
(:mod:`distributed_testing.worker.sandbox`) with the task's view of the bundle as its working
directory and *last* on ``sys.path`` (``model: "module:callable"`` imports from the bundle, but a
shipped ``argparse.py`` cannot shadow the standard library the child itself imports), its scratch
directory writable, the GPU device nodes bound in, and the sandbox's scrubbed
environment (``CUDA_VISIBLE_DEVICES`` and the ``DT_BENCH_*`` thread settings carried over). The
bundle's own top-level modules are allowed on top of ``--allow-model-modules`` (the task came from
an ``--allow-code`` key to an ``--accept-bundles`` worker); the callable must still be defined in
an allowed module. The child is killed after the task (a cached child of the operator's tasks is
kept aside meanwhile), and the result cache is neither read nor written: the key does not know
the bundle's code; the output says ``shipped_code: true``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...bundles.tree import top_level_modules
from ...errors import ExecutionError, StoreError
from ...process.childenv import child_environ
from .. import confine
from ..bench_cache import CacheEntry, MemoryResultCache, ResultCache, cache_key
from ..confine import Confinement
from ..sandbox import GPU_VARIABLES, PACKAGE_PARENT, gpu_devices, task_environ
from .base import ExecOutcome, ExecutorSettings, OutcomeStatus, TaskContext, check_model_allowed, task_python
from .proc import OutputTail, describe_exit, exited, finish_relay, kill_and_reap

log = logging.getLogger(__name__)
MAX_LINE = 64 * 1024 * 1024
MAX_PROGRESS_LINE = 4096  # a progress line of the child is short; a reply (its results) may not be
# what a sandboxed child keeps of the worker's environment: the GPU it may use, its thread settings
_CARRIED = (*GPU_VARIABLES, "DT_BENCH_THREADS", "DT_BENCH_INTEROP_THREADS")
FINGERPRINT_TIMEOUT_S = 120.0  # the child's torch import plus a first CUDA/OpenVINO device query


class _ChildDied(Exception):
    """The benchmark child ended (or its pipe broke) before answering; it has been reaped."""

    def __init__(self, returncode: int, stderr_tail: str = "") -> None:
        super().__init__(describe_exit(returncode))
        self.stderr_tail = stderr_tail


@dataclass(frozen=True)
class BenchmarkOptions:
    """Worker-wide benchmark settings (from the worker's flags)."""

    cache_models: bool = False
    mixed_precision: bool = False
    optimize_for: str | None = None
    cuda_streams: int | None = None
    threads: int | None = None
    cuda_visible_devices: str | None = None
    allow_model_modules: tuple[str, ...] = ()  # --allow-model-modules, enforced again in the child


class BenchmarkExecutor:
    task_type = "benchmark"

    def __init__(self, options: BenchmarkOptions | None = None, cache: ResultCache | None = None,
                 exclusive: asyncio.Lock | None = None, confinement: Confinement | None = None) -> None:
        self.options = options or BenchmarkOptions()
        self.confinement = confinement  # the child of tasks without a bundle runs in it (worker/confine.py)
        self._scratch: Path | None = None  # that child's scratch directory, removed with it
        self._seen: tuple[object, ...] = ()  # the confinement's watched files when it started
        self.cache: ResultCache = cache if cache is not None else MemoryResultCache()
        self._lock = asyncio.Lock()
        # shared with the training executor (ExecutorSettings.exclusive): one measurement at a time
        self.exclusive = exclusive or asyncio.Lock()
        self._child: asyncio.subprocess.Process | None = None
        # each child's stderr, read into the worker's log (OutputTail.forward) and a tail
        self._stderr: dict[asyncio.subprocess.Process, tuple[OutputTail, asyncio.Task[None]]] = {}
        self._ids = itertools.count(1)
        self._fingerprints: dict[tuple[str, str, str], str | None] = {}  # (backend kind, device, threads) -> hash

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        self._fingerprints.clear()
        if self._child is not None:
            await self._reap(self._child)
            self._child = None
        if self._scratch is not None:
            await asyncio.to_thread(confine.remove, self._scratch)
            self._scratch = None

    async def run(self, ctx: TaskContext) -> ExecOutcome:
        return (await self.run_batch([ctx]))[0]

    async def run_batch(self, ctxs: list[TaskContext]) -> list[ExecOutcome]:
        """Answer cache hits, run the rest in one child request, in order; one outcome per task."""
        if any(c.bundle_root is not None for c in ctxs):
            if len(ctxs) != 1:  # the coordinator never batches them (coordinator/model.py)
                raise ExecutionError("benchmark tasks with a bundle run one at a time, not in a batch")
            return [await self._run_shipped(ctxs[0])]
        for ctx in ctxs:
            check_model_allowed(ctx)
        async with self.exclusive, self._lock:
            started = time.time()
            try:
                await self._renew_if_stale()
                configs = [self._config(c) for c in ctxs]
                outcomes: dict[int, ExecOutcome] = await self._lookup(ctxs, configs)
                misses = [i for i in range(len(ctxs)) if i not in outcomes]
                if misses:
                    ran = await self._request([ctxs[i] for i in misses], [configs[i] for i in misses], started)
                    await self._store([ctxs[i] for i in misses], [configs[i] for i in misses], ran)
                    outcomes.update(zip(misses, ran, strict=True))
                return [outcomes[i] for i in range(len(ctxs))]
            finally:
                if not self.options.cache_models:
                    await self.close()

    async def _renew_if_stale(self) -> None:
        """Stop a cached confined child started before a key or token file hidden by name was
        replaced (it could read the new one); the next request starts another."""
        if self._child is not None and self.confinement is not None and self._seen != self.confinement.identity():
            log.info("benchmark child %d: a key or token file hidden by name was replaced since it started (it could "
                     "read the new one); starting another", self._child.pid)
            await self.close()

    async def _run_shipped(self, ctx: TaskContext) -> ExecOutcome:
        """A bundle task in a sandboxed child of its own (module docstring)."""
        assert ctx.bundle_root is not None
        if ctx.sandbox is None or ctx.scratch_dir is None:
            raise ExecutionError("a benchmark task with a bundle needs the worker's sandbox and a scratch directory")
        tops = top_level_modules(ctx.bundle_root)
        check_model_allowed(dataclasses.replace(ctx, allow_model_modules=(*ctx.allow_model_modules, *tops)))
        async with self.exclusive, self._lock:
            kept = self._child, self._scratch  # the operator's cached child waits aside
            self._child = self._scratch = None
            try:
                self._child = await self._spawn(ctx, tops)
                outcome = (await self._request([ctx], [self._config(ctx)], time.time()))[0]
            finally:
                await self.close()
                self._child, self._scratch = kept
        outcome.output["shipped_code"] = True  # the bundle's code ran in it: never taken for a plain model's figure
        return outcome

    def _config(self, ctx: TaskContext) -> dict[str, Any]:
        cfg = dict(ctx.config)
        if self.options.optimize_for is not None:
            cfg.setdefault("optimize_for", self.options.optimize_for)
        if self.options.cuda_streams is not None:
            cfg.setdefault("cuda_streams", self.options.cuda_streams)
        return cfg

    def _runner_settings(self) -> dict[str, Any]:
        """Worker settings that change a measurement without showing in the config."""
        return {"mixed_precision": self.options.mixed_precision}

    async def _spawn(self, shipped: TaskContext | None = None, modules: tuple[str, ...] = ()) -> asyncio.subprocess.Process:
        """The benchmark child; with ``shipped``, a bundle task's sandboxed one allowing ``modules``
        too."""
        allowed = (*self.options.allow_model_modules, *modules)
        python, env_dirs = task_python(shipped) if shipped is not None else (sys.executable, [])
        # -P: the working directory (a bundle's tree) is not put first on sys.path, where a shipped
        # argparse.py would shadow the standard library; the child appends the tree last (--bundle-root)
        args = [python, "-P", "-m", "distributed_testing.bench.child", f"--allow-model-modules={','.join(allowed)}"]
        if self.options.threads is not None:
            args += ["--threads", str(self.options.threads)]
        if self.options.mixed_precision:
            args.append("--mixed-precision")
        env = child_environ()
        if self.options.cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.options.cuda_visible_devices
        cwd = None
        if shipped is not None and shipped.bundle_root is not None and shipped.scratch_dir is not None:
            cwd = shipped.bundle_root.resolve()
            args.append(f"--bundle-root={cwd}")
            carried = {k: v for k, v in env.items() if k in _CARRIED}
            env = {**task_environ(carried, shipped.scratch_dir), "PYTHONPATH": str(PACKAGE_PARENT)}
            args = shipped.sandbox.wrap(args, ro=env_dirs, rw=[cwd, shipped.scratch_dir], cwd=cwd, env=env,
                                        devices=gpu_devices(), shm_mb=shipped.max_memory_mb,
                                        scratch=shipped.scratch_dir)
        elif self.confinement is not None:  # the operator's models: the deny-list
            await asyncio.to_thread(confine.remove, self._scratch)  # a dead child's
            self._seen = self.confinement.identity()  # before the command: a change after it renews the child
            self._scratch = await asyncio.to_thread(self.confinement.scratch, "bench")
            env = self.confinement.environ(env, self._scratch)
            args = self.confinement.wrap(args, rw=[self._scratch], devices=gpu_devices())
        child = await asyncio.create_subprocess_exec(
            *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=env, start_new_session=True, limit=MAX_LINE, cwd=cwd)
        assert child.stderr is not None
        tail = OutputTail()
        self._stderr[child] = tail, asyncio.create_task(tail.forward(child.stderr, log, f"benchmark child {child.pid}:"))
        return child

    async def _reap(self, child: asyncio.subprocess.Process, since: int = 0) -> tuple[int, str]:
        """Kill ``child``'s process group, wait for it and for the rest of its stderr; its exit
        code and stderr's tail (what it wrote after ``since`` bytes: ``OutputTail.text``)."""
        code = await kill_and_reap(child)
        tail, forward = self._stderr.pop(child, (OutputTail(), None))
        if forward is not None:
            await finish_relay(forward, f"benchmark child {child.pid}")
        return code, tail.text(since)

    async def _exchange(self, request: dict[str, Any], timeout: float | None,
                        progress: Callable[[dict[str, Any]], None] | None = None,
                        output: Callable[[bytes], None] | None = None) -> bytes:
        """Send one request to the child (started if needed) and return its reply line; its
        progress lines before it go to ``progress``, what it writes to stderr meanwhile to
        ``output`` (the tasks' output streams). A child that dies first raises _ChildDied
        (reaped); a timeout or cancel kills the child and propagates."""
        if self._child is None or exited(self._child):
            if self._child is not None:  # a cached child that died while idle: its group and stderr relay go too
                code, _ = await self._reap(self._child)
                log.warning("cached benchmark child %d had exited while idle (%s); starting another",
                            self._child.pid, describe_exit(code))
            self._fingerprints.clear()
            self._child = await self._spawn()
        child = self._child
        assert child.stdin is not None and child.stdout is not None
        # a cached child served the tasks before this one: what it wrote for them is not this one's
        mark = self._stderr[child][0].total_bytes if child in self._stderr else 0
        if child in self._stderr:
            self._stderr[child][0].sink = output
        child.stdin.write(json.dumps({"id": next(self._ids), **request}).encode() + b"\n")
        try:
            async with asyncio.timeout(timeout):
                await child.stdin.drain()
                line = await child.stdout.readline()
                while (report := _progress_report(line)) is not None:
                    if progress is not None:
                        progress(report)
                    line = await child.stdout.readline()
        except (TimeoutError, asyncio.CancelledError):
            await self.close()
            raise
        except (ConnectionError, OSError) as exc:
            line = b""
            log.warning("benchmark child pipe broke: %s", exc)
        finally:
            if child in self._stderr:
                self._stderr[child][0].sink = None
        if not line:
            code, stderr_tail = await self._reap(child, since=mark)
            self._child = None
            self._fingerprints.clear()
            raise _ChildDied(code, stderr_tail)
        return line

    async def _request(self, ctxs: list[TaskContext], configs: list[dict[str, Any]], started: float) -> list[ExecOutcome]:
        timeouts = [c.timeout_s for c in ctxs]
        timeout = None if any(t is None for t in timeouts) else sum(t for t in timeouts if t is not None)
        try:
            line = await self._exchange({"configs": configs}, timeout, functools.partial(_forward_progress, ctxs),
                                        _fan_out([c.output for c in ctxs if c.output is not None]))
        except TimeoutError:
            return [ExecOutcome("timed_out", error=f"benchmark exceeded its timeout of {timeout:g}s; process group killed",
                                started_at=started, finished_at=time.time()) for _ in ctxs]
        except _ChildDied as exc:
            reason = f"benchmark process died ({exc}) before answering; out of memory is a common cause"
            return [ExecOutcome("error", error=reason, output={"retryable": False, "stderr_tail": exc.stderr_tail},
                                started_at=started, finished_at=time.time()) for _ in ctxs]
        outcomes = _outcomes(json.loads(line), len(ctxs), started)
        for outcome in outcomes:
            if outcome.status == "succeeded":
                outcome.output["from_cache"] = False
        return outcomes

    async def _fingerprint(self, config: dict[str, Any]) -> str | None:
        """The environment fingerprint hash a run of ``config`` would report, or None when the
        child cannot tell (the run then reports why)."""
        backend = config.get("backend", "eager")
        device = config.get("device")
        where = ("openvino" if backend == "openvino" else "torch", json.dumps(device), json.dumps(config.get("threads")))
        if where in self._fingerprints:
            return self._fingerprints[where]
        threads = config.get("threads")
        request: dict[str, Any] = {"op": "fingerprint", "backend": backend}
        if device is not None:
            request["device"] = device
        if threads is not None:
            request["threads"] = threads
        try:
            line = await self._exchange(request, FINGERPRINT_TIMEOUT_S)
        except TimeoutError:
            log.warning("benchmark child gave no fingerprint within %gs; looking nothing up", FINGERPRINT_TIMEOUT_S)
            return None
        except _ChildDied as exc:
            log.warning("benchmark child died (%s) before reporting a fingerprint; looking nothing up", exc)
            return None
        reply = json.loads(line)
        found = reply.get("fingerprint_hash")
        fingerprint = found if isinstance(found, str) else None
        if fingerprint is None:
            log.info("no fingerprint for backend %s device %s: %s", backend, device, reply.get("error"))
        self._fingerprints[where] = fingerprint
        return fingerprint

    async def _lookup(self, ctxs: list[TaskContext], configs: list[dict[str, Any]]) -> dict[int, ExecOutcome]:
        """Outcomes for the ``cache: true`` tasks whose result is stored, by index."""
        keys: dict[int, str] = {}
        for i, (ctx, cfg) in enumerate(zip(ctxs, configs, strict=True)):
            if ctx.cache:
                fingerprint = await self._fingerprint(cfg)
                if fingerprint is not None:
                    keys[i] = cache_key(cfg, fingerprint, self._runner_settings())
        if not keys:
            return {}
        try:
            found = await self.cache.get(sorted(set(keys.values())))
        except StoreError as exc:
            log.error("benchmark cache lookup failed, running %d task(s) instead: %s", len(keys), exc)
            return {}
        hits = {i: _from_cache(found[key], ctxs[i]) for i, key in keys.items() if key in found}
        for i in hits:
            log.info("benchmark task %s answered from the cache (measured by %s)", ctxs[i].task_id,
                     found[keys[i]].task_id)
        return hits

    async def _store(self, ctxs: list[TaskContext], configs: list[dict[str, Any]], outcomes: list[ExecOutcome]) -> None:
        """Keep every successful measurement, so a later ``cache: true`` task can use it."""
        now = time.time()
        entries = []
        for ctx, cfg, outcome in zip(ctxs, configs, outcomes, strict=True):
            fingerprint = outcome.output.get("environment", {}).get("fingerprint_hash")
            if outcome.status != "succeeded" or not isinstance(fingerprint, str):
                continue
            result = {k: v for k, v in outcome.output.items() if k != "from_cache"}
            entries.append(CacheEntry(key=cache_key(cfg, fingerprint, self._runner_settings()),
                                      fingerprint_hash=fingerprint, config=cfg, result=result,
                                      task_id=ctx.task_id, created_at=now))
        if not entries:
            return
        try:
            await self.cache.put(entries)
        except StoreError as exc:
            log.error("storing %d benchmark result(s) in the cache failed: %s", len(entries), exc)


def _progress_report(line: bytes) -> dict[str, Any] | None:
    """The report of a progress line of the child (``bench/child.py``), else None (a reply)."""
    if not line.startswith(b'{"id"') or len(line) > MAX_PROGRESS_LINE or b'"progress"' not in line:
        return None
    parsed = json.loads(line)
    report = parsed.get("progress") if isinstance(parsed, dict) else None
    return report if isinstance(report, dict) else None


def _forward_progress(ctxs: list[TaskContext], report: dict[str, Any]) -> None:
    """A finished batch size of config ``index`` as that task's progress (``TaskContext.progress``)."""
    index, done, total, line = (report.get(k) for k in ("index", "done", "total", "line"))
    if not (isinstance(index, int) and 0 <= index < len(ctxs) and isinstance(done, int) and isinstance(total, int)
            and total > 0 and isinstance(line, str)):
        log.warning("benchmark child sent a malformed progress report: %.200r", report)
        return
    if (report_to := ctxs[index].progress) is not None:
        report_to(min(1.0, max(0.0, done / total)), line)


def _from_cache(entry: CacheEntry, ctx: TaskContext) -> ExecOutcome:
    """A stored result as this task's outcome; ``name`` is this task's own (it is not in the key)."""
    output = {k: v for k, v in entry.result.items() if k != "name"}
    if ctx.config.get("name") is not None:
        output = {"name": ctx.config["name"], **output}
    output.update(from_cache=True, cached_from_task=entry.task_id, cached_at=entry.created_at)
    now = time.time()
    return ExecOutcome("succeeded", output=output, started_at=now, finished_at=now)


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
            status: OutcomeStatus = "failed" if err.get("type") == "OutOfMemory" else "error"
            out.append(ExecOutcome(status, output={"error_type": err.get("type")},
                                   error=f"{err.get('type')}: {err.get('message')}",
                                   started_at=started, finished_at=finished))
        else:
            out.append(ExecOutcome("succeeded", output=entry, started_at=started, finished_at=finished))
    if len(out) != n:
        raise RuntimeError(f"benchmark child answered {len(out)} results for {n} tasks")
    return out


def build(settings: ExecutorSettings) -> BenchmarkExecutor:
    """The ``benchmark`` kind's executor (``tasks.kinds``)."""
    return BenchmarkExecutor(settings.benchmark, cache=settings.result_cache, exclusive=settings.exclusive,
                             confinement=settings.confinement)


def _fan_out(sinks: list[Callable[[bytes], None]]) -> Callable[[bytes], None] | None:
    """One sink writing to each of ``sinks`` (a batch's tasks share their child's output)."""
    if len(sinks) <= 1:
        return sinks[0] if sinks else None

    def write(data: bytes) -> None:
        for sink in sinks:
            sink(data)
    return write
