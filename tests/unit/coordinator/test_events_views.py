"""The change feed's ring and resume rules, and the read side's task pages and overview: pure,
no loop, ``now`` passed in."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from distributed_testing.coordinator import views
from distributed_testing.coordinator.core.commands import Save
from distributed_testing.coordinator.core.policy import Policy
from distributed_testing.coordinator.core.rows import KeyRow, ResultRow, TaskRow
from distributed_testing.coordinator.core.state import CoordinatorState
from distributed_testing.coordinator.events import RESET, Event, EventHub, Subscriber, sse_frame
from distributed_testing.coordinator.store import MemoryStore
from distributed_testing.errors import ValidationError
from distributed_testing.protocol import messages as m
from distributed_testing.tasks import spec as specs

T0 = 1_800_000_000.0


def row(task_id: str, state: str = "pending") -> TaskRow:
    return TaskRow(task_id=task_id, type="custom", state=state, attempt=0, priority=0, submitted_at=T0, updated_at=T0,
                   digest="d", spec={})


def drain(sub: Subscriber) -> list[Event]:
    out = []
    while not sub.queue.empty():
        out.append(sub.queue.get_nowait())
    return out


def test_nothing_is_published_or_kept_while_nobody_listens_and_keys_never_are() -> None:
    hub = EventHub()
    assert not hub.active
    sub = hub.subscribe(None)
    assert hub.active
    hub.publish_records([row("a"), KeyRow(key_id="k", name="n", role="admin", hash="h", created_at=T0),
                         ResultRow(task_id="a", attempt=1, worker_id="w", status="succeeded", started_at=T0,
                                   finished_at=T0, received_at=T0)])
    got = drain(sub)
    assert [(e.kind, e.data["task_id"]) for e in got] == [("task", "a"), ("result", "a")]
    assert got[0].data["run_id"] is None  # a task event names its run (the dashboard's run page listens for its own)
    assert got[0].id == f"{hub.epoch}-1" and got[1].id == f"{hub.epoch}-2"
    assert sse_frame(got[0]).startswith(f"id: {hub.epoch}-1\nevent: task\ndata: {{".encode())
    hub.unsubscribe(sub)
    assert not hub.active


def test_a_reconnect_gets_what_it_missed_and_a_stale_or_foreign_id_gets_a_reset() -> None:
    hub = EventHub(capacity=3)
    keep = hub.subscribe(None)
    for i in range(5):
        hub.publish_records([row(f"t{i}")])
    assert len(drain(keep)) == 5
    resumed = hub.subscribe(f"{hub.epoch}-3")  # saw up to t2: gets t3, t4 (both still in the ring)
    assert [e.data["task_id"] for e in drain(resumed)] == ["t3", "t4"]
    assert [e.kind for e in drain(hub.subscribe(f"{hub.epoch}-1"))] == [RESET]  # older than the ring
    assert [e.kind for e in drain(hub.subscribe("other-4"))] == [RESET]  # another coordinator run
    assert [e.kind for e in drain(hub.subscribe(f"{hub.epoch}-9"))] == [RESET]  # from the future
    assert drain(hub.subscribe(hub.last_id)) == []  # up to date


def test_after_a_time_with_nobody_listening_a_resume_gets_a_reset_not_a_silent_gap() -> None:
    hub = EventHub()
    only = hub.subscribe(None)
    hub.publish_records([row("a")])
    (seen,) = drain(only)
    hub.unsubscribe(only)
    hub.publish_records([row("missed")])  # not recorded: nobody listens
    assert [e.kind for e in drain(hub.subscribe(seen.id))] == [RESET]


def test_a_client_too_far_behind_gets_one_reset_instead_of_an_unbounded_queue() -> None:
    hub = EventHub(queue_max=2)
    slow = hub.subscribe(None)
    for i in range(10):
        hub.publish_records([row(f"t{i}")])
    # t0, t1 queued; t2 overflows: [reset]; t3 follows it; t4 overflows again: [reset]; ... t9
    got = drain(slow)
    assert [e.kind for e in got] == [RESET, "task"] and got[0].id == f"{hub.epoch}-9" and got[1].data["task_id"] == "t9"
    hub.close()
    assert drain(slow) == [None] and not hub.active


def state_with(n: int) -> tuple[CoordinatorState, MemoryStore]:
    """``n`` tasks, one a minute, in the state and (as the runtime would have saved them) a store."""
    st, store = CoordinatorState(Policy()), MemoryStore()
    rows = []
    for i in range(n):
        doc = {"task_id": f"t{i:03d}", "type": "custom", "config": {"name": "noop"},
               "requirements": {"tags": ["gpu"] if i % 2 else []}}
        _, cmds = st.submit(specs.parse_tasks(doc), T0 + i * 60, submitted_by="alice" if i < 5 else "bob")
        rows += [c.record for c in cmds if isinstance(c, Save)]
    asyncio.run(_fill(store, rows))
    return st, store


async def _fill(store: MemoryStore, rows: list[Any]) -> None:
    await store.open()
    await store.append(rows)


def page_of(st: CoordinatorState, store: MemoryStore, query: dict[str, str]) -> tuple[list[str], int]:
    page, total = asyncio.run(views.task_page(st, store, views.parse_filter(query)))
    return [t["task_id"] for t in page], total


def test_a_stream_opened_after_the_hub_closed_ends_at_once() -> None:
    """The coordinator is stopping: a stream that subscribes now would hold its shutdown."""
    hub = EventHub()
    before = hub.subscribe(None)
    hub.close()
    after = hub.subscribe(None)
    assert before.queue.get_nowait() is None and after.queue.get_nowait() is None and not hub.active


def test_task_pages_are_cut_by_the_store_newest_first_with_every_filter() -> None:
    st, store = state_with(12)
    assert page_of(st, store, {"limit": "5", "offset": "5"}) == (["t006", "t005", "t004", "t003", "t002"], 12)
    assert page_of(st, store, {"tag": "gpu", "submitted_by": "alice"}) == (["t003", "t001"], 2)
    assert page_of(st, store, {"since": str(T0 + 600), "until": str(T0 + 720)})[0] == ["t011", "t010"]
    assert page_of(st, store, {"state": "running"})[1] == 0
    assert page_of(st, store, {"state": "", "tag": ""})[1] == 12  # a blank form field filters nothing
    # a task shown from memory carries its live pending reason; one only in the store its row
    page, _ = asyncio.run(views.task_page(st, store, views.parse_filter({"limit": "1"})))
    assert page[0]["pending_reason"] and "spec" not in page[0] and "history" not in page[0]
    st.tasks.clear()
    page, _ = asyncio.run(views.task_page(st, store, views.parse_filter({"limit": "1"})))
    assert page[0]["task_id"] == "t011" and page[0]["state"] == "pending"


@pytest.mark.parametrize("query, field", [({"limit": "0"}, "limit"), ({"offset": "-1"}, "offset"),
                                          ({"limit": "x"}, "limit"), ({"colour": "red"}, "colour")])
def test_a_bad_task_query_names_what_is_wrong(query: dict[str, str], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        views.parse_filter(query)
    assert err.value.errors[0]["field"] == field


def test_the_overview_keeps_the_last_hour_per_minute_in_memory_seeded_by_the_store() -> None:
    st, store = state_with(3)
    now = T0 + 3 * 60 + 10
    activity = views.Activity()
    since = activity.since(now)
    assert since % 60 == 0 and now - 3600 < since + 60 and since <= now - 3540
    stats = asyncio.run(_stats(store, since, activity))
    activity.seed(stats, since)
    failed = st.get("t002")
    failed.state, failed.updated_at, failed.outcome = "failed", now, {"error": "boom"}
    activity.finished(failed)
    activity.submitted(now, 2)
    for minute in range(3):
        activity.sample_depth(T0 + minute * 60 + 1, minute + 1)
    o = views.overview(st, activity, now)
    assert o["tasks_by_state"] == {"pending": 3} and o["queue_depth"] == 3
    s = o["series"]
    assert len(s["queue_depth"]) == 60 and s["start"] == since
    assert sum(s["submitted_per_s"]) * 60 == pytest.approx(5)  # 3 from the store, 2 since
    assert s["submitted_per_s"][-1] * 60 == pytest.approx(2) and sum(s["finished_per_s"]) * 60 == pytest.approx(1)
    assert s["queue_depth"][-4:] == [1, 2, 3, 3]  # one sample per minute; the current one is live
    assert [f["task_id"] for f in o["recent_failures"]] == ["t002"] and o["recent_failures"][0]["error"] == "boom"
    assert o["workers_by_state"] == {}
    # an hour later the old minutes have left memory
    later = now + 3600
    activity.sample_depth(later, 0)
    activity.submitted(later)
    assert sum(activity.series(later, 0)["submitted_per_s"]) * 60 == pytest.approx(1)
    assert len(activity._counts) <= activity.n and len(activity._depth) <= activity.n


async def _stats(store: MemoryStore, since: float, activity: views.Activity) -> Any:
    return await store.task_stats(since, activity.bucket_s, activity.n, activity.failures_kept)


def test_the_overview_failures_are_bounded_newest_first() -> None:
    activity = views.Activity(failures=3)
    st, _ = state_with(5)
    for i, tid in enumerate(["t000", "t001", "t002", "t003", "t004"]):
        t = st.get(tid)
        t.state, t.updated_at = "error", T0 + i
        activity.finished(t)
    assert [f["task_id"] for f in activity.recent_failures()] == ["t004", "t003", "t002"]


def test_workers_are_paged_in_id_order() -> None:
    st = CoordinatorState(Policy())
    for wid in ("w3", "w1", "w2"):
        reg = m.Register(worker_id=wid, name=wid, protocol_version=m.PROTOCOL_VERSION, hardware={},
                         capabilities=["cpu"], tags=[], max_concurrent=1)
        st.register(reg, f"s-{wid}", T0, key_id=f"k-{wid}")
    assert [w["worker_id"] for w in views.worker_page(st, 2, 1)[0]] == ["w2", "w3"]
    assert views.worker_page(st, *views.parse_page({}))[1] == 3
    st.disconnect("w2", "s-w2", T0 + 1)
    assert [w["worker_id"] for w in views.worker_page(st, 10, 0, "disconnected")[0]] == ["w2"]
    assert views.worker_page(st, 1, 0, "ready") == (views.worker_page(st, 1, 0)[0], 2)  # total counts the matches
    assert views.parse_page({"state": "disconnected"}) == (views.MAX_PAGE, 0)
    for query, field in (({"limit": "0"}, "limit"), ({"offset": "x"}, "offset"), ({"state": "gone"}, "state"),
                         ({"status": "ready"}, "status"),
                         ({"limit": "10001"}, "limit")):
        with pytest.raises(ValidationError) as err:
            views.parse_page(query)
        assert err.value.errors[0]["field"] == field
