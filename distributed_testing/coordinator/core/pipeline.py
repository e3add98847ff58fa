"""Pipelining: how many tasks a worker may hold beyond its slots. Pure: no I/O, no clock.

A worker with one slot that gets its next task only when its result has reached the coordinator
waits a full round trip between tasks; for millisecond tasks that round trip is most of the time.
So the coordinator may send a worker a few tasks *ahead*: they wait in the worker's queue and
start as its slots free. How many is the worker's **window**, kept here per worker session:

* it never exceeds the worker's ``--pipeline-depth`` (``Register.pipeline_depth``; 0: never);
* it follows the durations the worker reports for pipelined tasks (``finished_at - started_at``
  of each result, an exponentially weighted average): a task may wait behind at most about
  ``budget_s`` of queued work, so the target is ``budget_s / typical duration`` (deep for
  millisecond tasks, 0 once tasks take ``budget_s`` or longer);
* it grows like a slow start (1, 2, 4, ... up to the target) and shrinks to the target at once.

The window is only an upper bound: the state machine sends nothing ahead to a worker that holds
a task which must run alone, or whose slots are all taken by tasks that ran past the worker's
``started`` delay (something long runs there), and it takes tasks back from such a worker for
an idle one (``TakeBack``); see :mod:`.takeback`.
"""

from __future__ import annotations

from dataclasses import dataclass

# Weight of the newest duration in the running average: a handful of short results after a long
# one reopens the window, one long result closes it most of the way.
ALPHA = 0.25


@dataclass(slots=True)
class Pace:
    """The window of one worker session (see the module docstring)."""

    limit: int  # the worker's --pipeline-depth
    window: int = 0
    typical_s: float | None = None  # running average of the durations observed

    def observe(self, duration_s: float, budget_s: float) -> int:
        """A pipelined task ran ``duration_s`` here; returns the new window."""
        d = duration_s if duration_s > 0 else 0.0
        self.typical_s = d if self.typical_s is None else self.typical_s + ALPHA * (d - self.typical_s)
        target = self.target(budget_s)
        self.window = target if target <= self.window else min(target, max(1, 2 * self.window))
        return self.window

    def target(self, budget_s: float) -> int:
        """The window the observed durations call for (before the slow start)."""
        if self.limit <= 0 or self.typical_s is None or self.typical_s >= budget_s:
            return 0
        if self.typical_s <= 0:
            return self.limit
        return min(self.limit, int(budget_s / self.typical_s))
