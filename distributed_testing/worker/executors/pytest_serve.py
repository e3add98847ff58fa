"""A pytest plugin that makes one pytest process a session serving many test tasks of one run
(``-p`` this module, ``--dt-serve=FD``; :mod:`.test_session` starts it). Like
:mod:`.pytest_report` it imports only the standard library and pytest, so a shipped run loads a
copy of it in an environment without this package.

It reads commands from descriptor FD, one JSON line each. The first, ``{"collect": [paths]}``,
has it collect the run's paths once, before any test runs, as plain pytest does (an argument
whose conftest fails to import, or that pytest refuses, is left for later), then say ``{"kind":
"ready"}``. Each other, ``{"task": N, "args": [test paths or node ids], "skip_first": S,
"maxfail": K}``, takes the items of ``args`` from that collection (an argument it did not
collect is collected then; a node id takes every item it names, as pytest's own argument does:
a conftest's items may share one), leaves out the first ``S`` of them (those a crashed session
already began: the same arguments collect the same items in the same order), and runs the rest
in order, stopping after ``K`` failures (0: never). What it says goes through
the report writer (:mod:`.pytest_report`, ``--dt-report=fd:M``), in its lines:
``{"kind": "collected", "task": N, "nodeids": [...]}`` after collecting, ``{"kind": "start",
"nodeid", "location", "index"}`` before each test (so a test that ends the process is known;
``index``: its place among the command's items after the skipped ones, which a rerun of it by
pytest-rerunfailures repeats), the writer's
own report, collect and warning lines as they happen, then ``{"kind": "done", "task": N}``; a
command argument pytest refuses (a path not found) gets ``{"kind": "error", "task": N,
"message"}`` (the others run). Every command ends with all fixtures torn down (the last test of
a command runs with no next item), so a command's tests see what they would see in a pytest of
their own, and the process never holds a fixture between tasks. The end of FD's input ends the
session. Where coverage measures this process (pytest-cov's ``--cov``, which the plugin passes on
from the local run), ``done`` carries ``coverage``: what was measured since the previous command
ended (:class:`_CoverageDelta`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

import pytest
from _pytest.config import ConftestImportFailure

SERVE_OPTION = "--dt-serve"
WRITER_NAME = "distributed_testing-report"  # pytest_report.WRITER_NAME (this module imports neither)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(SERVE_OPTION, metavar="FD", type=int, default=None,
                     help="serve test commands read from descriptor FD (distributed_testing's test sessions)")


def pytest_configure(config: pytest.Config) -> None:
    fd = config.getoption(SERVE_OPTION)
    if fd is not None:
        config.pluginmanager.register(_Server(config, fd), "distributed_testing-serve")


class _Server:
    def __init__(self, config: pytest.Config, fd: int) -> None:
        self.config = config
        self.fd = fd
        self.index: dict[tuple[str, str], list[pytest.Item]] = {}  # what it collected at start (a node id
        # may name several items: a conftest's own, --keep-duplicates)
        self.by_path: dict[str, list[pytest.Item]] = {}  # the same, by file
        self.configured = time.time()  # the process started, pytest and the plugins imported, conftests loaded
        self.coverage = _CoverageDelta()
        self.running = -1  # the index of the item running among the current command's (start lines)

    def _write(self, line: dict[str, Any]) -> None:
        writer = self.config.pluginmanager.get_plugin(WRITER_NAME)
        if writer is None:
            raise pytest.UsageError(f"{SERVE_OPTION} needs the report writer (--dt-report)")
        writer.write(line)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> None:
        """The first command says what to collect: pytest's own collection of its arguments (its
        ``pytest_collection``, the hook's last, calls ``session.perform_collect()``) collects
        nothing. The hook's other implementations still run: returning a result here ended the
        hook before them (pytest-cases installs its fixture closure there, so a session collected
        other parametrizations and ids than the submitter's pytest; pytest's assertion rewriting
        takes the session there)."""
        collect = session.perform_collect

        def nothing_yet(args: Any = None, genitems: bool = True) -> Any:
            if args is not None:
                return collect(args, genitems)
            del session.perform_collect  # the class's again, for the commands
            return []

        session.perform_collect = nothing_yet  # type: ignore[method-assign]

    def _collect_all(self, session: pytest.Session, args: list[str]) -> None:
        """Collect the run's paths once, before any test runs, as plain pytest does; an argument
        pytest refuses, or whose conftest fails to import, leaves the others collected (its
        tests are collected when asked for, and fail there as they would alone)."""
        started = time.time()
        items, _ = self._collect(session, None, args)
        for item in items:
            key = _key(item.path, item.nodeid)
            self.index.setdefault(key, []).append(item)
            self.by_path.setdefault(key[0], []).append(item)
        self._write({"kind": "ready", "collected": len(self.index), "configured": self.configured,
                     "collect_s": round(time.time() - started, 3)})

    def _collect(self, session: pytest.Session, task: Any, args: list[str]) -> tuple[list[pytest.Item], list[str]]:
        """Collect ``args`` (one at a time where one is refused); the items and pytest's refusals."""
        args = [a for a in args if self._conftests_load(task, a)]
        items: list[pytest.Item] = []
        refused: list[str] = []
        try:
            items = list(session.perform_collect(args))
            args = []
        except pytest.UsageError:  # one of them is not there: the others still run
            pass
        for arg in args:  # outside the handler: a collection error must not carry the UsageError
            try:
                items += session.perform_collect([arg])
            except pytest.UsageError as exc:
                refused.append("\n".join(map(str, exc.args)))
        return items, refused

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self._write({"kind": "start", "nodeid": nodeid, "location": list(location), "index": self.running})

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        with open(self.fd, encoding="utf-8") as commands:
            for raw in commands:
                cmd = json.loads(raw) if raw.strip() else None
                if isinstance(cmd, dict) and "collect" in cmd:
                    self._collect_all(session, [str(a) for a in cmd["collect"]])
                elif isinstance(cmd, dict):
                    self._serve(session, cmd)
        return True

    def _conftests_load(self, task: Any, arg: str) -> bool:  # task None: the first collection's
        """Load the conftests of ``arg``'s directories as a pytest started on it would, before it
        collects: one that fails to import is an error of the command, worded as pytest's own at
        start (``ImportError while loading conftest ...``), and ``arg`` is not collected."""
        config = self.config
        path = config.invocation_params.dir / arg.partition("::")[0]
        try:
            config.pluginmanager._loadconftestmodules(
                path if path.is_dir() else path.parent, config.getoption("importmode"), config.rootpath,
                consider_namespace_packages=bool(config.getini("consider_namespace_packages")))
        except ConftestImportFailure as exc:
            cause = exc.cause
            shown = pytest.ExceptionInfo.from_exception(cause).getrepr(style="short", chain=False)
            self._write({"kind": "error", "task": task,
                         "message": f"ImportError while loading conftest '{exc.path}'.\n{shown}"})
            return False
        except (AttributeError, TypeError):  # another pytest's private API: collection will load them
            pass
        return True

    def _collected(self, args: list[str]) -> tuple[list[pytest.Item], list[str]]:
        """The items of ``args`` (node ids, or module paths) the session collected at start, and
        the arguments it did not (collected on demand). A node id selects every item it names, as
        pytest's own argument does (an argument given twice, once)."""
        here = self.config.invocation_params.dir
        found: list[pytest.Item] = []
        missing: list[str] = []
        for arg in dict.fromkeys(args):
            part, sep, rest = arg.partition("::")
            path = str((here / part).resolve())
            named = self.index.get((path, rest)) if sep else None
            if named:
                found += named
            elif not sep and path in self.by_path:
                found += self.by_path[path]
            else:
                missing.append(arg)
        return found, missing

    def _serve(self, session: pytest.Session, cmd: dict[str, Any]) -> None:
        task = cmd.get("task")
        session.testsfailed = 0  # before collecting: pytest's collection ends a stopped session
        _unstop(session)
        self.config.option.maxfail = int(cmd.get("maxfail") or 0)  # read by pytest's Session per report
        ready, wanted = self._collected([str(a) for a in cmd.get("args") or []])
        items, refused = self._collect(session, task, wanted) if wanted else ([], [])
        for message in refused:
            self._write({"kind": "error", "task": task, "message": message})
        items = (ready + items)[int(cmd.get("skip_first") or 0):]
        self._write({"kind": "collected", "task": task, "nodeids": [i.nodeid for i in items]})
        try:
            for n, item in enumerate(items):
                self.running = n
                nextitem = items[n + 1] if n + 1 < len(items) else None
                item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
                if session.shouldfail or session.shouldstop:
                    break
        finally:
            with contextlib.suppress(Exception):  # after a stop: what the last test left set up
                session._setupstate.teardown_exact(None)
            done: dict[str, Any] = {"kind": "done", "task": task, "pid": os.getpid()}
            measured = self.coverage.since()
            if measured is not None:
                done["coverage"] = measured
            self._write(done)


