"""The worker's choice of coordinator for each connection attempt (worker/coordinators.py)."""

from __future__ import annotations

import pytest

from distributed_testing.worker.coordinators import Candidates


def test_attempts_take_the_configured_urls_in_turn_and_a_round_ends_when_each_failed() -> None:
    c = Candidates(["http://a:1", "http://b:2"])
    assert c.next() == "http://a:1"
    c.failed("http://a:1", alive=True)
    assert not c.round_complete()
    assert c.next() == "http://b:2"
    c.failed("http://b:2", alive=True)
    assert c.round_complete()
    c.new_round()
    assert not c.round_complete() and c.next() == "http://a:1"


def test_a_named_leader_goes_first_only_when_it_is_a_member() -> None:
    c = Candidates(["http://a:1", "http://b:2"])
    c.failed(c.next(), alive=True)
    assert "not a member" in (c.refusal("http://a:1", "http://c:3") or "")
    c.learn({"members": [{"url": "http://c:3"}]}, "http://a:1")
    assert c.refusal("http://a:1", "http://c:3") is None and c.redirect("http://c:3")
    assert not c.round_complete()  # a leader is pending
    assert c.next() == "http://c:3" and c.urls == ["http://a:1", "http://b:2", "http://c:3"]
    c.connected("http://c:3")
    assert c.next() == "http://a:1"  # after losing c: the one after it, round the list


def test_a_lost_leader_is_not_followed_back_while_it_counts_as_just_failed() -> None:
    c = Candidates(["http://a:1", "http://b:2", "http://c:3"])
    c.connected(c.next(0.0))
    c.lost("http://a:1", 10.0)  # say it was paused: b and c keep naming it for a lease TTL
    assert c.next(11.0) == "http://b:2"
    assert not c.redirect("http://a:1", 11.0)
    c.failed("http://b:2", 11.0, alive=True)
    assert c.next(11.1) == "http://c:3"
    c.failed("http://c:3", 11.1, alive=True)
    assert c.round_complete(11.2)  # a is not tried in this round: it failed just now
    c.new_round()
    assert c.next(11.5) == "http://b:2"
    assert c.redirect("http://a:1", 25.0)  # long after: it may be the leader again
    c.lost("http://a:1", 30.0)
    assert not c.redirect("http://a:1", 31.0)
    # a standby names it and does not see it silent: it failed, came back and leads again
    assert c.redirect("http://a:1", 31.0, seen_alive=True) and c.next(31.0) == "http://a:1"


def test_the_cluster_view_adds_members_and_a_session_resets_the_round() -> None:
    c = Candidates(["http://a:1"])
    url = c.next()
    c.connected(url)
    view = {"members": [{"url": "http://a:1"}, {"url": "http://b:2/"}, {"url": "ws://odd"}, {"url": None}, "x"]}
    assert c.learn(view) == ["http://b:2"]
    assert c.learn({"members": "nonsense"}) == []
    c.failed("http://a:1")
    assert not c.round_complete()  # b has not been tried
    assert c.next() == "http://b:2"


def test_no_urls_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        Candidates([])
