"""A pytest plugin that makes one pytest process a session serving many test tasks of one run
(``-p`` this module, ``--dt-serve=FD``; :mod:`.test_session` starts it). Like
:mod:`.pytest_report` it imports only the standard library and pytest, so a shipped run loads a
copy of it in an environment without this package.

At start it collects nothing. It then reads commands from descriptor FD, one JSON line each:
``{"task": N, "args": [test paths or node ids], "skip": [node ids], "maxfail": K}``. For each it
collects ``args`` (a module imported by an earlier command stays imported, as its conftests and
session-scoped state do), leaves out the items of ``skip`` (those a crashed session already ran),
and runs the rest in order, stopping after ``K`` failures (0: never). What it says goes through
the report writer (:mod:`.pytest_report`, ``--dt-report=fd:M``), in its lines:
``{"kind": "collected", "task": N, "nodeids": [...]}`` after collecting, ``{"kind": "start",
"nodeid", "location"}`` before each test (so a test that ends the process is known), the writer's
own report, collect and warning lines as they happen, then ``{"kind": "done", "task": N}``; a
command argument pytest refuses (a path not found) gets ``{"kind": "error", "task": N,
"message"}`` (the others run). Every command ends with all fixtures torn down (the last test of
a command runs with no next item), so a command's tests see what they would see in a pytest of
their own, and the process never holds a fixture between tasks. The end of FD's input ends the
session.
"""

from __future__ import annotations

import contextlib
import json
import os
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

    def _write(self, line: dict[str, Any]) -> None:
        writer = self.config.pluginmanager.get_plugin(WRITER_NAME)
        if writer is None:
            raise pytest.UsageError(f"{SERVE_OPTION} needs the report writer (--dt-report)")
        writer.write(line)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> bool:
        return True  # each command collects its own tests

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self._write({"kind": "start", "nodeid": nodeid, "location": list(location)})

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        with open(self.fd, encoding="utf-8") as commands:
            for raw in commands:
                if raw.strip():
                    self._serve(session, json.loads(raw))
        return True

    def _conftests_load(self, task: Any, arg: str) -> bool:
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

    def _serve(self, session: pytest.Session, cmd: dict[str, Any]) -> None:
        task = cmd.get("task")
        args = [a for a in map(str, cmd.get("args") or []) if self._conftests_load(task, a)]
        items: list[pytest.Item] = []
        try:
            items = list(session.perform_collect(args))
            args = []
        except pytest.UsageError:  # one of them is not there: the others still run
            pass
        for arg in args:  # outside the handler: a collection error must not carry the UsageError
            try:
                items += session.perform_collect([arg])
            except pytest.UsageError as exc:
                self._write({"kind": "error", "task": task, "message": "\n".join(map(str, exc.args))})
        skip = set(cmd.get("skip") or ())
        items = [i for i in items if i.nodeid not in skip]
        self._write({"kind": "collected", "task": task, "nodeids": [i.nodeid for i in items]})
        session.testsfailed = 0
        session.shouldfail = session.shouldstop = False
        self.config.option.maxfail = int(cmd.get("maxfail") or 0)  # read by pytest's Session per report
        try:
            for n, item in enumerate(items):
                nextitem = items[n + 1] if n + 1 < len(items) else None
                item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
                if session.shouldfail or session.shouldstop:
                    break
        finally:
            with contextlib.suppress(Exception):  # after a stop: what the last test left set up
                session._setupstate.teardown_exact(None)
            self._write({"kind": "done", "task": task, "pid": os.getpid()})
