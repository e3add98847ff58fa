"""What a standby's forwarding decides from its cluster view (coordinator/forward.py): when a
leader is worth waiting for, and which members its 503 reports silent."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from distributed_testing.coordinator import forward
from distributed_testing.coordinator.group import Group, Member


def member(url: str, age_s: float, member_id: str) -> Member:
    return Member(member_id, url, "standby", None, age_s, 0.0)


def runtime(leader: str | None, *members: Member) -> Any:
    group = SimpleNamespace(leader_url=leader, members=list(members))
    group.silent_urls = lambda: Group.silent_urls(group)  # type: ignore[arg-type]
    return SimpleNamespace(group=group, advertise_url="http://b:2", jwt_secret=b"")


def test_a_leader_restarted_at_its_url_is_judged_by_its_own_row_not_the_dead_one() -> None:
    # the process killed at http://a:1 left its row (seen 40 s ago); the one restarted there leads now
    rt = runtime("http://a:1", member("http://a:1", 40.0, "old"), member("http://a:1", 0.2, "new"),
                 member("http://b:2", 0.1, "b"))
    assert forward.gone(rt, "http://a:1") is None
    assert forward.leader_for(rt, again=False) == "http://a:1"
    assert msgspec.json.decode(forward.unavailable_body(rt, "x"))["unhealthy"] == []


def test_a_silent_or_replaced_leader_is_not_waited_for_and_is_reported() -> None:
    rt = runtime("http://a:1", member("http://a:1", forward.LEADER_SILENT_S + 0.5, "a"), member("http://b:2", 0.1, "b"))
    assert "has not been seen" in (forward.gone(rt, "http://a:1") or "")
    body = msgspec.json.decode(forward.unavailable_body(rt, "why"))
    assert body == {"error": "not_leader", "leader": None, "message": "why", "unhealthy": ["http://a:1"]}
    rt.group.leader_url = "http://c:3"  # another member took the lease
    assert "no longer leads" in (forward.gone(rt, "http://a:1") or "")
    rt.group.leader_url = None
    assert "no longer leads" in (forward.gone(rt, "http://a:1") or "")


def test_a_request_over_https_goes_on_to_a_plain_http_leader_only_on_loopback() -> None:
    for leader, allowed in (("http://10.0.0.5:8080", False), ("http://coord-a.internal:8080", False),
                            ("http://127.0.0.1:8080", True), ("http://[::1]:8080", True),
                            ("http://localhost:8080", True), ("https://coord-a.internal:8443", True)):
        rt = runtime(leader, member(leader, 0.1, "a"))
        assert forward.leader_for(rt, again=False) == leader  # over plain http: as before
        if allowed:
            assert forward.leader_for(rt, again=False, secure=True) == leader
        else:
            with pytest.raises(forward.Unavailable, match="in clear"):
                forward.leader_for(rt, again=False, secure=True)
