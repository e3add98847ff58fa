"""Pytest sessions that serve a run: the shipped test tasks of one plugin run go to long-lived
pytest processes instead of one pytest each.

A ``test`` task with a bundle and ``config.session`` (the plugin's run id) is served by a session
kept under :class:`SessionKey`: the run, the submitting key, the bundle's digest, the digest of
its Python requirements and of the options the session's pytest started with (``test_args``,
``cwd``, the memory limit that sizes its ``/dev/shm``). Nothing of one key's sessions is ever
handed a task of another key, so no test sees another run's, or another submitter's, process.

* **One session per busy slot.** A task takes an idle session of its key, or starts one: the
  task's tree, scratch directory, environment and sandbox are prepared as for any shipped task
  (``ShippedCode.task``) but held by the session until it ends, and its pytest runs in that same
  sandbox with :mod:`.pytest_serve` loaded, collecting nothing until it is handed tests. Each task
  sends one command (its ``test_file`` and ``tests``) and reads the reports back until the
  command's end; a module that an earlier task imported is not imported again, conftests and
  plugins load once. Each task still gets its own result, built from its tests' reports as a
  task of its own would be (:func:`.test._outcome`'s counts and messages).
* **A test that ends the process** (``os._exit``, a segfault, the kernel's OOM killer) is that
  test's failure: its report says the session ended while it ran, how (exit code or signal) and
  the session's last output; a new session process (same tree and environment) runs the task's
  tests that had not started, and the task goes on. A session that dies before any test of the
  task started fails the task with that cause (once restarted when the session was an idle one
  reused).
* **The session ends with its run.** On the worker, that is: a task of its key cancelled (``dt
  cancel``, the run's cancel, the worker stopping) or timed out ends every idle session of the
  key, and the busy ones when their task ends; a session over the memory limit is killed with
  its task; a session idle for :data:`IDLE_S` seconds ends (the run is over, or this worker is
  not given its tasks any more); ``close()`` (the worker stops) kills every session. A session
  that ended removes its tree and scratch directory and releases its environment.
* **Its byte code is kept.** A session writes ``__pycache__`` into its tree (unless the task says
  ``write_bytecode: false``: the submitter's pytest wrote none) and the worker keeps it, once the
  session has collected and when it ends, for the next session of the same key, bundle and
  environment, whose tree starts with it (``bundles/bytecode.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Coroutine, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgspec

from distributed_testing.errors import ExecutionError
from distributed_testing.protocol.messages import TaskAssignment
from distributed_testing.tasks.configs import TestConfig
from distributed_testing.tasks.pytest_args import bad_test_file, rebase_test_paths, refused_test_args
from distributed_testing.worker.executors import pytest_report, pytest_serve
from distributed_testing.worker.executors.base import ExecOutcome, ExecutorSettings, TaskContext, task_python
from distributed_testing.worker.executors.proc import (
    OutputTail,
    describe_exit,
    finish_relay,
    kill_process_group,
    signal_name,
)
from distributed_testing.worker.executors.session_coverage import tree_coverage
from distributed_testing.worker.executors.supervise import MemoryWatch, run_limited
from distributed_testing.worker.executors.test import (
    MAX_REPORT_BYTES,
    PYTEST_EXIT,
    SERVE_PLUGIN,
    SHIPPED_PLUGINS,
    TestExecutor,
    TestSummary,
    effective_timeout,
    failure_summary,
    pytest_argv,
    pytest_errors,
    resolve_test_path,
    resolve_test_paths,
    standalone_plugins,
    started_as,
    task_cwd,
)
from distributed_testing.worker.sandbox import gpu_devices, gpu_environ, task_environ

log = logging.getLogger(__name__)
IDLE_S = 15.0  # a session with no task of its run for this long ends
_CRASH_TAIL_CHARS = 3000
_TAIL_BYTES = 65536
_DRAIN_GRACE_S = 2.0
_EXIT_WAIT_S = 2.0  # after its replies end, how long a session's process has to exit by itself

Prepare = Callable[[], AbstractAsyncContextManager[dict[str, Any]]]


@dataclass(frozen=True)
class SessionKey:
    """What a session serves; sessions are never shared across keys."""

    run: str
    submitter: str | None
    bundle: str
    python: str
    options: str


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:32]


def session_key(a: TaskAssignment) -> SessionKey | None:
    """The key of a task a session serves (a ``test`` task with a bundle and ``config.session``), else None."""
    cfg = a.config if isinstance(a.config, dict) else {}
    run = getattr(a, "run_id", None) or cfg.get("session")
    if a.type != "test" or a.bundle is None or not isinstance(cfg.get("session"), str) or not run:
        return None
    options = {"test_args": cfg.get("test_args") or [], "cwd": cfg.get("cwd"), "max_memory_mb": a.max_memory_mb,
               "collect": cfg.get("collect") or [], "env": cfg.get("env") or {},
               "safe_path": bool(cfg.get("safe_path")), "write_bytecode": cfg.get("write_bytecode") is not False}
    return SessionKey(str(run), a.submitted_by, a.bundle, _digest(sorted(a.python)), _digest(options))


class StartFailed(ExecutionError):
    """A session's pytest ended before it took a command; ``tree``: the root it ran in."""

    def __init__(self, message: str, tree: str) -> None:
        super().__init__(message)
        self.tree = tree


