"""The client's member policy (client.Members): where a credential may go, and in what order
members are tried."""

from __future__ import annotations

from distributed_testing.client import Members, first_byte_timeout


def test_the_downgrade_rule_holds_for_configured_and_learned_members() -> None:
    group = Members(["https://a:1", "http://b:2"])
    assert "plain http" in (group.refusal("https://a:1", "http://b:2") or "")  # even a configured one
    assert group.refusal("http://b:2", "https://A:1/") is None
    assert "not a member" in (group.refusal("https://a:1", "https://evil:1") or "")
    assert group.learn({"members": [{"url": "http://c:3"}, {"url": "https://d:4/"}]}, "https://a:1") == ["https://d:4"]
    assert group.learn({"members": [{"url": "http://c:3"}, {"url": "ftp://e"}, "x"]}, "http://b:2") == ["http://c:3"]
    assert "not an http(s) URL" in (group.refusal("https://a:1", "javascript:x") or "")


def test_a_member_that_just_failed_is_tried_last_until_it_ages_out() -> None:
    group = Members(["http://a:1", "http://b:2", "http://c:3"])
    assert group.order(0.0) == ["http://a:1", "http://b:2", "http://c:3"]
    group.failed("http://a:1", 100.0)
    group.failed("http://b:2", 101.0)
    assert group.order(102.0) == ["http://c:3", "http://a:1", "http://b:2"]
    assert group.order(102.0, "http://b:2") == ["http://c:3", "http://a:1", "http://b:2"]
    assert group.order(110.5) == ["http://a:1", "http://c:3", "http://b:2"]  # a aged out, b not yet
    group.succeeded("http://b:2")
    assert group.order(102.0)[:2] == ["http://b:2", "http://c:3"]


def test_a_long_poll_gets_its_wait_on_top_of_the_first_byte_bound() -> None:
    assert first_byte_timeout("/api/v1/tasks?wait=30", 5.0) == 35.0
    assert first_byte_timeout("/api/v1/tasks", 5.0) == 5.0
    assert first_byte_timeout("/api/v1/tasks?wait=x", 5.0) == 5.0
