"""``Runtime.execute`` with a store whose writes the test completes by hand: what goes to a worker
before its event's records are durable (a provisional assignment, confirmed afterwards) and what
waits, in which order; and ``?wait`` answers only with outcomes that are on disk."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from distributed_testing.config import CoordinatorConfig
from distributed_testing.coordinator import api, logs_api
from distributed_testing.coordinator.core.commands import Command, Notify, Save, Send
from distributed_testing.coordinator.core.rows import MetaRow, Record
from distributed_testing.coordinator.runtime import RUNTIME, Runtime, Session
from distributed_testing.coordinator.store.memory import MemoryStore
from distributed_testing.errors import StoreError
from distributed_testing.protocol import messages as m
from distributed_testing.protocol.signing import Channel
from distributed_testing.security.auth import Principal
from distributed_testing.security.roles import Role
from distributed_testing.tasks.spec import parse_tasks


class GatedStore(MemoryStore):
    """A MemoryStore whose appends complete only when the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gated = False
        self.held: list[asyncio.Future[None]] = []
        self.lingers: list[float] = []  # each append's linger_s
        self.broken = False  # appends raise, as a failed journal's do

    def append(self, records: list[Record], linger_s: float = 0.0) -> asyncio.Future[None]:
        if self.broken:
            raise StoreError("journal failed")
        self.lingers.append(linger_s)
        if not self.gated:
            return super().append(records)
        super().append(records)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.held.append(fut)
        return fut

    def release(self) -> None:
        for fut in self.held:
            fut.set_result(None)
        self.held.clear()


async def runtime_with_worker() -> tuple[Runtime, GatedStore, Session]:
    store = GatedStore()
    await store.open()
    rt = Runtime(CoordinatorConfig(), store, clock=lambda: 100.0)
    session = Session(session_id="s1", worker_id="w", key_id="k", channel=Channel(b"k" * 32))
    rt.sessions["w"] = session
    reg = m.Register(worker_id="w", name="w", protocol_version=m.PROTOCOL_VERSION, hardware={},
                     capabilities=["cpu"], tags=[], max_concurrent=4)
    await rt.execute(rt.state.register(reg, "s1", 100.0, key_id="k"))
    return rt, store, session


@pytest.mark.asyncio
async def test_wait_does_not_answer_with_an_outcome_still_being_written() -> None:
    rt, store, _ = await runtime_with_worker()
    _, cmds = rt.state.submit(parse_tasks({"task_id": "t1", "type": "custom", "config": {"name": "noop"}}), 100.0)
    await rt.execute(cmds)

    store.gated = True
    result = m.Results([m.TaskResult("t1", 1, "succeeded", 100.0, 100.5)])
    written = rt.execute(rt.state.results("w", result, 100.5))
    assert rt.state.tasks["t1"].outcome is not None  # set in memory, not yet on disk
    waiting = asyncio.ensure_future(rt.wait_terminal(["t1"], 10.0))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done(), "?wait answered before the outcome was durable"

    store.release()
    await asyncio.wait_for(waiting, 5)
    await written
    await asyncio.wait_for(rt.wait_terminal(["t1"], 10.0), 1)  # durable now: answers at once
    assert not rt._undurable and not rt._waiters



