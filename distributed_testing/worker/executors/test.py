"""The ``test`` task type: run real pytest on a file under the worker's test root.

Config: :class:`distributed_testing.tasks.configs.TestConfig` (``test_file``, ``test_args``,
``timeout_s``), validated at submit; ``run`` decodes the struct and does not validate again.
``test_file`` is relative to ``ctx.test_root`` (an absolute path must lie inside it) and may carry
a ``::node`` suffix. pytest runs as ``sys.executable -m pytest`` in its own process group with the
test root as cwd and rootdir; arguments are passed as a list, never through a shell.

A shipped run (a bundle task) loads the report writer and the marker from copies of their files
(:data:`STANDALONE_PLUGINS`: both import only the standard library and pytest) in a read-only
directory of the task's own on the child's ``PYTHONPATH``, so they load in a bundle's environment
that does not have this package (:mod:`..pyenv`), and nothing else of this package reaches the
child's path.

Every run disables this project's own pytest plugin (``-p no:distributed_testing``: with it, a
task's ``--dt-coordinator`` would make the worker submit the tests, with a key, to any URL; its
``dt`` marker stays registered through :mod:`distributed_testing.tasks.pytest_marker`) and
starts without the ``PYTEST_ADDOPTS`` and ``PYTEST_PLUGINS`` the worker inherited (options and
plugins the operator's shell meant for their own runs; ``extra_env`` may still set them). Other
installed plugins load as usual (the operator installs them for the tests under the root). The
worker's own options go before a ``--`` in ``test_args``, where pytest still reads them as options.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from distributed_testing.errors import ExecutionError
from distributed_testing.process.childenv import child_environ
from distributed_testing.process.taskfile import read_task_file
from distributed_testing.tasks.configs import TestConfig
from distributed_testing.tasks.pytest_args import (
    OWN_PLUGIN,
    bad_test_file,
    path_error,
    rebase_test_paths,
    refused_test_args,
)
from distributed_testing.worker import confine
from distributed_testing.worker.confine import Confinement
from distributed_testing.worker.core.output import MAX_OUTPUT_BYTES
from distributed_testing.worker.executors import pytest_report
from distributed_testing.worker.executors.base import ExecOutcome, ExecutorSettings, TaskContext, task_python
from distributed_testing.worker.executors.proc import (
    DEFAULT_TAIL_BYTES,
    OutputTail,
    describe_exit,
    finish_relay,
    kill_process_group,
)
from distributed_testing.worker.executors.supervise import (
    DEFAULT_POLL_INTERVAL_S,
    MemoryWatch,
    run_limited,
)
from distributed_testing.worker.sandbox import gpu_devices, gpu_environ, task_environ

logger = logging.getLogger(__name__)

INHERITED_PYTEST_VARIABLES = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")
MARKER_PLUGIN = "distributed_testing.tasks.pytest_marker"  # the plugin's `dt` marker, without the plugin
# a shipped run's names for the marker and the report writer: module name in the child -> ours
STANDALONE_PLUGINS = {"_dt_pytest_marker": MARKER_PLUGIN, "_dt_pytest_report": pytest_report.__name__,
                      "_dt_pytest_serve": "distributed_testing.worker.executors.pytest_serve"}
SHIPPED_PLUGINS = ("_dt_pytest_marker", "_dt_pytest_report")  # the marker and the report writer, as pytest_argv takes them
SERVE_PLUGIN = "_dt_pytest_serve"  # a session's (test_session.py)
PYTEST_EXIT = {
    2: "interrupted, e.g. by collection errors",
    3: "internal error",
    4: "usage error",
}
_ERROR_TAIL_CHARS = 2000
# A report read beyond this is refused: its output could not be sent anyway (worker/core/output.py)
# and the worker would hold all of it in memory.
MAX_REPORT_BYTES = 64 * 1024 * 1024
_DRAIN_GRACE_S = 2.0


def resolve_test_path(root: Path, test_file: str) -> str:
    """``test_file`` (optionally ``path::node``) as a path relative to ``root``.

    Raises ExecutionError if it resolves outside ``root`` (absolute paths, ``..``, symlinks) or
    does not exist.
    """
    return resolve_test_paths(root, [test_file])[0]


def resolve_test_paths(root: Path, tests: Sequence[str]) -> list[str]:
    """:func:`resolve_test_path` of each of ``tests``, each path resolved once (a task's tests are
    mostly node ids of a few files: resolving each id's path was a tenth of a session worker's CPU)."""
    try:
        root = root.resolve(strict=True)
    except (OSError, ValueError) as exc:
        raise ExecutionError(f"cannot resolve the test root {root}: {exc}") from exc
    placed: dict[str, str] = {}
    out = []
    for test_file in tests:
        path_part, sep, node_part = test_file.partition("::")
        if (rel := placed.get(path_part)) is None:
            try:
                candidate = (root / path_part).resolve()
            except (OSError, ValueError) as exc:
                raise ExecutionError(f"cannot resolve test_file {test_file!r} under test root {root}: {exc}") from exc
            if not candidate.is_relative_to(root):
                raise ExecutionError(f"test_file {test_file!r} resolves to {candidate}, outside the test root {root}")
            if not candidate.exists():
                raise ExecutionError(f"test_file {test_file!r} not found under the test root {root}")
            rel = placed[path_part] = candidate.relative_to(root).as_posix() or "."
        out.append(rel + sep + node_part)
    return out


def effective_timeout(*timeouts: float | None) -> float | None:
    given = [t for t in timeouts if t is not None]
    return min(given) if given else None


class TestExecutor:
    """Runs pytest in a child process per task; see the module docstring for the config.

    ``extra_env`` is merged over the inherited environment of every pytest child (for example
    ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``), from which the worker's credentials are removed
    (:mod:`distributed_testing.process.childenv`). ``test_args`` are checked first
    (:mod:`distributed_testing.tasks.pytest_args`). ``memory_poll_interval_s`` is how often the process
    tree's RSS is sampled when ``ctx.max_memory_mb`` is set. With ``confinement`` a task without
    a bundle runs pytest in it (:mod:`distributed_testing.worker.confine`), in a scratch directory
    of its own that is removed afterwards, with the GPU device nodes bound in (without them CUDA is
    unavailable there and an operator's GPU tests would skip).
    """

    __test__ = False  # not a pytest test class
    task_type = "test"

    def __init__(
        self,
        *,
        extra_env: Mapping[str, str] | None = None,
        memory_poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        tail_bytes: int = DEFAULT_TAIL_BYTES,
        confinement: Confinement | None = None,
    ) -> None:
        self._confine = confinement  # the operator's tests run in it (worker/confine.py); None: unconfined
        self._env = child_environ(extra_env, drop=INHERITED_PYTEST_VARIABLES)  # nor the worker's credentials
        self._extra = dict(extra_env or {})  # all a sandboxed child gets beyond the minimum
        self._poll_s = memory_poll_interval_s
        self._tail_bytes = tail_bytes
        self._running: set[int] = set()

    async def start(self) -> None:
        """Nothing to prepare: each task starts its own pytest process."""

    async def close(self) -> None:
        """Kill the process groups of pytest runs still in flight. Idempotent."""
        for pgid in list(self._running):
            kill_process_group(pgid)

    async def run(self, ctx: TaskContext) -> ExecOutcome:
        """Run the task's pytest; see :mod:`..base` for how outcomes and errors are reported."""
        try:  # validated at submit; only a caller that bypassed the coordinator gets here with a bad one
            spec = msgspec.convert(ctx.config, TestConfig)
        except msgspec.ValidationError as exc:
            raise ExecutionError(f"test task config: {exc} (see docs/tasks.md)") from exc
        if spec.warm:  # a task that starts a run's pytest session (test_session.py): none here
            return ExecOutcome("succeeded", output={"warm": "no pytest session to start: a task without a bundle "
                                                            "or a session runs a pytest of its own"})
        root = (ctx.bundle_root or ctx.test_root).resolve()  # a bundle's tree replaces the test root
        if (bad := bad_test_file(spec.test_file)) is not None:
            raise ExecutionError(bad)
        target = resolve_test_path(root, spec.test_file)
        refused = refused_test_args(spec.test_args, ctx.allow_test_options, root, bundle=ctx.bundle_root is not None)
        if refused:
            raise ExecutionError("; ".join(refused))
        cwd = task_cwd(root, spec.cwd)
        timeout = effective_timeout(spec.timeout_s, ctx.timeout_s)
        started = time.time()
        shipped = ctx.sandbox is not None and ctx.scratch_dir is not None
        own = self._confine.scratch(ctx.task_id) if self._confine is not None and not shipped else None
        try:
            with tempfile.TemporaryDirectory(prefix="dt-pytest-", dir=ctx.scratch_dir or own or ctx.work_dir) as tmp:
                report_path = Path(tmp) / "report.jsonl"
                python, env_dirs = task_python(ctx)
                plugins = (await asyncio.to_thread(standalone_plugins, ctx.scratch_dir.parent / "pytest-plugins")
                           if shipped and ctx.scratch_dir is not None else None)  # outside the writable binds
                argv = pytest_argv(target, root, spec.test_args, report_path, python,
                                   SHIPPED_PLUGINS if plugins else (MARKER_PLUGIN, pytest_report.__name__),
                                   cwd=cwd, cache_dir=Path(tmp) / "pytest-cache")
                logger.info("task %s: running pytest on %d argument(s) (cwd %s, timeout %s)",
                            ctx.task_id, len(spec.test_args) + 1, cwd, timeout)
                if shipped:  # shipped code: the bundle sandbox's allow-list
                    assert ctx.scratch_dir is not None
                    env = started_as(spec, task_environ({**gpu_environ(self._env), **self._extra, **spec.env},
                                                        ctx.scratch_dir, ctx.python))
                    assert plugins is not None
                    env_dirs = [*env_dirs, plugins]
                    env["PYTHONPATH"] = os.pathsep.join([str(plugins), *filter(None, [env.get("PYTHONPATH")])])
                    argv = ctx.sandbox.wrap(argv, ro=env_dirs, rw=[root, ctx.scratch_dir], cwd=cwd, env=env,
                                            devices=gpu_devices(),  # its GPU tests, as the operator's
                                            shm_mb=ctx.max_memory_mb, scratch=ctx.scratch_dir)
                else:
                    env = started_as(spec, self._env)
                    if own is not None and self._confine is not None:  # the operator's tests: the deny-list
                        env = self._confine.environ(env, own)
                        argv = self._confine.wrap(argv, rw=[own], cwd=cwd, devices=gpu_devices())  # GPU tests
                verdict, code, tail, watch = await self._run_pytest(argv, cwd, timeout, ctx.max_memory_mb, env,
                                                                    ctx.output)
                # the child owned tmp: read its report as a task's file (no link, no FIFO, bounded)
                summary = await asyncio.to_thread(_read_summary, report_path, Path(tmp).parent)
        finally:
            if own is not None:
                await asyncio.to_thread(confine.remove, own)
        # tree: the root as pytest saw it, which the plugin maps back to the submitter's paths
        seen = ctx.sandbox.seen(root, ctx.scratch_dir) if shipped and ctx.sandbox is not None else root
        output: dict[str, Any] = {**summary.as_output(), "exit_code": code, "stdout_tail": tail.text(), "tree": str(seen)}
        if watch is not None:
            output["peak_rss_mb"] = watch.peak_mb
        outcome = _outcome(verdict, code, summary, tail, timeout, watch)
        outcome.output.update(output)
        outcome.started_at = started
        outcome.finished_at = time.time()
        return outcome

    async def _run_pytest(
        self, argv: list[str], cwd: Path, timeout: float | None, max_memory_mb: int | None, env: Mapping[str, str],
        output: Callable[[bytes], None] | None = None,
    ) -> tuple[str, int | None, OutputTail, MemoryWatch | None]:
        """Start pytest, enforce limits, and always kill its group and reap it before returning;
        what it writes (its terminal report, the tests' stdout and stderr) also goes to ``output``."""
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            env=dict(env),
        )
        assert proc.stdout is not None
        self._running.add(proc.pid)
        tail = OutputTail(self._tail_bytes, sink=output)
        drain = asyncio.create_task(tail.drain(proc.stdout))
        watch = MemoryWatch(proc.pid, max_memory_mb, self._poll_s) if max_memory_mb else None
        try:
            limited = await run_limited(proc.wait(), timeout_s=timeout, watch=watch)
        finally:
            kill_process_group(proc.pid)  # the run itself on a limit or cancel; strays otherwise
            self._running.discard(proc.pid)
            code = await proc.wait()
            await finish_relay(drain, f"pytest {proc.pid}", _DRAIN_GRACE_S)
        return limited.verdict, (code if limited.verdict == "done" else None), tail, watch


