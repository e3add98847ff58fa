"""The liveness contract in the pure scheduler: the coordinator gives each worker session its
heartbeat interval and TTL at registration (``Policy.liveness``), refuses an interval above its
maximum before changing anything, and ``tick`` declares a worker dead after ITS TTL without a
frame (``seen``/``heartbeat`` refresh it)."""

from __future__ import annotations

import math

import pytest

from distributed_testing.coordinator.core.commands import CloseWorker
from distributed_testing.coordinator.core.policy import Liveness, Policy
from distributed_testing.coordinator.core.state import CoordinatorState
from distributed_testing.errors import ValidationError
from distributed_testing.protocol import messages as m

T0 = 1000.0


def register(s: CoordinatorState, worker_id: str, interval: float, now: float = T0, session: str = "s1") -> None:
    s.register(m.Register(worker_id=worker_id, name=worker_id, protocol_version=m.PROTOCOL_VERSION, hardware={},
                          capabilities=["cpu"], tags=[], max_concurrent=1, heartbeat_interval_s=interval),
               session, now, key_id="k")


def closed(cmds: list[object]) -> list[CloseWorker]:
    return [c for c in cmds if isinstance(c, CloseWorker)]


@pytest.mark.parametrize(("asked", "contract"), [
    (0.0, Liveness(1.0, 3.0)),  # no preference: the coordinator's defaults
    (0.5, Liveness(0.5, 3.0)),  # faster: never below --worker-ttl
    (1.0, Liveness(1.0, 3.0)),
    (10.0, Liveness(10.0, 30.0)),  # the worker guide's example: three of its intervals
    (60.0, Liveness(60.0, 180.0)),  # the maximum itself is allowed
])
def test_default_policy_gives_each_interval_a_ttl_of_three_intervals_at_least_the_default(
        asked: float, contract: Liveness) -> None:
    assert Policy().liveness(asked) == contract


def test_the_ttl_keeps_the_operators_ratio_of_ttl_to_interval() -> None:
    policy = Policy(heartbeat_interval_s=0.2, worker_ttl_s=1.0, max_heartbeat_interval_s=30.0)
    assert policy.liveness(0) == Liveness(0.2, 1.0)
    assert policy.liveness(10) == Liveness(10.0, 50.0)


@pytest.mark.parametrize(("asked", "message"), [
    (61.0, "a heartbeat interval of 61s is above this coordinator's maximum of 60s (--max-heartbeat-interval); "
           "start the worker with --heartbeat-interval 60 or less"),
    (-1.0, "must be a number of seconds >= 0, got -1.0"),
    (math.nan, "must be a number of seconds >= 0, got nan"),
    (math.inf, "must be a number of seconds >= 0, got inf"),
])
def test_an_interval_the_policy_cannot_honour_is_refused_with_the_numbers(asked: float, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        Policy().liveness(asked)
    assert info.value.errors == [{"field": "register.heartbeat_interval_s", "error": message}]


def test_a_refused_register_changes_nothing() -> None:
    s = CoordinatorState(Policy(max_heartbeat_interval_s=5.0))
    with pytest.raises(ValidationError, match="above this coordinator's maximum of 5s"):
        register(s, "slow", 10.0)
    assert s.workers == {}


def test_each_worker_is_declared_dead_after_its_own_ttl() -> None:
    s = CoordinatorState(Policy())
    for wid, interval in (("fast", 0.5), ("default", 0.0), ("slow", 10.0)):
        register(s, wid, interval)
    assert {w: s.workers[w].liveness.ttl_s for w in s.workers} == {"fast": 3.0, "default": 3.0, "slow": 30.0}
    assert closed(s.tick(T0 + 3.0)) == []
    gone = closed(s.tick(T0 + 3.1))
    assert sorted(c.worker_id for c in gone) == ["default", "fast"]
    assert "nothing heard for 3.1s (its TTL is 3s)" in gone[0].reason
    assert closed(s.tick(T0 + 30.0)) == [] and s.workers["slow"].connected  # the guide's --heartbeat-interval 10
    [slow] = closed(s.tick(T0 + 30.2))
    assert slow.worker_id == "slow" and "(its TTL is 30s)" in slow.reason


def test_any_frame_on_the_current_session_keeps_a_worker_alive() -> None:
    s = CoordinatorState(Policy())
    register(s, "w", 0.0, session="new")
    s.seen("w", "old", T0 + 2.9)  # a frame on a replaced session proves nothing
    assert [c.worker_id for c in closed(s.tick(T0 + 3.1))] == ["w"]
    register(s, "v", 0.0, session="cur")
    s.seen("v", "cur", T0 + 2.9)
    assert closed(s.tick(T0 + 5.8)) == []
    assert [c.worker_id for c in closed(s.tick(T0 + 6.0))] == ["v"]
