"""Pytest sessions that serve a run (worker/executors/test_session.py), with real pytest processes
in the bundle sandbox (bwrap where it works here): one session collects once for the tasks of its
run, never serves another run's, dies with its run (cancel, timeout, the worker stopping, idle),
and a test that ends the process is that test's failure while the task goes on."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from executor_support import run, wait_until

from distributed_testing.protocol.messages import TaskAssignment
from distributed_testing.worker import sandbox as sb
from distributed_testing.worker.executors import TaskContext
from distributed_testing.worker.executors.proc import pid_alive
from distributed_testing.worker.executors.test_session import (
    ServingTestExecutor,
    SessionKey,
    SessionPool,
    session_key,
)

pytestmark = pytest.mark.timeout(120)
FAST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # third-party plugins cost ~1.5 s a start

CONFTEST = """
    import os, uuid

    # one line per session process that imported this conftest: collection happens once per session;
    # a token, not the pid (each sandbox has its own PID namespace)
    os.environ["SESSION_TOKEN"] = uuid.uuid4().hex
    with open(os.path.join(os.path.dirname(__file__), "sessions.log"), "a") as f:
        f.write(os.environ["SESSION_TOKEN"] + "\\n")
"""
TESTS = """
    import ctypes, os, time

    def _ran(name):
        with open(os.path.join(os.path.dirname(__file__), "ran.log"), "a") as f:
            f.write(f"{name} {os.environ['SESSION_TOKEN']}\\n")

    def test_a():
        _ran("a")

    def test_b():
        _ran("b")

    def test_fails():
        assert 1 == 2, "one is not two"

    def test_exits():
        os._exit(3)

    def test_segfaults():
        ctypes.string_at(0)

    def test_sleeps():
        _ran("sleeps")
        time.sleep(60)
