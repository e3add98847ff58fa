"""The worker's choice of coordinator for each connection attempt (worker/coordinators.py)."""

from __future__ import annotations

import pytest

from distributed_testing.worker.coordinators import Candidates


def test_attempts_take_the_configured_urls_in_turn_and_a_round_ends_when_each_failed() -> None:
    c = Candidates(["http://a:1", "http://b:2"])
    assert c.next() == "http://a:1"
    c.failed("http://a:1")
    assert not c.round_complete()
    assert c.next() == "http://b:2"
    c.failed("http://b:2")
    assert c.round_complete()
    c.new_round()
    assert not c.round_complete() and c.next() == "http://a:1"


def test_a_named_leader_goes_first_and_joins_the_candidates() -> None:
    c = Candidates(["http://a:1", "http://b:2"])
    c.failed(c.next())
    c.redirect("http://c:3")
    assert not c.round_complete()  # a leader is pending
    assert c.next() == "http://c:3" and c.urls == ["http://a:1", "http://b:2", "http://c:3"]
    c.connected("http://c:3")
    assert c.next() == "http://a:1"  # after losing c: the one after it, round the list


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