@pytest.mark.asyncio
@pytest.mark.parametrize("route", ["submit", "get", "reports"])
async def test_a_wait_that_ends_while_the_outcome_is_written_answers_once_it_is_durable(route: str) -> None:
    """``?wait=S`` ending (S elapsed) while the task's outcome is set in memory and its write is
    still in flight: the answer waits for that write rather than show an outcome a crash could
    still take back (``GET /api/v1/tasks/{id}`` without ``?wait`` already did)."""
    rt, store, _ = await runtime_with_worker()
    principal = Principal(key_id="k", role=Role.ADMIN, name="k", via="api_key")
    doc = b'{"task_id": "t1", "type": "custom", "config": {"name": "noop"}}'
    if route == "submit":
        answer = asyncio.ensure_future(api.submit(rt, principal, doc, 0.05))
    else:
        await api.submit(rt, principal, doc, 0.0)
        path = "/api/v1/tasks/t1/reports?wait=0.05" if route == "reports" else "/api/v1/tasks/t1?wait=0.05"
        request = make_mocked_request("GET", path, match_info={"task_id": "t1"}, app=web.Application())
        request.app[RUNTIME] = rt
        answer = asyncio.ensure_future(logs_api.get_reports(request) if route == "reports" else api.get_task(request))
    async with asyncio.timeout(5):
        while "t1" not in rt._waiters:  # the ?wait is waiting for the outcome
            await asyncio.sleep(0.001)

    store.gated = True
    written = rt.execute(rt.state.results("w", m.Results([m.TaskResult("t1", 1, "succeeded", 100.0, 100.5)]), 100.5))
    assert rt.undurable("t1")  # the outcome is set in memory, its records not on disk yet
    done, _ = await asyncio.wait([answer], timeout=0.5)  # ten times the ?wait
    assert not done, "?wait answered with an outcome that was not durable"

    store.release()
    await written
    async with asyncio.timeout(5):
        result = await answer
    body = result[1]["tasks"][0] if route == "submit" else msgspec.json.decode(result.body)  # type: ignore[union-attr]
    if route == "reports":  # complete: the result, durable, carries every test
        assert (body["state"], body["complete"]) == ("succeeded", True)
    else:
        assert (body["state"], body["outcome"]["status"]) == ("succeeded", "succeeded")


def sent(session: Session) -> list[m.Message]:
    out = []
    while not session.outbox.empty():
        msg = session.outbox.get_nowait()
        assert msg is not None
        out.append(msg)
    return out


def assign(task_id: str, attempt: int = 1) -> m.AssignTasks:
    return m.AssignTasks([m.TaskAssignment(task_id=task_id, attempt=attempt, type="custom", config={"name": "noop"})])


@pytest.mark.asyncio
async def test_an_assignment_leaves_before_its_record_is_durable_and_is_confirmed_after() -> None:
    rt, store, session = await runtime_with_worker()
    store.gated = True
    _, cmds = rt.state.submit(parse_tasks({"task_id": "t1", "type": "custom", "config": {"name": "noop"}}), 100.0)
    done = rt.execute(cmds)
    first = sent(session)
    assert [type(x) for x in first] == [m.AssignTasks] and first[0].provisional == 1  # type: ignore[union-attr]
    store.release()
    await done
    assert sent(session) == [m.Confirm(1)]


@pytest.mark.asyncio
async def test_an_assignment_never_overtakes_an_earlier_command_for_the_same_worker() -> None:
    rt, store, session = await runtime_with_worker()
    store.gated = True
    cancel = m.Cancel(m.TaskRef("t", 1), "superseded")
    same_event: list[Command] = [Save(MetaRow("a", "1")), Send("w", cancel), Send("w", assign("t", 2))]
    earlier: list[Command] = [Save(MetaRow("b", "1")), Send("w", m.Cancel(m.TaskRef("u", 1), "gone"))]
    later: list[Command] = [Save(MetaRow("c", "1")), Send("w", assign("v"))]
    futs = [rt.execute(same_event), rt.execute(earlier), rt.execute(later)]
    assert sent(session) == []  # each waits behind a command that waits for the disk
    store.release()
    await asyncio.gather(*futs)
    assert sent(session) == [cancel, assign("t", 2), m.Cancel(m.TaskRef("u", 1), "gone"), assign("v")]
    assert session.deferred == 0
    store.gated = False
    await rt.execute([Save(MetaRow("d", "1")), Send("w", assign("x"))])  # nothing waits now
    assert sent(session) == [m.AssignTasks(assign("x").tasks, provisional=1), m.Confirm(1)]


@pytest.mark.asyncio
async def test_an_assignment_may_overtake_a_result_ack() -> None:
    """A busy worker always has an ack on its way; it still gets provisional assignments."""
    rt, store, session = await runtime_with_worker()
    store.gated = True
    ack = m.ResultAck([m.TaskRef("done", 1)])
    futs = [rt.execute([Save(MetaRow("a", "1")), Send("w", ack)]),
            rt.execute([Save(MetaRow("b", "1")), Send("w", ack), Send("w", assign("next"))])]
    assert sent(session) == [m.AssignTasks(assign("next").tasks, provisional=1)]
    store.release()
    await asyncio.gather(*futs)
    assert sent(session) == [ack, m.Confirm(1), ack]


