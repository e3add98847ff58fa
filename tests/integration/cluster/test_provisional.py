"""Provisional assignments (sent before the coordinator's record is durable): the worker runs them
at once and sends their results at once, but announces them as started, and keeps their results
for a re-send, only once the coordinator confirms; it abandons them when the session ends first.
And a newer attempt of a task stops the older one still running.

A real WorkerAgent against a hand-driven coordinator endpoint (``hand_support``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import duckdb
import pytest
from hand_support import hand_session

from distributed_testing.protocol import messages as m
from distributed_testing.testing import wait_for
from distributed_testing.worker import runs as runs_mod
from distributed_testing.worker.executors.base import ExecOutcome, TaskContext
from distributed_testing.worker.result_store_duckdb import DuckDBResultStore

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
SLEEP = {"name": "sleep", "parameters": {"seconds": 30}}


async def test_a_provisional_result_is_sent_at_once_and_kept_only_once_confirmed(tmp_path: Path) -> None:
    async with hand_session(tmp_path) as (coord, agent):
        await coord.assign("a", provisional=1)
        assert await coord.results() == ["a"]  # the coordinator journals it after the assignment
        assert agent.result_store.unacked_refs() == []  # but it is not kept for a re-send: maybe never durable
        await coord.assign("b", provisional=2)
        assert await coord.results() == ["b"]
        await coord.send(m.Confirm(1))
        await wait_for(lambda: agent.result_store.unacked_refs() == [m.TaskRef("a", 1)], what="a to be kept")
        await coord.send(m.Confirm(2))
        await wait_for(lambda: len(agent.result_store.unacked_refs()) == 2, what="b to be kept")
        await coord.ack("a", "b")
        await wait_for(lambda: agent.result_store.unacked_refs() == [], what="the acks")


async def test_unconfirmed_assignments_are_abandoned_when_the_session_ends(tmp_path: Path) -> None:
    async with hand_session(tmp_path) as (coord, agent):
        await coord.assign("done", provisional=1)
        assert await coord.results() == ["done"]
        await coord.assign("long", provisional=2, config=SLEEP)
        await wait_for(lambda: "long" in agent.running, what="long to start")
        pool = agent.executors["custom"].pool  # type: ignore[attr-defined]
        child_pids = set(pool.pids)
        await coord.drop()  # the coordinator may have lost both in a crash
        await wait_for(lambda: len(coord.registers) == 2, what="the worker to register again")
        again = coord.registers[-1]
        assert again.running == [] and again.finished == []  # neither is announced as kept
        assert again.abandoned == [m.TaskRef("done", 1), m.TaskRef("long", 1)]  # requeued at no retry cost
        assert agent.running == {} and agent.result_store.unacked_refs() == []
        await asyncio.sleep(0.3)
        assert coord.received.empty()  # and "done"'s result is not sent again, nor any of "long"
        await wait_for(lambda: child_pids - set(pool.pids), what="the sleeping child to be killed")


class SlowToStop:
    """An executor whose task takes 0.2 s to stop once cancelled (as a benchmark child being
    reaped, or training ranks settling), longer than the worker's 25 ms ``started`` delay."""

    task_type = "custom"

    async def start(self) -> None:
        return None

    async def run(self, ctx: TaskContext) -> ExecOutcome:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.shield(asyncio.sleep(0.2))
            raise
        return ExecOutcome("succeeded")

    async def close(self) -> None:
        return None


async def test_an_abandoned_task_is_never_announced_as_started(tmp_path: Path) -> None:
    async with hand_session(tmp_path, {"custom": SlowToStop()}) as (coord, agent):
        await coord.assign("x", provisional=1)
        await wait_for(lambda: "x" in agent.running, what="x to start")
        await coord.drop()  # before the 25 ms started delay, and before any confirm
        await wait_for(lambda: len(coord.registers) == 2, what="the worker to register again")
        await asyncio.sleep(0.4)  # the cancelled run has finished stopping
        assert coord.started == [] and coord.registers[-1].abandoned == [m.TaskRef("x", 1)]


async def test_a_newer_attempt_stops_the_older_one(tmp_path: Path) -> None:
    async with hand_session(tmp_path) as (coord, agent):
        await coord.assign("t", attempt=1, config=SLEEP)
        await wait_for(lambda: "t" in agent.running, what="attempt 1 to start")
        pool = agent.executors["custom"].pool  # type: ignore[attr-defined]
        child_pids = set(pool.pids)
        await coord.assign("t", attempt=2)
        msg = await asyncio.wait_for(coord.received.get(), 10)
        assert isinstance(msg, m.Results) and [(r.task_id, r.attempt) for r in msg.results] == [("t", 2)]
        await wait_for(lambda: child_pids - set(pool.pids), what="attempt 1's child to be killed")
        assert agent.running == {}
        await asyncio.sleep(0.3)
        assert coord.received.empty()  # attempt 1 reports nothing


