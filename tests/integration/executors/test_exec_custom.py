"""CustomExecutor against real pool child processes."""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap
from pathlib import Path

import pytest
from executor_support import closing, run, wait_until

from distributed_testing.errors import ExecutionError
from distributed_testing.worker.executors import CustomExecutor, TaskContext
from distributed_testing.worker.executors.proc import pid_alive

pytestmark = pytest.mark.timeout(60)


def ctx(name: str, parameters: dict | None = None, **kw) -> TaskContext:
    config = {"name": name, "parameters": parameters or {}}
    return TaskContext(task_id=kw.pop("task_id", "t1"), attempt=1, type="custom", config=config, **kw)


@pytest.fixture
def executor(handler_dir: Path, handler_specs: dict[str, str], tmp_path: Path) -> CustomExecutor:
    cache = tmp_path / "cache"
    cache.mkdir()
    return CustomExecutor(1, cache_dir=cache, handlers=handler_specs, pythonpath=[handler_dir])


def test_noop_and_sleep_succeed(executor: CustomExecutor) -> None:
    async def body(ex: CustomExecutor):
        return await ex.run(ctx("noop")), await ex.run(ctx("sleep", {"seconds": 0.05}))

    noop, slept = run(closing(executor, body))
    assert noop.status == "succeeded" and noop.output == {} and noop.error is None
    assert slept.status == "succeeded"
    assert slept.output["slept_s"] >= 0.05
    assert slept.finished_at - slept.started_at >= 0.05


def test_handler_runs_in_its_own_process_group_and_sees_context(executor: CustomExecutor) -> None:
    out = run(closing(executor, lambda ex: ex.run(ctx("whoami", task_id="task-42"))))
    assert out.status == "succeeded"
    assert out.output["pid"] == out.output["pgid"] != os.getpgid(0)
    assert out.output["task_id"] == "task-42"
    assert out.output["cache_dir"] == str(executor._cache_dir)


def test_unknown_handler_lists_known_names(executor: CustomExecutor) -> None:
    with pytest.raises(ExecutionError, match="unknown custom handler 'nope'.*noop.*setup_environment.*sleep"):
        run(closing(executor, lambda ex: ex.run(ctx("nope"))))


def test_bad_parameters_and_config_raise_execution_error(executor: CustomExecutor) -> None:
    async def body(ex: CustomExecutor):
        with pytest.raises(ExecutionError, match="seconds must be a non-negative number"):
            await ex.run(ctx("sleep", {"seconds": -1}))
        with pytest.raises(ExecutionError, match="seconds must be a non-negative number, got True"):
            await ex.run(ctx("sleep", {"seconds": True}))
        with pytest.raises(ExecutionError, match="unknown key"):
            await ex.run(TaskContext("t", 1, "custom", {"name": "noop", "extra": 1}))
        return await ex.run(ctx("noop"))  # the child survived all of it

    assert run(closing(executor, body)).status == "succeeded"


def test_raising_handler_fails_with_traceback(executor: CustomExecutor) -> None:
    out = run(closing(executor, lambda ex: ex.run(ctx("boom", {"why": "bad input"}))))
    assert out.status == "failed"
    assert out.error == "ValueError: boom: bad input"
    assert "Traceback (most recent call last)" in out.output["traceback"]
    assert "in boom" in out.output["traceback"]


def test_non_json_output_fails(executor: CustomExecutor) -> None:
    out = run(closing(executor, lambda ex: ex.run(ctx("not_json"))))
    assert out.status == "failed"
    assert "TypeError" in out.error and "object" in out.error


def test_handler_output_on_stdout_does_not_corrupt_the_protocol(executor: CustomExecutor) -> None:
    out = run(closing(executor, lambda ex: ex.run(ctx("chatty"))))
    assert out.status == "succeeded" and out.output == {"said": "hello"}


@pytest.mark.parametrize(("handler", "code", "words"), [("exit_hard", 7, "exit code 7"), ("segfault", -11, "SIGSEGV")])
def test_child_death_is_error_and_child_is_replaced(
    executor: CustomExecutor, handler: str, code: int, words: str
) -> None:
    async def body(ex: CustomExecutor):
        before = (await ex.run(ctx("whoami"))).output["pid"]
        died = await ex.run(ctx(handler))
        after = await ex.run(ctx("whoami"))
        return before, died, after

    before, died, after = run(closing(executor, body))
    assert died.status == "error"
    assert died.output["exit_code"] == code
    assert words in died.error and handler in died.error
    assert after.status == "succeeded" and after.output["pid"] != before