"""


def _tree(top: Path) -> Path:
    tree = top / "tree"
    tree.mkdir(parents=True)
    (tree / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tree / "test_s.py").write_text(textwrap.dedent(TESTS))
    return tree


def _box() -> sb.Sandbox:
    return sb.Sandbox(mode="bwrap" if sb.available() is None else "none")


def _prepare(top: Path, tree: Path) -> Any:
    """What ShippedCode.task gives a session: the tree, a scratch directory, the sandbox."""
    @contextlib.asynccontextmanager
    async def prepare() -> AsyncIterator[dict[str, Any]]:
        scratch = top / f"scratch-{len(list(top.glob('scratch-*')))}"
        scratch.mkdir()
        yield {"bundle_root": tree, "scratch_dir": scratch, "sandbox": _box()}
    return prepare


def _key(run_id: str, submitter: str = "k1") -> SessionKey:
    return SessionKey(run_id, submitter, "b" * 64, "p", "o")


def _ctx(task_id: str, *tests: str, timeout_s: float | None = None, **config: Any) -> TaskContext:
    cfg = {"test_file": tests[0], "tests": list(tests[1:]), "test_args": [], "session": "r", **config}
    return TaskContext(task_id=task_id, attempt=1, type="test", config=cfg, timeout_s=timeout_s)


def _tokens(tree: Path) -> list[str]:
    return (tree / "sessions.log").read_text().split()


def _host_pids(pool: SessionPool) -> list[int]:
    return [s.proc.pid for s in pool._live if s.proc is not None]


def _outcomes(out: Any) -> dict[str, str]:
    return {t["nodeid"]: t["outcome"] for t in out.output["tests"]}


def test_tasks_of_one_run_share_a_session_that_collects_once_and_never_serves_another_run(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    pool = SessionPool({}, FAST_ENV, 0.2)
    prepare = _prepare(tmp_path, tree)
    pids: list[int] = []

    async def body() -> None:
        # the run's paths collected once, at the session's start; each task takes its tests from them
        first = await pool.run(_ctx("t1", "test_s.py::test_a", collect=["test_s.py"]), _key("run-1"), prepare)
        second = await pool.run(_ctx("t2", "test_s.py::test_b", "test_s.py::test_fails", collect=["test_s.py"]),
                                _key("run-1"), prepare)
        other_run = await pool.run(_ctx("t3", "test_s.py::test_a"), _key("run-2"), prepare)
        other_key = await pool.run(_ctx("t4", "test_s.py::test_a"), _key("run-1", "k2"), prepare)
        pids.extend(_host_pids(pool))
        assert first.status == "succeeded" and _outcomes(first) == {"test_s.py::test_a": "passed"}
        assert second.status == "failed" and second.error == "1 of 2 tests failed"
        assert _outcomes(second) == {"test_s.py::test_b": "passed", "test_s.py::test_fails": "failed"}
        assert [first.output["session"]["reused"], second.output["session"]["reused"]] == [False, True]
        assert other_run.output["session"]["reused"] is False and other_key.output["session"]["reused"] is False
        await pool.close()

    run(body())
    sessions = _tokens(tree)
    assert len(sessions) == 3  # run-1 (two tasks, one collection), run-2, run-1 of another submitter
    ran = dict((line.split()[0] + str(n), line.split()[1])
               for n, line in enumerate((tree / "ran.log").read_text().splitlines()))
    assert ran["a0"] == ran["b1"] == sessions[0]  # the second task ran in the first task's process
    assert len({ran["a0"], ran["a2"], ran["a3"]}) == 3  # each run and submitter its own process
    assert len(pids) == 3 and all(not pid_alive(p) for p in pids)  # close() ended them


def test_a_task_stopped_by_maxfail_does_not_stop_the_next_task_of_its_session(tmp_path: Path) -> None:
    """``-x`` stops a task at its first failure; the session's next task runs all of its tests.
    pytest (8+) ignores unsetting ``Session.shouldfail`` once set, so each later task of the session
    stopped after its first test: the session process ended and was restarted for the rest (and, as
    seen in a CI run under load, a task "succeeded" with a test not run, and the plugin's run stopped
    at that missing test instead of at its failure)."""
    tree = _tree(tmp_path)
    pool = SessionPool({}, FAST_ENV, 0.2)
    prepare = _prepare(tmp_path, tree)

    async def body() -> Any:
        stopped = await pool.run(_ctx("t1", "test_s.py::test_fails", "test_s.py::test_a", test_args=["-x"]),
                                 _key("run-1"), prepare)
        after = await pool.run(_ctx("t2", "test_s.py::test_a", "test_s.py::test_b", test_args=["-x"]),
                               _key("run-1"), prepare)
        await pool.close()
        return stopped, after

    stopped, after = run(body())
    assert _outcomes(stopped) == {"test_s.py::test_fails": "failed"}  # -x: test_a never ran in it
    assert after.output["session"] == {"reused": True, "starts": 1}  # no restart: it went on serving
    assert _outcomes(after) == {"test_s.py::test_a": "passed", "test_s.py::test_b": "passed"}
    assert after.status == "succeeded"


def test_a_test_that_ends_the_session_is_its_failure_and_the_task_goes_on(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    pool = SessionPool({}, FAST_ENV, 0.2)
    tests = ["test_s.py::test_a", "test_s.py::test_exits", "test_s.py::test_segfaults", "test_s.py::test_b"]

    async def body() -> Any:
        out = await pool.run(_ctx("t1", *tests), _key("run-1"), _prepare(tmp_path, tree))
        after = await pool.run(_ctx("t2", "test_s.py::test_a"), _key("run-1"), _prepare(tmp_path, tree))
        await pool.close()
        return out, after

    out, after = run(body())
    assert _outcomes(out) == {"test_s.py::test_a": "passed", "test_s.py::test_exits": "failed",
                              "test_s.py::test_segfaults": "failed", "test_s.py::test_b": "passed"}
    entries = {t["nodeid"]: t for t in out.output["tests"]}
    assert entries["test_s.py::test_exits"]["message"] == "the pytest session running this test ended: exit code 3"
    segv = entries["test_s.py::test_segfaults"]
    assert "SIGSEGV" in segv["message"] and "Fatal Python error" in segv["longrepr"]  # faulthandler's
    assert out.status == "failed" and out.error == "2 of 4 tests failed"
    assert after.status == "succeeded" and after.output["session"]["reused"] is True
    assert pool.started == 3  # the first start, one after each crash; the next task reused the last


CASES_CONFTEST = """
    import os
    import pytest

    def pytest_collect_file(file_path, parent):
        if file_path.suffix == ".cases":
            return CasesFile.from_parent(parent, path=file_path)

    class CasesFile(pytest.File):
        def collect(self):
            for line in self.path.read_text().splitlines():
                name, _, what = line.partition(" ")
                yield CaseItem.from_parent(self, name=name, what=what)

    class CaseItem(pytest.Item):
        def __init__(self, *, what, **kwargs):
            super().__init__(**kwargs)
            self.what = what

        def runtest(self):
            if self.what == "exit":
                os._exit(3)
            assert self.what == "ok"