class _Session:
    """One pytest process serving tasks of ``key``, with the shipped fields it runs in."""

    def __init__(self, key: SessionKey, fields: dict[str, Any], stack: contextlib.AsyncExitStack, gen: int) -> None:
        self.key = key
        # its byte code is kept for the next session of its key and tree (bundles/bytecode.py)
        self.keep_bytecode: Callable[[], Coroutine[Any, Any, None]] | None = fields.pop("keep_bytecode", None)
        self.keeping: asyncio.Task[None] | None = None
        self.fields = fields
        self.root = Path(fields["bundle_root"]).resolve()
        self.seen_root = self.seen(self.root)  # the tree as its pytest sees it
        self.stack = stack
        self.gen = gen
        self.proc: asyncio.subprocess.Process | None = None
        self.replies: asyncio.StreamReader | None = None
        self.commands: asyncio.WriteTransport | None = None
        self.reader_transport: asyncio.BaseTransport | None = None
        self.tail = OutputTail(_TAIL_BYTES)
        self.drain: asyncio.Task[None] | None = None
        self.initial: list[str] = []  # what it collects at start (the run's paths), relative to the root
        self.served = 0  # commands sent over its life (across restarts)
        self.starts = 0
        self.last_used = time.monotonic()

    def seen(self, path: Path) -> Path:  # where its pytest sees the worker's ``path`` (the sandbox's mount of it)
        return Path(self.fields["sandbox"].seen(path, self.fields["scratch_dir"]))

    async def start(self, spec: TestConfig, ctx: TaskContext, base_env: Mapping[str, str],
                    extra: Mapping[str, str]) -> None:
        """Start (or start again) the pytest process in the task's sandbox, collecting
        ``self.initial`` (paths relative to the root) as its first command; returns once it has
        collected and waits for the tasks' commands. ExecutionError, with pytest's reason, if it ends before."""
        spawned = time.time()
        scratch: Path = self.fields["scratch_dir"]
        root, cwd = self.root, task_cwd(self.root, spec.cwd)
        python, env_dirs = task_python(replace(ctx, **self.fields))
        plugins = await asyncio.to_thread(standalone_plugins, scratch.parent / "pytest-plugins")
        cmd_r, cmd_w = os.pipe()
        rep_r, rep_w = os.pipe()
        try:
            argv = [*pytest_argv(".", root, list(spec.test_args), f"fd:{rep_w}", python, SHIPPED_PLUGINS, cwd=cwd,
                                 cache_dir=scratch / "pytest-cache"),
                    "-p", SERVE_PLUGIN, f"{pytest_serve.SERVE_OPTION}={cmd_r}"]
            given = {**gpu_environ(base_env), **extra, **spec.env}
            env = started_as(spec, task_environ(given, scratch, self.fields.get("python")))
            if self.keep_bytecode is not None and "PYTHONDONTWRITEBYTECODE" not in given:  # kept for the next session
                del env["PYTHONDONTWRITEBYTECODE"]
            env["PYTHONPATH"] = os.pathsep.join([str(plugins), *filter(None, [env.get("PYTHONPATH")])])
            argv = self.fields["sandbox"].wrap(argv, ro=[*env_dirs, plugins], rw=[root, scratch], cwd=cwd, env=env,
                                               devices=gpu_devices(), shm_mb=ctx.max_memory_mb,
                                               scratch=scratch)
            self.proc = await asyncio.create_subprocess_exec(
                *argv, cwd=cwd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True, env=env, pass_fds=(cmd_r, rep_w))
        except BaseException:
            for fd in (cmd_w, rep_r):
                os.close(fd)
            raise
        finally:
            os.close(cmd_r)
            os.close(rep_w)
        loop = asyncio.get_running_loop()
        replies = self.replies = asyncio.StreamReader(limit=MAX_REPORT_BYTES)
        self.reader_transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(replies), os.fdopen(rep_r, "rb", 0))
        self.commands, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(cmd_w, "wb", 0))
        assert self.proc.stdout is not None
        self.drain = asyncio.create_task(self.tail.drain(self.proc.stdout))
        self.starts += 1
        log.info("pytest session %d started for run %s (bundle %s, start %d)", self.proc.pid, self.key.run,
                 self.key.bundle[:12], self.starts)
        self.send({"collect": rebase_test_paths(self.initial, self.seen_root, self.seen(cwd))})
        while (line := await self.line()) is not None:  # its collection's reports: no task's
            if line.get("kind") == "ready":
                configured, collect_s = line.get("configured"), line.get("collect_s")
                if isinstance(configured, float) and isinstance(collect_s, float):
                    log.info("pytest session %d of run %s ready: %.3f s to start pytest, %.3f s to collect %s tests",
                             self.proc.pid, self.key.run, configured - spawned, collect_s, line.get("collected"))
                if self.keep_bytecode is not None and self.keeping is None:  # its collection's, for the next run
                    self.keeping = asyncio.create_task(self.keep_bytecode())
                return
        code = await self.stop(wait_s=_EXIT_WAIT_S)
        meaning = PYTEST_EXIT.get(code) if code is not None else None
        head = f"pytest exit code {code} ({meaning})" if meaning else f"pytest {_how(code)}"
        tail = self.tail.text()[-_CRASH_TAIL_CHARS:]
        said = pytest_errors(tail)  # pytest's reason first, as for a pytest of the task's own
        raise StartFailed(f"{head} at the session's start: {said}\n{tail}" if said
                          else f"{head} at the session's start:\n{tail}", str(self.seen_root))

    def send(self, cmd: dict[str, Any]) -> None:
        assert self.commands is not None
        self.served += 1
        self.commands.write((json.dumps(cmd) + "\n").encode())

    async def line(self) -> dict[str, Any] | None:
        """The next reply (None: the process ended); a line cut short by a crash is skipped."""
        assert self.replies is not None
        while True:
            try:
                raw = await self.replies.readline()
            except ValueError as exc:  # over the limit
                raise ExecutionError(f"a reply of the pytest session exceeded {MAX_REPORT_BYTES} bytes") from exc
            if not raw:
                return None
            try:
                out = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if isinstance(out, dict):
                return out

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def stop(self, wait_s: float = 0.0) -> int | None:
        """Kill the process group (after up to ``wait_s`` for the process to end by itself: its
        own exit code, not the kill's), reap it; its exit code."""
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        if wait_s > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await proc.wait()
        kill_process_group(proc.pid)
        code = await proc.wait()
        for t in (self.commands, self.reader_transport):
            if t is not None:
                t.close()
        self.commands = self.reader_transport = None
        if self.drain is not None:
            await finish_relay(self.drain, f"pytest session {proc.pid}", _DRAIN_GRACE_S)
            self.drain = None
        return code

    async def close(self) -> None:
        try:
            await self.stop()
        finally:
            await self.stack.aclose()


