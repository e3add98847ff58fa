"""A busy worker holds finished results while its last ``results`` message waits for an ack, and
sends them in one message when the ack comes (or when the hold ends); an idle one sends at once.

A real WorkerAgent (real pool children, real signed WebSocket) talks to a hand-driven coordinator
endpoint, so the test decides when acks go out.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hand_support import hand_session

from distributed_testing.protocol import messages as m
from distributed_testing.testing import wait_for
from distributed_testing.worker import runs as runs_mod

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]


async def test_results_wait_for_the_previous_ack_and_go_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs_mod, "RESULT_HOLD_S", 30.0)  # only the ack can end the hold here
    async with hand_session(tmp_path) as (coord, agent):
        await coord.assign("a")
        assert await coord.results() == ["a"]  # nothing unacknowledged: sent at once
        await coord.assign("b", "c", "d")
        # "not agent.running" would also hold before the worker has read the assignment
        await wait_for(lambda: len(agent.result_store.unacked_refs()) == 4, what="b, c and d to finish")
        assert coord.received.empty()  # finished, but held: "a" is not acknowledged yet
        await coord.ack("a")
        assert await coord.results() == ["b", "c", "d"]  # one message
        await coord.ack("b", "c", "d")
        await coord.assign("e")
        assert await coord.results() == ["e"]  # idle again: at once


async def test_a_missing_ack_delays_results_only_until_the_hold_ends(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runs_mod, "RESULT_HOLD_S", 0.3)
    async with hand_session(tmp_path) as (coord, agent):
        await coord.assign("a")
        assert await coord.results() == ["a"]
        await coord.assign("b")
        assert await coord.results() == ["b"]  # "a" never acknowledged: sent when the hold ended
        assert agent.result_store.unacked_refs() == [m.TaskRef("a", 1), m.TaskRef("b", 1)]
