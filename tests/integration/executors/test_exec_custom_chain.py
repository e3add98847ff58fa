"""Chains on real pool children (``CustomExecutor.run_chain``, ``HandlerPool.chain``): several
queued tasks handed to one child in one write, each reply read as it comes; a timeout ends the
chain at that task (the rest never began); a task withdrawn before it began is skipped, one
withdrawn while it runs is killed."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest
from executor_support import closing, run, wait_until

from distributed_testing.worker.executors import CustomExecutor, TaskContext
from distributed_testing.worker.executors.base import ExecOutcome
from distributed_testing.worker.executors.pool import ChainControl

pytestmark = pytest.mark.timeout(60)


def ctx(task_id: str, name: str = "whoami", parameters: dict | None = None, **kw) -> TaskContext:
    return TaskContext(task_id=task_id, attempt=1, type="custom", config={"name": name, "parameters": parameters or {}},
                       **kw)


@pytest.fixture
def executor(handler_dir: Path, handler_specs: dict[str, str]) -> CustomExecutor:
    return CustomExecutor(1, handlers=handler_specs, pythonpath=[handler_dir])


async def outcomes(ex: CustomExecutor, ctxs: list[TaskContext], control: ChainControl | None = None,
                   ) -> dict[int, ExecOutcome | None]:
    """The chain's outcomes by index (None: skipped, never began)."""
    got: dict[int, ExecOutcome | None] = {}
    async with contextlib.aclosing(ex.run_chain(ctxs, control or ChainControl())) as chain:
        async for i, outcome in chain:
            got[i] = outcome
    return got


def test_one_child_runs_the_whole_chain_each_task_its_own_outcome(executor: CustomExecutor) -> None:
    chain = [ctx("t1"), ctx("t2"), ctx("t3", "boom", {"why": "no"}), ctx("t4")]
    got = run(closing(executor, lambda ex: outcomes(ex, chain)))
    out = {i: o for i, o in got.items() if o is not None}
    assert [out[i].status for i in range(4)] == ["succeeded", "succeeded", "failed", "succeeded"]
    assert [out[i].output["task_id"] for i in (0, 1, 3)] == ["t1", "t2", "t4"]
    assert len({out[i].output["pid"] for i in (0, 1, 3)}) == 1  # one child, one exchange
    assert "boom: no" in (out[2].error or "")


def test_a_timeout_ends_the_chain_at_that_task_and_the_rest_never_begin(executor: CustomExecutor) -> None:
    chain = [ctx("t1"), ctx("t2", "sleep", {"seconds": 30}, timeout_s=0.5), ctx("t3")]
    got = run(closing(executor, lambda ex: outcomes(ex, chain)))
    assert {i: o and o.status for i, o in got.items()} == {0: "succeeded", 1: "timed_out"}  # t3: never began


def test_a_task_withdrawn_before_it_begins_is_skipped_and_one_running_is_killed(executor: CustomExecutor) -> None:
    async def body(ex: CustomExecutor) -> tuple[dict[int, ExecOutcome | None], dict[int, ExecOutcome | None]]:
        control = ChainControl()
        chain = [ctx("t1", "sleep", {"seconds": 0.5}), ctx("t2"), ctx("t3")]
        task = asyncio.ensure_future(outcomes(ex, chain, control))
        await wait_until(lambda: control._child is not None, what="the chain to start")
        control.skip(1)  # t2 waits behind t1 in the child's pipe: skipped (a take-back or a cancel)
        skipped = await task
        control = ChainControl()
        chain = [ctx("t4", "sleep", {"seconds": 30}), ctx("t5")]
        task = asyncio.ensure_future(outcomes(ex, chain, control))
        await wait_until(lambda: control._child is not None, what="the second chain to start")
        await asyncio.sleep(0.2)
        control.withdraw(0)  # t4 is running: its child is killed
        return skipped, await task

    skipped, killed = run(closing(executor, body))
    assert skipped[1] is None  # never began
    assert (skipped[0].status, skipped[2].status) == ("succeeded", "succeeded")  # type: ignore[union-attr]
    assert {i: o and o.status for i, o in killed.items()} == {0: "cancelled"}  # t5 never began


def test_a_task_stopped_before_the_chain_has_its_child_never_begins(executor: CustomExecutor) -> None:
    control = ChainControl()
    control.skip(0)  # a take-back, or a cancel, while the chain waited for a free child
    control.withdraw(2)
    got = run(closing(executor, lambda ex: outcomes(ex, [ctx("t1"), ctx("t2"), ctx("t3")], control)))
    assert got[0] is None and got[2] is None and got[1] is not None and got[1].status == "succeeded"


def test_each_request_of_a_chain_names_its_task_and_the_cache(handler_dir: Path, handler_specs: dict[str, str],
                                                              tmp_path: Path) -> None:
    """The chain's requests (built positionally) carry each task's id and the handlers' cache directory."""
    ex = CustomExecutor(1, handlers=handler_specs, pythonpath=[handler_dir], cache_dir=tmp_path / "cache")
    got = run(closing(ex, lambda e: outcomes(e, [ctx("a1"), ctx("a2", timeout_s=9.0)])))
    assert [(o.output["task_id"], o.output["cache_dir"]) for o in got.values() if o is not None] == [
        ("a1", str(tmp_path / "cache")), ("a2", str(tmp_path / "cache"))]