def test_a_died_result_carries_its_own_tasks_stderr_only(handler_dir: Path, handler_specs: dict[str, str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm child serves task after task (of different submitters); the stderr tail a task whose
    child died gets in its result is what that task wrote, not what the tasks before it wrote (nor
    what a task before it printed and the child flushed only later: stdout is block-buffered)."""
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    executor = CustomExecutor(1, handlers=handler_specs, pythonpath=[handler_dir])

    async def body(ex: CustomExecutor):
        before = [await ex.run(ctx("chatty", task_id="someone-elses")),
                  await ex.run(ctx("whisper", {"text": "a secret of someone else"}, task_id="theirs"))]
        died = await ex.run(ctx("say_and_exit", {"text": "my own last words"}, task_id="mine"))
        return before, died

    before, died = run(closing(executor, body))
    assert [b.status for b in before] == ["succeeded"] * 2 and died.status == "error"
    tail = died.output["stderr_tail"]
    assert "my own last words" in tail
    assert "to stderr" not in tail and "xxx" not in tail and "secret" not in tail, tail


def test_timeout_kills_child_and_grandchild(executor: CustomExecutor, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"

    async def body(ex: CustomExecutor):
        out = await ex.run(ctx("spawn_and_block", {"pidfile": str(pidfile)}, timeout_s=1.5))
        child, grandchild = map(int, pidfile.read_text().split())
        await wait_until(lambda: not pid_alive(grandchild), what=f"grandchild {grandchild} to die")
        await wait_until(lambda: not pid_alive(child), what=f"pool child {child} to die")
        await wait_until(lambda: len(ex.pool.pids) == 1, what="a replacement pool child")
        return out, child, await ex.run(ctx("whoami"))

    out, child, after = run(closing(executor, body))
    assert out.status == "timed_out"
    assert "timed out after 1.5 s" in out.error
    assert after.status == "succeeded" and after.output["pid"] != child


def test_cancellation_kills_process_group_then_propagates(executor: CustomExecutor, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"

    async def body(ex: CustomExecutor):
        task = asyncio.create_task(ex.run(ctx("spawn_and_block", {"pidfile": str(pidfile)})))
        await wait_until(pidfile.exists, what="handler to start its grandchild")
        child, grandchild = map(int, pidfile.read_text().split())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_until(lambda: not pid_alive(grandchild), what=f"grandchild {grandchild} to die")
        await wait_until(lambda: not pid_alive(child), what=f"pool child {child} to die")
        return child, await ex.run(ctx("whoami"))

    child, after = run(closing(executor, body))
    assert after.status == "succeeded" and after.output["pid"] != child


def test_memory_limit_kills_child(executor: CustomExecutor) -> None:
    async def body(ex: CustomExecutor):
        return await ex.run(ctx("hog", {"mb": 300}, max_memory_mb=100, timeout_s=30))

    out = run(closing(executor, body))
    assert out.status == "failed"
    assert "memory limit of 100 MB exceeded" in out.error


def test_pool_runs_tasks_concurrently(handler_dir: Path, handler_specs: dict[str, str]) -> None:
    ex = CustomExecutor(3, handlers=handler_specs, pythonpath=[handler_dir])

    async def body(ex: CustomExecutor):
        outs = await asyncio.gather(*(ex.run(ctx("whoami")) for _ in range(30)))
        return outs, ex.pool.pids

    outs, pids = run(closing(ex, body))
    assert all(o.status == "succeeded" for o in outs)
    assert {o.output["pid"] for o in outs} <= set(pids)
    assert len(pids) == 3


def test_setup_environment_clears_cache_dir(executor: CustomExecutor) -> None:
    cache = executor._cache_dir
    assert cache is not None
    (Path(cache) / "sub" / "deeper").mkdir(parents=True)
    (Path(cache) / "a.bin").write_bytes(b"a" * 1000)
    (Path(cache) / "sub" / "deeper" / "b.bin").write_bytes(b"b" * 24)
    out = run(closing(executor, lambda ex: ex.run(ctx("setup_environment", {"clear_cache": True}))))
    assert out.status == "succeeded", out.error
    cleared = out.output["cleared"]
    assert cleared["cache_dir"]["files_deleted"] == 2
    assert cleared["cache_dir"]["bytes_freed"] == 1024
    assert cleared["bytes_freed"] >= 1024
    assert cleared["cuda"]["cleared"] is False and cleared["cuda"]["reason"]
    assert list(Path(cache).iterdir()) == []


def _write_plugin(site: Path) -> None:
    (site / "dt_ep_plugin.py").write_text(
        textwrap.dedent(
            """
            def hello(parameters, ctx):
                return {"hello": parameters.get("who", "world")}
            """
        )
    )
    dist = site / "dt_ep_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: dt-ep-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[distributed_testing.custom_handlers]\nhello = dt_ep_plugin:hello\nbroken = dt_no_such_module:fn\n"
    )


def test_entry_point_handlers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    _write_plugin(site)
    monkeypatch.syspath_prepend(str(site))
    ex = CustomExecutor(1, pythonpath=[site])
    assert {"hello", "broken", "noop"} <= set(ex.handler_names())

    async def body(ex: CustomExecutor):
        hello = await ex.run(ctx("hello", {"who": "plugin"}))
        with pytest.raises(ExecutionError, match="cannot load handler 'dt_no_such_module:fn'"):
            await ex.run(ctx("broken"))
        return hello

    assert run(closing(ex, body)).output == {"hello": "plugin"}


def test_child_that_died_while_idle_is_replaced_before_use(executor: CustomExecutor) -> None:
    async def body(ex: CustomExecutor):
        (pid,) = ex.pool.pids
        os.kill(pid, signal.SIGKILL)
        await wait_until(lambda: all(c.proc.returncode is not None for c in ex.pool._idle), what="exit noticed")
        return pid, await ex.run(ctx("whoami"))

    pid, out = run(closing(executor, body))
    assert out.status == "succeeded" and out.output["pid"] != pid