class SessionPool:
    """The sessions of this worker's ``test`` executor, by key (see the module docstring)."""

    def __init__(self, env: Mapping[str, str], extra: Mapping[str, str], poll_s: float, idle_s: float = IDLE_S) -> None:
        self._env = env
        self._extra = extra
        self._poll_s = poll_s
        self.idle_s = idle_s
        self._idle: dict[SessionKey, list[_Session]] = {}
        self._live: set[_Session] = set()
        self._gen: dict[SessionKey, int] = {}
        self._broken: dict[SessionKey, tuple[str, str, float]] = {}  # keys whose session failed to start
        self._reaper: asyncio.TimerHandle | None = None
        self.started = 0  # session processes started (first starts and restarts)

    def live(self) -> int:
        return len(self._live)

    async def run(self, ctx: TaskContext, key: SessionKey, prepare: Prepare) -> ExecOutcome:
        try:
            spec = msgspec.convert(ctx.config, TestConfig)
        except msgspec.ValidationError as exc:
            raise ExecutionError(f"test task config: {exc} (see docs/tasks.md)") from exc
        started = time.time()
        broken = self._broken.get(key)
        if broken is None:
            try:
                session, reused = await self._take(key, prepare, spec, ctx)
            except StartFailed as exc:  # the same for every task of the key: said once, not tried again
                broken = self._broken[key] = (str(exc), exc.tree, time.monotonic())
                self._arm_reaper()
        if broken is not None:
            return ExecOutcome("failed", output={"tree": broken[1]}, error=broken[0], started_at=started)
        session.tail.sink = ctx.output  # what the session writes for this task: its output stream
        keep = False
        lines: list[dict[str, Any]] = []
        errors: list[str] = []
        measured: list[dict[str, Any]] = []  # what coverage measured in the session for this task
        timeout = effective_timeout(spec.timeout_s, ctx.timeout_s)
        try:
            if spec.warm:  # started (or found) for the run's tests to come: nothing to run
                keep = session.alive()
                warmed: dict[str, Any] = {"tree": str(session.seen_root), "session": {
                    "reused": reused, "starts": session.starts, "warm": True}}
                if "python_env" in session.fields:
                    warmed["python_env"] = session.fields["python_env"]
                return ExecOutcome("succeeded", output=warmed, started_at=started)
            root = session.seen_root  # the tree as its pytest sees it, which the plugin maps back
            targets = self._targets(spec, ctx, session)
            assert session.proc is not None
            watch = MemoryWatch(session.proc.pid, ctx.max_memory_mb, self._poll_s) if ctx.max_memory_mb else None
            limited = await run_limited(self._serve(session, spec, ctx, targets, reused, lines, errors, measured),
                                        timeout_s=timeout, watch=watch)
            keep = limited.verdict == "done" and session.alive()
            summary = TestSummary(pytest_report.summarise(lines))
            output: dict[str, Any] = {**summary.as_output(), "exit_code": None, "tree": str(root),
                                      "stdout_tail": session.tail.text()[-2000:],
                                      "session": {"reused": reused, "starts": session.starts}}
            if watch is not None:
                output["peak_rss_mb"] = watch.peak_mb
            if measured:
                output["coverage"] = tree_coverage(measured, root)
            if "python_env" in session.fields:  # built (or found) for the session's first task; there for the rest
                env = session.fields["python_env"]
                output["python_env"] = {**env, "cached": True, "build_s": 0.0} if reused else env
            outcome = self._outcome(limited.verdict, summary, errors, timeout, watch)
            outcome.output.update(output)
            outcome.started_at, outcome.finished_at = started, time.time()
            if limited.verdict == "timed_out":
                await self.end(key)  # the run's sessions end with a task of it that timed out
            return outcome
        except asyncio.CancelledError:
            await self.end(key)  # cancelled: the run's cancel, the task's, or the worker stopping
            raise
        finally:
            session.tail.sink = None
            self._live.discard(session)
            if keep and session.gen == self._gen.get(key, 0):
                session.last_used = time.monotonic()
                self._idle.setdefault(key, []).append(session)
                self._live.add(session)
                self._arm_reaper()
            else:
                await asyncio.shield(session.close())

    def _targets(self, spec: TestConfig, ctx: TaskContext, session: _Session) -> list[str]:
        """The task's tests as its session's pytest takes them (paths relative to its working directory)."""
        for test in (spec.test_file, *spec.tests):
            if (bad := bad_test_file(test)) is not None:
                raise ExecutionError(bad)
        root = session.root
        refused = refused_test_args(spec.test_args, ctx.allow_test_options, root, bundle=True)
        if refused:
            raise ExecutionError("; ".join(refused))
        targets = resolve_test_paths(root, [spec.test_file, *spec.tests])
        return rebase_test_paths(targets, session.seen_root, session.seen(task_cwd(root, spec.cwd)))

    async def _take(self, key: SessionKey, prepare: Prepare, spec: TestConfig,
                    ctx: TaskContext) -> tuple[_Session, bool]:
        idle = self._idle.get(key) or []
        while idle:
            s = idle.pop()
            if s.alive():
                return s, True
            self._live.discard(s)
            await s.close()
        stack = contextlib.AsyncExitStack()
        began = time.monotonic()
        made: _Session | None = None  # its process may have started
        try:
            fields = await stack.enter_async_context(prepare())
            log.info("task %s: a session's tree, scratch and environment prepared in %.3f s", ctx.task_id,
                     time.monotonic() - began)
            s = made = _Session(key, fields, stack, self._gen.get(key, 0))
            s.initial = _initial(spec, s.root)
            self._live.add(s)
            await s.start(spec, ctx, self._env, self._extra)
            self.started += 1
        except BaseException:
            if made is not None:  # cancelled while it collected (a run's warm task at its end): its process ends too
                self._live.discard(made)
                await asyncio.shield(made.stop())
            await stack.aclose()
            raise
        return s, False

    async def _serve(self, s: _Session, spec: TestConfig, ctx: TaskContext, targets: list[str], reused: bool,
                     lines: list[dict[str, Any]], errors: list[str], measured: list[dict[str, Any]]) -> None:
        """Send the task's tests, collect their lines; restart the session after a crash."""
        maxfail = _maxfail(spec.test_args)
        begun = 0  # the task's items begun by sessions that then ended (skipped by the next one)
        running = -1  # the index of the item the current session last started
        retried = False
        ended = [0]  # lines before this index belong to tests already handed to ctx.reports

        def streamed() -> None:  # the tests that ended since: streamed while the task runs
            if ctx.reports is not None and len(lines) > ended[0]:
                for entry in pytest_report.summarise(lines[ended[0]:]):
                    if entry["reports"]:  # a test's, not a collector's
                        ctx.reports(str(s.seen_root), entry)
            ended[0] = len(lines)

        while True:
            n = s.served
            s.send({"task": n, "args": targets, "skip_first": begun, "maxfail": maxfail})
            running = -1
            current: dict[str, Any] | None = None
            collected = False
            while (line := await s.line()) is not None:
                kind = line.get("kind")
                if kind == "done" and line.get("task") == n:
                    streamed()
                    if isinstance(line.get("coverage"), dict):
                        measured.append(line["coverage"])
                    return
                if kind == "start":
                    nodeid = str(line.get("nodeid"))
                    index = line.get("index")
                    if index != running:  # the test before it ended: its reports are in (a rerun of
                        streamed()  # the same item by pytest-rerunfailures repeats its index)
                        running = index if isinstance(index, int) else running + 1
                    current = {"nodeid": nodeid, "location": line.get("location"), "setup": False,
                               "since": s.tail.total_bytes}
                elif kind == "collected":
                    collected = True
                elif kind == "error":
                    errors.append(str(line.get("message")))
                elif kind in ("report", "collect", "warning", "suite_property"):
                    lines.append(line)
                    data = line.get("data") or {}
                    if current is not None and data.get("nodeid") == current["nodeid"]:
                        if data.get("when") == "setup" and data.get("outcome") == "passed":
                            current["setup"] = True
                        elif data.get("when") == "teardown":
                            current = None
            how = _how(await s.stop(wait_s=_EXIT_WAIT_S))
            if current is None and not collected and reused and not retried:
                retried = True  # an idle session that died meanwhile: once more, in a new process
            elif current is None:
                tail = s.tail.text()[-_CRASH_TAIL_CHARS:]
                said = pytest_errors(tail)
                raise ExecutionError(f"the pytest session ended ({how}) before a test of this task ran"
                                     + (f": {said}\n{tail}" if said else f"; its last output:\n{tail}"))
            else:
                lines += _crash_lines(current, how, _gist(s.tail.text(since=current["since"])))
                streamed()
                log.warning("task %s: %s ended the pytest session (%s); restarting it for the rest",
                            ctx.task_id, current["nodeid"], how)
            begun += running + 1  # the crashed item too: it is reported failed, not run again
            s.tail = OutputTail(_TAIL_BYTES, sink=s.tail.sink)
            await s.start(spec, ctx, self._env, self._extra)
            self.started += 1

    @staticmethod
    def _outcome(verdict: str, summary: TestSummary, errors: list[str], timeout: float | None,
                 watch: MemoryWatch | None) -> ExecOutcome:
        if verdict == "timed_out":
            return ExecOutcome("timed_out", error=f"pytest timed out after {timeout:g} s; its session was killed")
        if verdict == "memory":
            assert watch is not None
            return ExecOutcome("failed", error=f"{watch.describe_exceeded()}; its pytest session was killed")
        if errors:  # as a pytest of its own would have ended (exit code 4), its reason after the head
            return ExecOutcome("failed", error="pytest usage error in its session:\n" + "\n".join(errors))
        if not summary.tests:
            return ExecOutcome("failed", error="no tests collected")
        if summary.count("failed") or summary.count("error"):
            return ExecOutcome("failed", error=failure_summary(summary))
        return ExecOutcome("succeeded")

    async def end(self, key: SessionKey) -> None:
        """End the sessions of ``key``: the idle ones now, the busy ones when their task ends."""
        self._gen[key] = self._gen.get(key, 0) + 1
        self._broken.pop(key, None)
        for s in self._idle.pop(key, []):
            self._live.discard(s)
            await asyncio.shield(s.close())

    def _arm_reaper(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().call_later(self.idle_s, self._reap)

    def _reap(self) -> None:
        self._reaper = None
        now = time.monotonic()
        for key, (_, _, when) in list(self._broken.items()):
            if now - when >= self.idle_s:
                del self._broken[key]
        for key, sessions in list(self._idle.items()):
            old = [s for s in sessions if now - s.last_used >= self.idle_s]
            for s in old:
                sessions.remove(s)
                self._live.discard(s)
                asyncio.ensure_future(s.close())
            if not sessions:
                self._idle.pop(key, None)
        if self._idle or self._broken:
            self._arm_reaper()

    async def close(self) -> None:
        """Kill every session (the worker stops). Idempotent."""
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        sessions, self._live, self._idle = list(self._live), set(), {}
        for s in sessions:
            with contextlib.suppress(Exception):
                await s.close()


def _initial(spec: TestConfig, root: Path) -> list[str]:
    """What a new session collects at start: ``collect`` (the run's paths), else the task's own
    tests; those not in the tree are left out (their tests are collected when asked for)."""
    out = []
    for test in spec.collect or [spec.test_file, *spec.tests]:
        if bad_test_file(test) is None:
            with contextlib.suppress(ExecutionError):
                out.append(resolve_test_path(root, test))
    return out


def _gist(text: str) -> str:
    """A crash's output for its report: its beginning (faulthandler's 'Fatal Python error' and the
    test's frames) and its end, :data:`_CRASH_TAIL_CHARS` at most."""
    if len(text) <= _CRASH_TAIL_CHARS:
        return text
    half = _CRASH_TAIL_CHARS // 2
    return f"{text[:half]}\n...\n{text[-half:]}"


def _how(code: int | None) -> str:
    """How a session's process ended; bwrap passes a child's death by signal N on as 128 + N."""
    if code is None:
        return "ended"
    if code > 128 and (name := signal_name(code - 128)) is not None:
        return f"{describe_exit(code)} (killed by {name} in its sandbox)"
    return describe_exit(code)


def _maxfail(args: list[str]) -> int:
    for a in args:
        if a.startswith("--maxfail="):
            with contextlib.suppress(ValueError):
                return int(a.partition("=")[2])
        if a in ("-x", "--exitfirst"):
            return 1
    return 0


def _crash_lines(current: dict[str, Any], how: str, tail: str) -> list[dict[str, Any]]:
    """Reports of the test that ended the session: failed where it was (setup or call)."""
    head = f"the pytest session running this test ended: {how}"
    text = f"{head}\n\nthe session's last output:\n{tail}\n{head}" if tail.strip() else head
    base = {"$report_type": "TestReport", "nodeid": current["nodeid"],
            "location": current["location"] or [current["nodeid"].partition("::")[0], None, current["nodeid"]],
            "keywords": {}, "user_properties": [], "sections": [], "duration": 0.0, "start": time.time(),
            "stop": time.time()}
    when = "call" if current["setup"] else "setup"
    return [{"kind": "report", "data": {**base, "when": when, "outcome": "failed", "longrepr": text}},
            {"kind": "report", "data": {**base, "when": "teardown", "outcome": "passed", "longrepr": None}}]


class ServingTestExecutor(TestExecutor):
    """The ``test`` kind's executor: :class:`.test.TestExecutor`, whose tasks a session serves
    where :func:`session_key` names one (``Runs`` asks ``session_key`` and calls ``serve``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sessions = SessionPool(self._env, self._extra, self._poll_s)

    async def close(self) -> None:
        """Kill the pytest runs in flight and every session. Idempotent."""
        await super().close()
        await self.sessions.close()

    def session_key(self, a: TaskAssignment) -> SessionKey | None:
        return session_key(a)

    async def serve(self, ctx: TaskContext, key: SessionKey, prepare: Prepare) -> ExecOutcome:
        """Run the task in a session of ``key``; ``prepare()`` (an async context manager) gives a
        new session its shipped fields (tree, scratch, sandbox, environment), held while it lives."""
        return await self.sessions.run(ctx, key, prepare)


def build(settings: ExecutorSettings) -> ServingTestExecutor:
    """The ``test`` kind's executor (``tasks.kinds``)."""
    return ServingTestExecutor(extra_env=settings.pytest_env, confinement=settings.confinement)