class Gated:
    """An instant executor; a task whose config names a gate waits until the test opens it."""

    task_type = "custom"

    def __init__(self) -> None:
        self.gates: dict[str, asyncio.Event] = {}

    async def start(self) -> None:
        return None

    async def run(self, ctx: TaskContext) -> ExecOutcome:
        if gate := ctx.config.get("gate"):
            await self.gates.setdefault(gate, asyncio.Event()).wait()
        return ExecOutcome("succeeded")

    async def close(self) -> None:
        return None


async def test_an_ack_settles_a_result_sent_before_its_confirm(tmp_path: Path) -> None:
    """An ack means the result, and so its assignment, is durable: a confirm coming after it must
    not put the acknowledged result back in the outbox (to be re-sent forever)."""
    async with hand_session(tmp_path, {"custom": Gated()}) as (coord, agent):
        await coord.assign("a", provisional=1)
        assert await coord.results() == ["a"]
        await coord.ack("a")
        await wait_for(lambda: not agent.state.unlogged, what="the ack")
        await coord.send(m.Confirm(1))
        await asyncio.sleep(0.2)
        assert agent.result_store.unacked_refs() == [] and agent.state.unconfirmed == {}


async def test_a_result_acknowledged_before_its_confirm_is_in_the_outbox_history(tmp_path: Path) -> None:
    """``--db-path``'s file is the history of everything the worker ran: a result the ack settled
    before the confirm came (never kept for a re-send) is written there too, as acknowledged."""
    db = tmp_path / "w.duckdb"
    store = DuckDBResultStore(db)
    await store.open()
    try:
        async with hand_session(tmp_path, {"custom": Gated()}, store) as (coord, agent):
            await coord.assign("a", provisional=1)
            assert await coord.results() == ["a"]
            await coord.send(m.ResultAck([m.TaskRef("a", 1)], confirm_upto=1))  # the confirm rides on the ack
            await wait_for(lambda: not agent.state.unconfirmed, what="the ack")
    finally:
        await store.close()
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT task_id, attempt, status, acked_at IS NOT NULL FROM worker_results").fetchall()
    assert rows == [("a", 1, "succeeded", True)]
    assert store.unacked_refs() == []


async def test_a_drain_sends_a_result_held_before_its_confirm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs_mod, "RESULT_HOLD_S", 2.0)  # b's result is held behind a's unacked one
    ex = Gated()
    async with hand_session(tmp_path, {"custom": ex}) as (coord, agent):
        await coord.assign("a", provisional=1)
        assert await coord.results() == ["a"]
        ex.gates["b"] = asyncio.Event()
        await coord.assign("b", provisional=2, config={"name": "noop", "gate": "b"})
        await wait_for(lambda: "b" in agent.running, what="b to start")
        ex.gates["b"].set()
        assert await asyncio.wait_for(agent.drain("test", 5.0), 20) == []  # waits for b's result to go out
        got = []
        while not coord.received.empty():
            got.append(coord.received.get_nowait())
        assert any(isinstance(x, m.Results) and [r.task_id for r in x.results] == ["b"] for x in got), got


async def test_an_ack_carrying_a_confirm_settles_its_results_and_confirms_the_rest(tmp_path: Path) -> None:
    """The coordinator sends a confirm due at the same moment as an ack inside the ack. The acked
    result is durable, so it never needs an outbox entry; the other assignments it confirms do."""
    ex = Gated()
    async with hand_session(tmp_path, {"custom": ex}) as (coord, agent):
        kept: list[str] = []
        add = agent.result_store.add
        agent.result_store.add = lambda r: (kept.append(r.task_id), add(r))[1]  # type: ignore[method-assign]
        ex.gates["b"] = asyncio.Event()
        await coord.assign("a", provisional=1)
        assert await coord.results() == ["a"]
        await coord.assign("b", provisional=2, config={"name": "noop", "gate": "b"})
        await wait_for(lambda: "b" in agent.running, what="b to start")
        await coord.send(m.ResultAck([m.TaskRef("a", 1)], confirm_upto=2))
        await wait_for(lambda: not agent.state.unconfirmed, what="the confirm")
        assert kept == [] and agent.result_store.unacked_refs() == []
        ex.gates["b"].set()
        assert await coord.results() == ["b"]
        await wait_for(lambda: agent.result_store.unacked_refs() == [m.TaskRef("b", 1)], what="b to be kept")
        assert kept == ["b"]