def pytest_argv(target: str, root: Path, test_args: list[str], report_path: Path | str,
                python: str = sys.executable,
                plugins: Sequence[str] = (MARKER_PLUGIN, pytest_report.__name__), *,
                cwd: Path | None = None, cache_dir: Path | None = None) -> list[str]:
    """The pytest command line: the root first (an allowed ``--rootdir`` overrides it) and ``-q``
    (a task's ``--verbosity`` overrides it), then the task's options, then the worker's (so they
    win), all before a ``--`` in ``test_args`` (after which pytest takes every token for a path).
    ``python`` runs it (a bundle's environment's); ``plugins`` are the module names of the marker
    and the report writer it loads. Paths in ``target`` and ``test_args``, relative to ``root``,
    are made relative to ``cwd`` (default ``root``), where pytest runs. ``cache_dir``: the task's
    own directory for pytest's cache (``-o cache_dir``, over the ini's: the ``cache`` fixture works
    as it does locally, and nothing is written into the tree or outside the task's places),
    unless ``test_args`` turn the cache off; None: no cache (``-p no:cacheprovider``)."""
    marker, report = plugins
    cached = cache_dir is not None and not _no_cache(test_args)
    cache = ["-o", f"cache_dir={cache_dir}"] if cached else ["-p", "no:cacheprovider"]
    ours = [*cache, "-p", f"no:{OWN_PLUGIN}", "-p", marker,
            "-p", report, f"{pytest_report.REPORT_OPTION}={report_path}"]
    args = rebase_test_paths([target, *test_args], root, cwd or root)
    target, test_args = args[0], args[1:]
    cut = test_args.index("--") if "--" in test_args else len(test_args)
    return [python, "-m", "pytest", target, f"--rootdir={root}", "-q", *test_args[:cut], *ours, *test_args[cut:]]


