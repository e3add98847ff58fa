"""The task lifecycle table, enumerated: every allowed transition passes, every other pair raises."""

from __future__ import annotations

import itertools
from typing import get_args

import pytest

from distributed_testing.errors import IllegalTransition
from distributed_testing.tasks.states import ACTIVE, TERMINAL, TaskState, check_transition, is_terminal

STATES: tuple[str, ...] = get_args(TaskState)
RESULTS = {"succeeded", "failed", "timed_out", "error", "cancelled"}

# The lifecycle as documented in states.py, written out independently of its table.
ALLOWED: set[tuple[str, str]] = (
    {("pending", "assigned"), ("pending", "cancelled"), ("pending", "error")}
    | {("assigned", "running"), ("assigned", "pending")}
    | {("assigned", r) for r in RESULTS}
    | {("running", "pending")}
    | {("running", r) for r in RESULTS}
)
PAIRS = list(itertools.product(STATES, STATES))


def test_state_sets() -> None:
    assert set(STATES) == {"pending", "assigned", "running", *RESULTS}
    assert TERMINAL == RESULTS
    assert ACTIVE == {"assigned", "running"}
    assert [s for s in STATES if is_terminal(s)] == [s for s in STATES if s in RESULTS]


@pytest.mark.parametrize(("current", "new"), sorted(ALLOWED))
def test_allowed_transition_passes(current: str, new: str) -> None:
    check_transition("t-1", current, new, "because")


@pytest.mark.parametrize(("current", "new"), [p for p in PAIRS if p not in ALLOWED])
def test_every_other_pair_raises(current: str, new: str) -> None:
    with pytest.raises(IllegalTransition) as info:
        check_transition("t-1", current, new, "the cause")
    msg = str(info.value)
    assert "t-1" in msg and current in msg and new in msg and "the cause" in msg


def test_terminal_states_are_final() -> None:
    for t in TERMINAL:
        for new in STATES:
            with pytest.raises(IllegalTransition):
                check_transition("t", t, new, "x")


@pytest.mark.parametrize("bogus", ["", "queued", "PENDING"])
def test_unknown_states_raise(bogus: str) -> None:
    with pytest.raises(IllegalTransition):
        check_transition("t", bogus, "assigned", "x")
    with pytest.raises(IllegalTransition):
        check_transition("t", "pending", bogus, "x")