"""


def test_after_a_crash_the_items_that_share_the_crashed_tests_node_id_still_run(tmp_path: Path) -> None:
    # a conftest's items may share one node id (docopt-ng's cases): the restarted session goes on
    # after the crashed item, not after every item of its node id
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "conftest.py").write_text(textwrap.dedent(CASES_CONFTEST))
    (tree / "test_c.cases").write_text("shared ok\nshared exit\nshared ok\nshared fails\nother ok\n")
    pool = SessionPool({}, FAST_ENV, 0.2)

    async def body() -> Any:
        out = await pool.run(_ctx("t1", "test_c.cases"), _key("run-1"), _prepare(tmp_path, tree))
        await pool.close()
        return out

    out = run(body())
    ran = [(t["nodeid"], t["outcome"]) for t in out.output["tests"]]
    assert ran == [("test_c.cases::shared", "passed"), ("test_c.cases::shared", "failed"),
                   ("test_c.cases::shared", "passed"), ("test_c.cases::shared", "failed"),
                   ("test_c.cases::other", "passed")], ran
    assert "exit code 3" in out.output["tests"][1]["message"]
    assert pool.started == 2


def test_a_session_dies_with_its_run_on_cancel_timeout_idle_and_worker_stop(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    pool = SessionPool({}, FAST_ENV, 0.2, idle_s=1.0)
    prepare = _prepare(tmp_path, tree)

    seen: set[int] = set()

    def sleeping() -> bool:
        seen.update(_host_pids(pool))
        return (tree / "ran.log").exists() and "sleeps" in (tree / "ran.log").read_text()

    async def body() -> None:
        # cancel: a run with an idle session and a busy one; cancelling the busy task ends both
        await pool.run(_ctx("t1", "test_s.py::test_a"), _key("run-1"), prepare)
        slow = asyncio.create_task(pool.run(_ctx("t2", "test_s.py::test_sleeps"), _key("run-1"), prepare))
        await wait_until(sleeping, what="the sleeping test to start")
        idle = asyncio.create_task(pool.run(_ctx("t3", "test_s.py::test_b"), _key("run-1"), prepare))
        await idle  # a second session of run-1, idle now
        assert pool.live() == 2
        both = _host_pids(pool)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        assert pool.live() == 0 and not any(pid_alive(p) for p in both)
        (tree / "ran.log").unlink()

        # timeout: the task times out and its session is killed
        timing = asyncio.create_task(pool.run(_ctx("t4", "test_s.py::test_sleeps", timeout_s=5), _key("run-2"), prepare))
        while not timing.done():
            seen.update(_host_pids(pool))
            await asyncio.sleep(0.05)
        out = timing.result()
        assert out.status == "timed_out" and out.error == "pytest timed out after 5 s; its session was killed"
        assert seen and pool.live() == 0 and not any(pid_alive(p) for p in seen)

        # idle: a session with no task of its run for idle_s ends; this one a warm task started (no test run)
        warm = await pool.run(_ctx("t5", "test_s.py", warm=True), _key("run-3"), prepare)
        assert warm.status == "succeeded" and warm.output["session"] == {"reused": False, "starts": 1, "warm": True}
        idle_pids = _host_pids(pool)
        assert len(idle_pids) == 1
        await wait_until(lambda: pool.live() == 0 and not pid_alive(idle_pids[0]), what="the idle session to end")

        # the worker stops: the executor's close() kills every session
        ex = ServingTestExecutor(extra_env=FAST_ENV)
        await ex.serve(_ctx("t6", "test_s.py::test_a"), _key("run-4"), prepare)
        assert ex.sessions.live() == 1
        last = _host_pids(ex.sessions)
        await ex.close()
        assert ex.sessions.live() == 0 and not pid_alive(last[0])

    run(body())


def test_a_task_cancelled_while_its_session_collects_leaves_no_process(tmp_path: Path) -> None:
    """A run's warm tasks still starting their sessions are cancelled when the run ends (and -x
    cancels the rest): the session's process, which was collecting, ended only with the worker
    before (a sandbox process left running over a removed tree)."""
    tree = _tree(tmp_path)
    (tree / "conftest.py").write_text("import time\n\ntime.sleep(60)\n")  # collecting takes a minute
    pool = SessionPool({}, FAST_ENV, 0.2)
    pids: list[int] = []

    def started() -> bool:
        pids[:] = _host_pids(pool)
        return bool(pids)

    async def body() -> None:
        warm = asyncio.create_task(pool.run(_ctx("t1", "test_s.py", warm=True), _key("run-1"), _prepare(tmp_path, tree)))
        await wait_until(started, what="the session's process to start")
        warm.cancel()
        with pytest.raises(asyncio.CancelledError):
            await warm
        assert pool.live() == 0
        await wait_until(lambda: not pid_alive(pids[0]), what="the collecting session's process to end")

    run(body())


def test_the_key_of_a_session_names_run_submitter_bundle_environment_and_options() -> None:
    a = TaskAssignment("t1", 1, "test", {"test_file": "t.py", "session": "r1"}, bundle="b" * 64,
                       python=["x==1"], submitted_by="k1")
    key = session_key(a)
    assert key is not None and (key.run, key.submitter, key.bundle) == ("r1", "k1", "b" * 64)
    others = [msgspec.structs.replace(a, config={**a.config, "session": "r2"}), msgspec.structs.replace(a, submitted_by="k2"),
              msgspec.structs.replace(a, bundle="c" * 64), msgspec.structs.replace(a, python=["x==2"]),
              msgspec.structs.replace(a, config={**a.config, "test_args": ["-p", "x"]}),
              msgspec.structs.replace(a, run_id="run-000000000001")]
    assert len({key, *(session_key(o) for o in others)}) == len(others) + 1
    assert session_key(msgspec.structs.replace(a, bundle=None)) is None  # a task of the worker's own tree
    assert session_key(msgspec.structs.replace(a, config={"test_file": "t.py"})) is None  # one pytest of its own


def test_the_tree_a_task_names_is_where_its_pytest_saw_the_files_streamed_and_at_its_end(tmp_path: Path) -> None:
    """The plugin maps the tree a result names (``output["tree"]``, and each live report's) back to the
    submitter's root: it must be the path the session's pytest saw the tree at (``/task/tree`` in the
    sandbox), not the worker's own, or a streamed failure's paths would read as the worker's."""
    tree = _tree(tmp_path)
    pool = SessionPool({}, FAST_ENV, 0.2)
    streamed: list[tuple[str, dict[str, Any]]] = []

    async def body() -> Any:
        ctx = dataclasses.replace(_ctx("t1", "test_s.py::test_a", "test_s.py::test_fails"),
                                  reports=lambda root, entry: streamed.append((root, entry)))
        try:
            return await pool.run(ctx, _key("run-1"), _prepare(tmp_path, tree))
        finally:
            await pool.close()

    out = run(body())
    expected = "/task/tree" if _box().mode == "bwrap" else str(tree.resolve())
    assert out.output["tree"] == expected
    assert [root for root, _ in streamed] == [expected, expected]
    [crash] = [r["longrepr"]["reprcrash"]["path"] for _, e in streamed for r in e["reports"]
               if isinstance(r.get("longrepr"), dict)]
    assert crash == f"{expected}/test_s.py"
