"""What ``dt submit --wait`` shows while it waits.

:class:`Tracker` is pure: it takes each poll's task views and says what changed (a task's state,
a pending task becoming unschedulable or schedulable again, or a running task's progress report,
such as a benchmark's ``cnn b8 fp32: 1.23 ms (3 of 6)``: one that came ``PROGRESS_STEP`` further,
reached the end, or came ``PROGRESS_QUIET_S`` after the last one said, so a training run's report
every half second does not flood a CI log). Two displays read it:
:class:`PlainProgress` writes one timestamped line per change and never redraws (CI logs);
:class:`LiveProgress` redraws a `rich` table on a terminal: counts by state, each running task's
worker, elapsed time and latest progress, each pending task's reason.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .report import iso_time

MAX_LIVE_ROWS = 20  # task rows on the live display; the rest are counted in one line
PROGRESS_STEP = 0.1  # a progress report is a change once it is a tenth further than the last one said
PROGRESS_QUIET_S = 30.0  # ... or this long after it (the reports' own times, from the coordinator)
STATE_ORDER = ("pending", "assigned", "running", "succeeded", "failed", "timed_out", "error", "cancelled")


@dataclass(frozen=True)
class Change:
    """Task ``task_id`` went from ``before`` (None: first seen) to ``after`` (a state, with
    ``unschedulable`` for a pending task that no connected worker can run), or reported
    ``progress`` (its latest message, when new) in the same state."""

    task_id: str
    before: str | None
    after: str
    worker_id: str | None
    reason: str | None
    unschedulable: bool
    progress: str | None = None


@dataclass
class Tracker:
    """The latest view of every waited-for task, and what each poll changed."""

    views: dict[str, dict[str, Any]] = field(default_factory=dict)
    said: dict[str, tuple[float, float]] = field(default_factory=dict)  # task -> (fraction, at) last reported

    def update(self, view: dict[str, Any]) -> Change | None:
        """Record ``view`` (a task as ``GET /api/v1/tasks/{id}`` shows it); the change since the
        last view of that task, or None when its state and schedulability stayed the same and its
        progress has nothing worth a line (module docstring)."""
        task_id = view["task_id"]
        old = self.views.get(task_id)
        self.views[task_id] = view
        key, old_key = _key(view), (_key(old) if old is not None else None)
        message = _progress_message(view)
        if message is not None and message != _progress_message(old) and self._worth_saying(task_id, view["progress"]):
            self.said[task_id] = (_number(view["progress"].get("fraction")), _number(view["progress"].get("at")))
        elif key == old_key:
            return None
        else:
            message = None
        return Change(task_id, old_key[0] if old_key else None, view["state"], view.get("worker_id"),
                      view.get("pending_reason"), bool(view.get("unschedulable")), message)

    def _worth_saying(self, task_id: str, progress: dict[str, Any]) -> bool:
        if task_id not in self.said:
            return True
        fraction, at = _number(progress.get("fraction")), _number(progress.get("at"))
        said_fraction, said_at = self.said[task_id]
        return fraction + 1e-9 >= min(1.0, said_fraction + PROGRESS_STEP) or at - said_at >= PROGRESS_QUIET_S

    def counts(self) -> dict[str, int]:
        by_state = Counter(v["state"] for v in self.views.values())
        return {s: by_state[s] for s in (*STATE_ORDER, *sorted(set(by_state) - set(STATE_ORDER))) if by_state[s]}


def _key(view: dict[str, Any]) -> tuple[str, bool]:
    return view["state"], bool(view.get("unschedulable"))


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _progress_message(view: dict[str, Any] | None) -> str | None:
    progress = (view or {}).get("progress")
    message = progress.get("message") if isinstance(progress, dict) else None
    return message if isinstance(message, str) and message else None


def describe(change: Change) -> str:
    """``change`` as the text of one log line (without the time)."""
    if change.progress is not None and change.before == change.after:
        return f"{change.task_id}: {change.progress}"
    line = _describe_state(change)
    return line if change.progress is None else f"{line}; {change.progress}"


def _describe_state(change: Change) -> str:
    arrow = f"{change.before} -> {change.after}" if change.before else change.after
    if change.after == "pending" and change.unschedulable:
        return f"{change.task_id}: {arrow}, no connected worker can run it ({change.reason})"
    if change.after == "pending":
        return f"{change.task_id}: {arrow}" + (f" ({change.reason})" if change.reason else "")
    if change.after in ("assigned", "running") and change.worker_id:
        return f"{change.task_id}: {arrow} on {change.worker_id}"
    return f"{change.task_id}: {arrow}"


class Progress(Protocol):
    """A display fed after every poll; closed once when the wait ends."""

    def show(self, tracker: Tracker, changes: list[Change]) -> None: ...

    def close(self) -> None: ...


class NoProgress:
    """``--progress off``: shows nothing."""

    def show(self, tracker: Tracker, changes: list[Change]) -> None:
        return None

    def close(self) -> None:
        return None


class PlainProgress:
    """One line per change, ``<ISO time> <task>: <before> -> <after> ...``; nothing redraws."""

    def __init__(self, out: TextIO, local_time: bool = False, clock: Callable[[], float] = time.time) -> None:
        self.out, self.local_time, self.clock = out, local_time, clock

    def show(self, tracker: Tracker, changes: list[Change]) -> None:
        stamp = iso_time(self.clock(), self.local_time)
        for change in changes:
            print(f"{stamp} {describe(change)}", file=self.out, flush=True)

    def close(self) -> None:
        return None


class LiveProgress:
    """A `rich` live table on ``out`` (a terminal), redrawn after every poll and left on screen
    at the end. Elapsed time of a running task counts from its coordinator ``updated_at`` (when it
    entered its state)."""

    def __init__(self, out: TextIO, clock: Callable[[], float] = time.time, *, force_terminal: bool | None = None) -> None:
        self.clock = clock
        self.console = Console(file=out, force_terminal=force_terminal)
        self.live = Live(Text("submitting..."), console=self.console, refresh_per_second=4, transient=False)
        self.live.start()

    def show(self, tracker: Tracker, changes: list[Change]) -> None:
        self.live.update(self.render(tracker), refresh=True)

    def close(self) -> None:
        self.live.stop()

    def render(self, tracker: Tracker) -> Group:
        counts = tracker.counts()
        header = Text("  ".join(f"{state} {n}" for state, n in counts.items()) or "no tasks", style="bold")
        table = Table(box=None, pad_edge=False, expand=False)
        for name in ("task", "state", "worker", "elapsed", "reason"):
            table.add_column(name, overflow="fold" if name == "reason" else "ellipsis",
                             no_wrap=name != "reason")
        open_views = [v for v in tracker.views.values() if v["state"] in ("pending", "assigned", "running")]
        open_views.sort(key=lambda v: (("running", "assigned", "pending").index(v["state"]), v["task_id"]))
        now = self.clock()
        for v in open_views[:MAX_LIVE_ROWS]:
            table.add_row(*self._row(v, now))
        parts: list[Any] = [header, table] if open_views else [header]
        if len(open_views) > MAX_LIVE_ROWS:
            parts.append(Text(f"... and {len(open_views) - MAX_LIVE_ROWS} more unfinished task(s)"))
        return Group(*parts)

    @staticmethod
    def _row(v: dict[str, Any], now: float) -> tuple[str | Text, ...]:
        elapsed = f"{max(0.0, now - float(v.get('updated_at') or now)):.0f}s" if v["state"] != "pending" else ""
        if v["state"] == "pending" and v.get("unschedulable"):
            reason: str | Text = Text(f"cannot run on any connected worker: {v.get('pending_reason')}", style="red")
        else:
            reason = v.get("pending_reason") or _progress_message(v) or ""
        return v["task_id"], v["state"], v.get("worker_id") or "", elapsed, reason
