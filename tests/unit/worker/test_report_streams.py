"""Each test's entry streamed while its task runs (``reports``): the worker sends what is new of
each attempt, again from the first after a reconnect, never for an attempt it no longer holds;
the coordinator keeps each test once, in order, within its bound."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from distributed_testing.coordinator import tasklogs
from distributed_testing.coordinator.tasklogs import TestReports
from distributed_testing.protocol import messages as m
from distributed_testing.worker.tasklogs import MESSAGE_BYTES, ReportStreams


def _entry(name: str, pad: int = 0) -> dict[str, Any]:
    return {"nodeid": f"t.py::{name}", "outcome": "passed", "duration_s": 0.0, "message": None,
            "reports": [{"when": "call", "outcome": "passed", "pad": "x" * pad}]}


def test_the_worker_sends_what_is_new_again_after_a_reconnect_and_nothing_of_an_attempt_it_dropped() -> None:
    async def scenario() -> list[m.Message]:
        sent: list[m.Message] = []
        ready, held = [True], {m.TaskRef("a", 1), m.TaskRef("b", 1)}
        streams = ReportStreams(sent.append, lambda: ready[0], lambda ref: ref in held)
        put_a, put_b = streams.sink(m.TaskRef("a", 1)), streams.sink(m.TaskRef("b", 1))
        put_a("/tree", _entry("t0"))
        put_a("/tree", _entry("big", MESSAGE_BYTES))  # over a message alone: left to the result
        put_b("/tree", _entry("u0"))
        streams.flush()
        put_a("/tree", _entry("t1"))
        streams.flush()
        ready[0] = False
        streams.session_ended()
        streams.flush()  # no session: nothing goes
        ready[0] = True
        held.discard(m.TaskRef("b", 1))
        streams.flush()  # a new session: a's tests again from the first; b's attempt is gone
        streams.close()
        return sent

    sent = asyncio.run(scenario())
    pages = [[(c.task.task_id, c.first, [t["nodeid"] for t in c.tests]) for c in msg.chunks]
             for msg in sent if isinstance(msg, m.TaskReports)]
    assert pages == [[("a", 0, ["t.py::t0"]), ("b", 0, ["t.py::u0"])], [("a", 1, ["t.py::t1"])],
                     [("a", 0, ["t.py::t0", "t.py::t1"])]]


def test_the_worker_holds_no_test_for_a_coordinator_that_keeps_none() -> None:
    async def scenario() -> tuple[list[m.Message], ReportStreams]:
        sent: list[m.Message] = []
        keeps = [False]  # its registered did not say reports (an older coordinator)
        streams = ReportStreams(sent.append, lambda: keeps[0], lambda ref: True, lambda: keeps[0])
        put = streams.sink(m.TaskRef("a", 1))
        put("/tree", _entry("t0"))
        assert streams._tests == {} and streams._timer is None  # nothing held, no timer
        keeps[0] = True  # a coordinator that keeps them: held and sent
        put("/tree", _entry("t1"))
        keeps[0] = False  # a reconnect to one that keeps none before the flush: what was held goes
        streams.flush()
        assert streams._tests == {} and streams._timer is None
        streams.close()
        return sent, streams

    sent, _ = asyncio.run(scenario())
    assert sent == []


def test_the_coordinator_keeps_each_test_once_in_order_within_its_bound(monkeypatch: Any) -> None:
    kept = TestReports()
    kept.put("t", 1, "/tree", 0, [_entry("a")])
    kept.put("t", 1, "/tree", 0, [_entry("a"), _entry("b")])  # a re-send after a reconnect
    kept.put("t", 1, "/tree", 5, [_entry("z")])  # after a gap: left to the result
    kept.put("t", 0, "/tree", 2, [_entry("old")])  # an older attempt
    got = kept.get("t")
    assert got is not None and [msgspec.json.decode(r)["nodeid"] for r in got.tests] == ["t.py::a", "t.py::b"]
    kept.put("t", 2, "/other", 0, [_entry("c")])  # a new attempt starts its own
    got = kept.get("t")
    assert got is not None and got.attempt == 2 and got.tree == "/other" and len(got.tests) == 1
    monkeypatch.setattr(tasklogs, "REPORTS_KEPT_BYTES", got.bytes + 200)
    kept.put("t", 2, "/other", 1, [_entry("d"), _entry("e", 500), _entry("f")])  # past the bound: none after
    got = kept.get("t")
    assert got is not None and [msgspec.json.decode(r)["nodeid"] for r in got.tests] == ["t.py::c", "t.py::d"]
    kept.end(["t"])
    assert kept.get("t") is None and len(kept) == 0