def _key(path: Any, nodeid: str) -> tuple[str, str]:
    """An item's key: its file, resolved, and the part of its node id after the file's."""
    return str(path.resolve()), nodeid.partition("::")[2]


class _CoverageDelta:
    """What coverage measured in this process since the last call, where something measures it
    (``coverage.Coverage.current()``: pytest-cov's central controller starts one before the
    conftests load): ``{"arcs": bool, "files": {absolute path: [[start, end], ...] line runs, or
    [[from, to], ...] arcs}, "sites": [site-packages folders]}``; None where nothing measures. A
    file with nothing new is left out, except the first time (a source file never imported is
    reported at 0 %)."""

    def __init__(self) -> None:
        self.sent: dict[str, set[Any]] = {}

    def since(self) -> dict[str, Any] | None:
        import sys

        module = sys.modules.get("coverage")
        current = getattr(getattr(module, "Coverage", None), "current", None)
        cov = current() if callable(current) else None
        if cov is None:
            return None
        try:
            data = cov.get_data()  # moves what the tracer holds into the data; measuring goes on
            arcs = bool(data.has_arcs())
            files: dict[str, Any] = {}
            for path in data.measured_files():
                now = set((data.arcs(path) if arcs else data.lines(path)) or ())
                seen = self.sent.get(path)
                new = now - seen if seen is not None else now
                if seen is not None and not new:
                    continue
                self.sent.setdefault(path, set()).update(new)
                files[path] = [list(a) for a in sorted(new)] if arcs else _runs(sorted(new))
        except Exception as exc:  # coverage's own failure: the tests' outcomes stand; say why
            return {"error": f"{type(exc).__name__}: {exc}"}
        import sysconfig

        sites = sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})
        return {"arcs": arcs, "files": files, "sites": sites}


def _runs(lines: list[int]) -> list[list[int]]:
    """Sorted line numbers as ``[first, last]`` runs: a covered block is one pair."""
    out: list[list[int]] = []
    for n in lines:
        if out and out[-1][1] == n - 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return out


def _unstop(session: pytest.Session) -> None:
    """A new command starts unstopped, whatever stopped the previous one (``--maxfail``, ``-x``).
    pytest 8+ ignores setting ``shouldfail`` / ``shouldstop`` back to False once set (its own loop
    never goes on after a stop), so its private fields are reset where they exist."""
    for name in ("shouldfail", "shouldstop"):
        if hasattr(session, f"_{name}"):
            setattr(session, f"_{name}", False)
        else:
            setattr(session, name, False)
