"""Task lifecycle as one transition table. An illegal transition raises IllegalTransition.

::

    pending ──dispatch──▶ assigned ──started──▶ running ──result──▶ succeeded | failed |
       ▲                     │                     │                 timed_out | error
       └──────requeue────────┴─────────────────────┘
    pending | assigned | running ──cancel──▶ cancelled

``requeue`` happens when a worker is lost or hands a task back and retries remain; a result for
the superseded attempt is then acknowledged but never becomes the outcome.
"""

from __future__ import annotations

import typing
from typing import Literal

from ..errors import IllegalTransition

TaskState = Literal[
    "pending", "assigned", "running", "succeeded", "failed", "timed_out", "error", "cancelled"
]
TASK_STATES: tuple[str, ...] = typing.get_args(TaskState)
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "timed_out", "error", "cancelled"})
ACTIVE: frozenset[str] = frozenset({"assigned", "running"})
RESULT_STATES: frozenset[str] = frozenset({"succeeded", "failed", "timed_out", "error", "cancelled"})
# The states a worker is listed in (REST ?state=, dt workers --state, the dashboard, the dt_workers
# metric): its last heartbeat's health while connected (protocol.messages.WorkerState), else
# disconnected. Kept here, beside the task states, so the CLI needs no coordinator import.
WORKER_STATES: tuple[str, ...] = ("ready", "constrained", "draining", "disconnected")

_TABLE: dict[str, frozenset[str]] = {
    "pending": frozenset({"assigned", "cancelled", "error"}),
    "assigned": frozenset({"running", "pending"} | RESULT_STATES),
    "running": frozenset({"pending"} | RESULT_STATES),
    **{t: frozenset() for t in TERMINAL},
}


def check_transition(task_id: str, current: str, new: str, cause: str) -> None:
    """Raise IllegalTransition unless ``current → new`` is in the table."""
    if new not in _TABLE.get(current, frozenset()):
        raise IllegalTransition(f"task {task_id}: {current} → {new} is not allowed (cause: {cause})")


def is_terminal(state: str) -> bool:
    return state in TERMINAL
