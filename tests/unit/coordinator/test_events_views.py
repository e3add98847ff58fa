"""The change feed's ring and resume rules, and the read side's task pages and overview: pure,
no loop, ``now`` passed in."""

from __future__ import annotations

import pytest

from distributed_testing.coordinator import views
from distributed_testing.coordinator.events import RESET, Event, EventHub, Subscriber, sse_frame
from distributed_testing.coordinator.state import CoordinatorState, Policy
from distributed_testing.coordinator.store.base import KeyRow, ResultRow, TaskRow
from distributed_testing.errors import ValidationError
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


def state_with(n: int) -> CoordinatorState:
    st = CoordinatorState(Policy())
    for i in range(n):
        doc = {"task_id": f"t{i:03d}", "type": "custom", "config": {"name": "noop"},
               "requirements": {"tags": ["gpu"] if i % 2 else []}}
        st.submit(specs.parse_tasks(doc), T0 + i * 60, submitted_by="alice" if i < 5 else "bob")
    return st


def test_task_pages_are_cut_on_the_server_newest_first_with_every_filter() -> None:
    st = state_with(12)
    page, total = views.list_tasks(st, views.parse_filter({"limit": "5", "offset": "5"}))
    assert total == 12 and [t.task_id for t in page] == ["t006", "t005", "t004", "t003", "t002"]
    page, total = views.list_tasks(st, views.parse_filter({"tag": "gpu", "submitted_by": "alice"}))
    assert total == 2 and [t.task_id for t in page] == ["t003", "t001"]
    page, total = views.list_tasks(st, views.parse_filter({"since": str(T0 + 600), "until": str(T0 + 720)}))
    assert [t.task_id for t in page] == ["t011", "t010"]
    assert views.list_tasks(st, views.parse_filter({"state": "running"}))[1] == 0


@pytest.mark.parametrize("query, field", [({"limit": "0"}, "limit"), ({"offset": "-1"}, "offset"),
                                          ({"limit": "x"}, "(query)"), ({"colour": "red"}, "colour")])
def test_a_bad_task_query_names_what_is_wrong(query: dict[str, str], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        views.parse_filter(query)
    assert err.value.errors[0]["field"] == field


def test_the_overview_counts_the_queue_per_minute_over_the_last_hour() -> None:
    st = state_with(12)  # one task a minute, nothing ever dispatched: no worker
    now = T0 + 12 * 60
    o = views.overview(st, now)
    assert o["tasks_by_state"] == {"pending": 12} and o["queue_depth"] == 12
    s = o["series"]
    assert len(s["queue_depth"]) == 60 and s["queue_depth"][-1] == 12
    assert sum(s["submitted_per_s"]) * 60 == pytest.approx(12)
    assert s["queue_depth"] == sorted(s["queue_depth"])  # only grows: nothing left the queue
    assert o["recent_failures"] == [] and o["workers_by_state"] == {}
