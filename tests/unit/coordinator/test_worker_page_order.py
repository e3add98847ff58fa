"""``GET /api/v1/workers`` pages in worker id order from an index kept as workers appear (not a
sort of the whole fleet per request): new ids, sessions replaced, disconnects and workers restored
from the store all keep the order and the total true."""

from __future__ import annotations

import random

from distributed_testing.coordinator import views
from distributed_testing.coordinator.core.policy import Policy
from distributed_testing.coordinator.core.rows import Snapshot, WorkerRow
from distributed_testing.coordinator.core.state import CoordinatorState
from distributed_testing.protocol import messages as m

T0 = 1000.0


def register(st: CoordinatorState, wid: str, session: str) -> None:
    reg = m.Register(worker_id=wid, name=wid, protocol_version=m.PROTOCOL_VERSION, hardware={},
                     capabilities=["cpu"], tags=[], max_concurrent=1)
    st.register(reg, session, T0, key_id=f"k-{wid}")


def paged(st: CoordinatorState, limit: int) -> list[str]:
    out: list[str] = []
    while True:
        page, total = views.worker_page(st, limit, len(out))
        assert total == len(st.workers)
        if not page:
            return out
        out += [w["worker_id"] for w in page]


def test_pages_follow_worker_id_order_through_restore_reconnects_and_new_ids() -> None:
    rng = random.Random(3)
    st = CoordinatorState(Policy())
    restored = [f"w{i:04d}" for i in rng.sample(range(2000), 50)]
    st.restore(Snapshot(workers=[WorkerRow(worker_id=wid, name=wid, hardware={}, capabilities=["cpu"], tags=[],
                                           first_seen=T0, last_seen=T0, state="disconnected")
                                 for wid in restored]), T0)
    assert paged(st, 7) == sorted(restored)
    ids = [f"w{i:04d}" for i in rng.sample(range(2000), 300)]
    for n, wid in enumerate(ids):
        register(st, wid, f"s{n}")
        if n % 50 == 0:
            assert paged(st, 13) == sorted(st.workers)
    for n, wid in enumerate(rng.sample(ids, 40)):  # replaced sessions and disconnects keep their place
        register(st, wid, f"again{n}")
        st.disconnect(wid, f"again{n}", T0 + 1)
    expect = sorted(set(restored) | set(ids))
    assert paged(st, 100) == expect
    assert [w["worker_id"] for w in views.worker_page(st, 5, 10)[0]] == expect[10:15]
    assert views.worker_page(st, 10, len(expect))[0] == []
