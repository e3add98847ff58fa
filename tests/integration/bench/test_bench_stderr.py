"""The benchmark child's stderr (worker/executors/benchmark.py): read by the worker into its own
log, each line marked as the child's with its control characters escaped, rather than inherited,
where an operator model's output (or a submitter's choice of parameters echoed by it) could pass
for a line of the worker's own log; and the tail of it in the result of a child that died."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import psutil
import pytest

from distributed_testing.testing import wait_for
from distributed_testing.worker.executors import ExecOutcome, TaskContext
from distributed_testing.worker.executors.benchmark import BenchmarkExecutor, BenchmarkOptions

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120), pytest.mark.slow]

MODELS = '''
import os, sys

import torch

FORGED = "2030-01-01 00:00:00,000 ERROR distributed_testing.worker.agent: forged\\r\\x1b[2Kerased"

def chatty():
    sys.stderr.write(FORGED + "\\n")
    sys.stderr.flush()
    return torch.nn.Sequential(torch.nn.Linear(8, 8))

def dying():
    sys.stderr.write("last words before the end\\n")
    sys.stderr.flush()
    os._exit(3)
'''
BENCH = {"input_shape": [8], "batch_sizes": [2], "iterations": 3, "warmup": 1, "min_duration_s": 0.0}


def _task(task_id: str, model: str) -> TaskContext:
    return TaskContext(task_id, 1, "benchmark", {**BENCH, "model": f"opmodels:{model}"}, timeout_s=60,
                       allow_model_modules=("opmodels",))


def _executor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, cache_models: bool = False) -> BenchmarkExecutor:
    """A benchmark executor whose children import the test's ``opmodels``."""
    (tmp_path / "opmodels.py").write_text(MODELS)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return BenchmarkExecutor(BenchmarkOptions(allow_model_modules=("opmodels",), cache_models=cache_models))


async def _chatty_then_dying(ex: BenchmarkExecutor) -> ExecOutcome:
    """The chatty model's task (it succeeds), then the dying one's, whose outcome is returned: an
    error naming the exit code, with the child's last words in its stderr tail."""
    try:
        chatty = await ex.run(_task("t1", "chatty"))
        dying = await ex.run(_task("t2", "dying"))
    finally:
        await ex.close()
    assert chatty.status == "succeeded", chatty.error
    assert dying.status == "error" and "exit code 3" in (dying.error or ""), dying
    assert "last words before the end" in dying.output["stderr_tail"]
    return dying


async def test_the_childs_stderr_goes_to_the_log_marked_as_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="distributed_testing.worker.executors.benchmark"):
        await _chatty_then_dying(_executor(tmp_path, monkeypatch))
    assert "forged" not in capfd.readouterr().err  # nothing of the child's on the worker's own stderr
    [line] = [r.getMessage() for r in caplog.records if "forged" in r.getMessage()]
    assert line.startswith("benchmark child ") and "forged\\x0d\\x1b[2Kerased" in line and "\x1b" not in line


async def test_a_cached_childs_death_reports_only_the_stderr_of_its_own_task(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``cache_models`` one child serves task after task (of different submitters): the tail
    in a died task's result is what the child wrote for that task, not for the ones before."""
    dying = await _chatty_then_dying(_executor(tmp_path, monkeypatch, cache_models=True))
    assert "forged" not in dying.output["stderr_tail"], dying.output["stderr_tail"]


async def test_a_cached_child_that_died_while_idle_is_reaped_before_the_next_task(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A cached child killed between tasks (the OOM killer, an operator): the next task gets a
    new child, and the dead one's process group and stderr relay are reaped, not left behind."""
    ex = _executor(tmp_path, monkeypatch, cache_models=True)
    with caplog.at_level(logging.WARNING, logger="distributed_testing.worker.executors.benchmark"):
        try:
            first = await ex.run(_task("t1", "chatty"))
            assert first.status == "succeeded", first.error
            [child] = [c for c in psutil.Process().children() if "distributed_testing.bench.child" in " ".join(c.cmdline())]
            child.kill()
            await wait_for(lambda: _dead(child), timeout=10, what="the child to die")  # not reaped here: the loop's
            second = await ex.run(_task("t2", "chatty"))
            assert second.status == "succeeded", second.error
            relays = [t for t in asyncio.all_tasks() if not t.done() and "OutputTail.forward" in repr(t.get_coro())]
            assert len(relays) == 1, relays  # the new child's alone
        finally:
            await ex.close()
    assert any(f"cached benchmark child {child.pid} had exited while idle" in r.getMessage() for r in caplog.records)


def _dead(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # reaped by the event loop's child watcher
        return True