@pytest.mark.asyncio
async def test_records_linger_only_when_nothing_waits_for_them() -> None:
    """A ?wait submission's records may wait for its result's (one fsync for both), but not when
    a command for the worker waits behind them: that command would wait too."""
    rt, store, session = await runtime_with_worker()
    _, cmds = rt.state.submit(parse_tasks({"task_id": "t1", "type": "custom", "config": {"name": "noop"}}), 100.0)
    await rt.execute(cmds, linger_s=0.002)
    assert store.lingers[-1] == 0.002  # the assignment went out provisionally: nothing waits
    store.gated = True
    blocked = rt.execute([Save(MetaRow("a", "1")), Send("w", m.Cancel(m.TaskRef("u", 1), "gone"))])
    _, cmds = rt.state.submit(parse_tasks({"task_id": "t2", "type": "custom", "config": {"name": "noop"}}), 100.0)
    behind = rt.execute(cmds, linger_s=0.002)
    assert store.lingers[-1] == 0.0  # its assignment waits behind the cancel, so it is written at once
    store.release()
    await asyncio.gather(blocked, behind)


async def _awaiting(fut: asyncio.Future[None]) -> None:
    await fut


@pytest.mark.asyncio
async def test_a_cancelled_caller_still_gets_the_confirm_and_the_sends_out() -> None:
    """An HTTP handler awaiting execute() may be cancelled (shutdown, a client gone): the worker
    must still get its confirm, and the event's other commands must still run."""
    rt, store, session = await runtime_with_worker()
    store.gated = True
    _, cmds = rt.state.submit(parse_tasks({"task_id": "t1", "type": "custom", "config": {"name": "noop"}}), 100.0)
    caller = asyncio.ensure_future(_awaiting(rt.execute(cmds)))
    cancel = m.Cancel(m.TaskRef("u", 1), "gone")
    other = asyncio.ensure_future(_awaiting(rt.execute([Save(MetaRow("x", "1")), Send("w", cancel)])))
    await asyncio.sleep(0)
    caller.cancel()
    other.cancel()
    await asyncio.sleep(0)
    store.release()
    for _ in range(3):
        await asyncio.sleep(0)
    assert sent(session)[1:] == [m.Confirm(1), cancel]  # after the provisional assignment


@pytest.mark.asyncio
async def test_an_append_that_raises_sends_nothing() -> None:
    rt, store, session = await runtime_with_worker()
    store.broken = True
    _, cmds = rt.state.submit(parse_tasks({"task_id": "t1", "type": "custom", "config": {"name": "noop"}}), 100.0)
    with pytest.raises(StoreError):
        rt.execute(cmds)
    with pytest.raises(StoreError):
        rt.execute([Save(MetaRow("a", "1")), Notify(("t1",))])
    assert sent(session) == [] and session.provisional == 0 and not rt._undurable


@pytest.mark.asyncio
@pytest.mark.parametrize("route", ["submit", "get"])
async def test_a_wait_that_begins_after_the_shutdown_answers_at_once(route: str) -> None:
    """A ``?wait`` request still on its way to its wait (here: its submission's records being
    written) when the coordinator begins to stop is answered at once too, not after its 300 s."""
    rt, store, _ = await runtime_with_worker()
    principal = Principal(key_id="k", role=Role.ADMIN, name="k", via="api_key")
    doc = b'{"task_id": "t1", "type": "custom", "config": {"name": "noop"}}'
    if route == "submit":
        store.gated = True
        answer = asyncio.ensure_future(api.submit(rt, principal, doc, 300.0))
        async with asyncio.timeout(5):
            while not store.held:  # its records are being written: it has not reached its wait
                await asyncio.sleep(0.001)
        rt.shutdown("coordinator shutting down")
        store.release()
    else:
        await api.submit(rt, principal, doc, 0.0)
        rt.shutdown("coordinator shutting down")
        request = make_mocked_request("GET", "/api/v1/tasks/t1?wait=300", match_info={"task_id": "t1"},
                                      app=web.Application())
        request.app[RUNTIME] = rt
        answer = asyncio.ensure_future(api.get_task(request))
    async with asyncio.timeout(5):
        result = await answer
    body = result[1]["tasks"][0] if route == "submit" else msgspec.json.decode(result.body)  # type: ignore[union-attr]
    assert body["state"] == "assigned" and body["outcome"] is None  # as it is: sent to the worker, not done