def _no_cache(test_args: Sequence[str]) -> bool:
    """Whether ``test_args`` turn pytest's cache off (``-p no:cacheprovider``, as pytest's
    pre-parse reads ``-p``): then an ``-o cache_dir`` would name an option no plugin knows."""
    args = list(test_args)
    return any(a == "-pno:cacheprovider" or (a == "-p" and args[i + 1:i + 2] == ["no:cacheprovider"])
               for i, a in enumerate(args))


def task_cwd(root: Path, cwd: str | None) -> Path:
    """Where a task's pytest runs: ``cwd`` under ``root``, or ``root`` when it is None or the tree
    lacks it (a directory of the submitter's that held no shipped file). Raises ExecutionError
    for one that leaves ``root``."""
    if cwd is None:
        return root
    if (bad := path_error(root, cwd, "cwd")) is not None:
        raise ExecutionError(bad)
    found = (root / cwd).resolve()
    return found if found.is_dir() else root


def started_as(spec: TestConfig, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for the task's pytest, started as the submitter's was: ``safe_path`` (the ``pytest``
    command, or ``-P``) keeps its working directory off the front of ``sys.path``."""
    return {**env, "PYTHONSAFEPATH": "1"} if spec.safe_path else dict(env)


def standalone_plugins(dest: Path) -> Path:
    """``dest``, made to hold a copy of each of :data:`STANDALONE_PLUGINS` under its name in the
    child (top-level modules that need neither this package nor its dependencies)."""
    dest.mkdir(exist_ok=True)
    for name, module in STANDALONE_PLUGINS.items():
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        shutil.copyfile(spec.origin, dest / f"{name}.py")
    return dest


class TestSummary:
    """The per-test entries of one pytest run (:func:`pytest_report.summarise`) and their counts."""

    __test__ = False  # not a pytest test class

    def __init__(self, tests: list[dict[str, Any]]) -> None:
        self.tests = tests

    def count(self, outcome: str) -> int:
        return sum(1 for t in self.tests if t["outcome"] == outcome)

    def as_output(self) -> dict[str, Any]:
        """The counts and tests as the ``test`` task's output fields; where the tests' reports would
        not fit a result (:func:`fit_reports`), trimmed until they do, with ``reports_trimmed``
        saying what was left out."""
        trimmed = fit_reports(self.tests, REPORTS_BUDGET_BYTES)
        return {"passed": self.count("passed"), "failed": self.count("failed"), "skipped": self.count("skipped"),
                "xfailed": self.count("xfailed"), "errors": self.count("error"), "total": len(self.tests),
                "duration_s": round(sum(t["duration_s"] for t in self.tests), 6), "tests": self.tests,
                **({"reports_trimmed": trimmed} if trimmed else {})}


# What one task's tests may take of a result (output.MAX_OUTPUT_BYTES, 8 MiB), less room for the
# output's other fields (the stdout tail, the error text).
REPORTS_BUDGET_BYTES = MAX_OUTPUT_BYTES - 256 * 1024
# Each pass of fit_reports: what it leaves out, and the characters a captured section or a
# traceback keeps (None: the section goes; 0: a traceback keeps only its crash line).
_TRIM_PASSES: tuple[tuple[str, int | None, int | None], ...] = (
    ("the captured output of tests that passed", None, None),
    ("captured output and tracebacks beyond their last 2,000 characters", 2000, 2000),
    ("captured output and tracebacks beyond their last 200 characters", 200, 200),
    ("all captured output, and tracebacks beyond their crash line", 0, 0),
)


def fit_reports(tests: list[dict[str, Any]], budget: int) -> str | None:
    """Trim ``tests`` (:func:`pytest_report.summarise`'s entries) in place until they encode to at
    most ``budget`` bytes, so that every test's outcome reaches the submitter even when the whole
    would be refused as too large (a chunk of a few thousand tests that all fail with a long
    traceback: every one of them was otherwise reported as an error of the task, not as its own
    failure). Passes, cheapest loss first: the captured output of passing tests, then every
    captured section and traceback cut to its last 2,000 characters, then to 200, then sections
    gone and tracebacks reduced to their crash line. The outcome, node id, duration, crash message
    and location of every test stay. Returns what was left out (None: nothing, it fitted)."""
    if _encoded_size(tests) <= budget:
        return None
    done = ""
    for what, section_chars, longrepr_chars in _TRIM_PASSES:
        for entry in tests:
            if section_chars is None and entry["outcome"] != "passed":
                continue
            for report in entry["reports"]:
                _trim_report(report, section_chars or 0, longrepr_chars, entry.get("message"))
            if longrepr_chars is not None and isinstance(entry.get("longrepr"), str):
                entry["longrepr"] = _tail(entry["longrepr"], longrepr_chars) or entry.get("message")
        done = what
        if _encoded_size(tests) <= budget:
            break
    return f"the tests' reports did not fit one result ({budget:,} bytes): left out {done}" + (
        "" if done == _TRIM_PASSES[0][0] else " (and every pass before it)")


def _trim_report(report: dict[str, Any], section_chars: int, longrepr_chars: int | None, message: str | None) -> None:
    """One serialized report with its sections and its longrepr cut (:func:`fit_reports`); a cut
    longrepr becomes plain text, which the submitter's pytest prints as it is."""
    report["sections"] = [[name, _tail(str(text), section_chars)] for name, text in report.get("sections") or []
                          if section_chars]
    longrepr = report.get("longrepr")
    if longrepr_chars is None or longrepr is None or (isinstance(longrepr, list) and len(longrepr) == 3):
        return  # nothing to cut, or a skip's (path, line, reason)
    if longrepr_chars == 0:  # its crash line: the test's message once an earlier pass made it text
        crash = pytest_report.crash_message(longrepr) if isinstance(longrepr, dict) else message
        report["longrepr"] = crash if crash is not None else _tail(str(longrepr), 200)
    else:
        report["longrepr"] = _tail(pytest_report.longrepr_text(longrepr) or str(longrepr), longrepr_chars)


def _tail(text: str, chars: int) -> str:
    return text if len(text) <= chars else "...\n" + text[-chars:] if chars else ""


def _encoded_size(value: Any) -> int:
    try:
        return len(msgspec.msgpack.encode(value))
    except (OverflowError, TypeError, ValueError, RecursionError):
        return 0  # what cannot be encoded is refused by core.output.bound, whole


def _read_summary(path: Path, under: Path) -> TestSummary:
    """The summary of the report at ``path`` (none where pytest wrote none), read as a file the
    task could have replaced (:func:`~distributed_testing.process.taskfile.read_task_file`)."""
    try:
        data = read_task_file(path, under=under, limit=MAX_REPORT_BYTES)
    except FileNotFoundError:
        return TestSummary([])
    except OSError as exc:
        raise ExecutionError(f"cannot read pytest's report {path}: {exc}") from exc
    return TestSummary(pytest_report.summarise(pytest_report.parse_lines(data.decode("utf-8", errors="replace"))))


def _outcome(
    verdict: str,
    code: int | None,
    summary: TestSummary,
    tail: OutputTail,
    timeout: float | None,
    watch: MemoryWatch | None,
) -> ExecOutcome:
    """Map how pytest ended to a status and error message."""
    if verdict == "timed_out":
        return ExecOutcome("timed_out", error=f"pytest timed out after {timeout:g} s; its process group was killed")
    if verdict == "memory":
        assert watch is not None
        return ExecOutcome("failed", error=f"{watch.describe_exceeded()}; pytest's process group was killed")
    assert code is not None
    if code == 0:
        return ExecOutcome("succeeded")
    if code == 1:
        return ExecOutcome("failed", error=failure_summary(summary))
    if code == 5:
        return ExecOutcome("failed", error="no tests collected")
    meaning = PYTEST_EXIT.get(code)
    head = f"pytest exit code {code} ({meaning})" if meaning else f"pytest {describe_exit(code)}"
    text = tail.text()
    said = pytest_errors(text)  # first: the reason, where warnings printed after it would bury it
    return ExecOutcome("failed", error=f"{head}: {said}\n{text[-_ERROR_TAIL_CHARS:]}" if said
                       else f"{head}:\n{text[-_ERROR_TAIL_CHARS:]}")


# "ERROR: <usage error>" and the short summary's "ERROR <nodeid> - <reason>"; not a log record's
# "ERROR    root:x.py:3 message" (live or captured logging)
_PYTEST_ERROR = re.compile(r"ERROR(?:: | \S+ - )")


def pytest_errors(text: str, most: int = 5) -> str:
    """pytest's own error lines in its output (``ERROR: file or directory not found: x``, a
    collection error's ``ERROR x.py - ImportError: ...``), joined with ``; ``."""
    lines = [line.strip() for line in text.splitlines() if _PYTEST_ERROR.match(line)]
    return "; ".join(dict.fromkeys(lines[:most]))


def failure_summary(summary: TestSummary) -> str:
    total, failed, errors = len(summary.tests), summary.count("failed"), summary.count("error")
    if failed == 0 and errors == 0:
        return "pytest reported failures (exit code 1) but its report lists none"
    if failed == 0:
        return f"{errors} of {total} tests errored"
    text = f"{failed} of {total} tests failed"
    return f"{text}; {errors} errored" if errors else text


def build(settings: ExecutorSettings) -> TestExecutor:
    """A ``test`` executor without sessions (the kind's, ``tasks.kinds``, is :func:`.test_session.build`)."""
    return TestExecutor(extra_env=settings.pytest_env, confinement=settings.confinement)
