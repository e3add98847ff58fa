"""What a store journals for a task it already holds: the change of one transition, not the row.

A task's row carries its spec and its whole history, and every transition used to re-encode all of
it: a task's N-th transition cost O(N) bytes in the journal and again at the checkpoint. A
:class:`TaskChange` holds what a transition changes (state, attempt, worker, times, retries,
outcome) and the history entries added since the last record of that task, starting at index
``base``. :class:`Changes` decides, per task, which form an append takes; :func:`fold` and
:func:`combine` apply and merge changes exactly as a replay needs them. Pure: no I/O.

Which fields a change may carry: everything of a ``TaskRow`` but the ones fixed at submission
(``type``, ``priority``, ``submitted_at``, ``digest``, ``spec``, ``seq``, ``submitted_by``,
``run_id``). The
core only ever appends to a task's history (and sets the ``gang`` of the entry it just added
before saving it), so the entries past what was journaled are the whole difference. A task
reloaded after a restart (where ``seq`` may be renumbered) gets a full row first: the map
starts empty.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...tasks.states import TERMINAL
from ..core.rows import Record, TaskRow

_replace = msgspec.structs.replace


class TaskChange(msgspec.Struct, frozen=True, tag_field="rec", tag="task_change"):
    """The mutable fields of a task's row after a transition, and the history entries added
    since its previous record: ``entries`` go at index ``base`` of the history. ``seq`` is the
    row's own (it never changes: a change only follows a row with the same one; -1 in a record
    written before it was added): it tells the checkpoint where in DuckDB's table the row is."""

    task_id: str
    state: str
    attempt: int
    updated_at: float
    base: int
    entries: list[dict[str, Any]]
    worker_id: str | None = None
    reason: str | None = None
    retries_used: int = 0
    not_before: float = 0.0
    outcome: dict[str, Any] | None = None
    seq: int = -1


# What the DuckDB journal holds: the core's records, and changes in place of repeated task rows.
JournalRecord = Record | TaskChange


def change_of(row: TaskRow, base: int) -> TaskChange:
    """``row`` as the change from a row whose history had ``base`` entries."""
    # positional, in TaskChange's field order (made for most journaled rows; keywords cost 3 times as much)
    return TaskChange(row.task_id, row.state, row.attempt, row.updated_at, base, row.history[base:], row.worker_id,
                      row.reason, row.retries_used, row.not_before, row.outcome, row.seq)


def fold(row: TaskRow, change: TaskChange) -> TaskRow:
    """``row`` after ``change``. Idempotent: the history is cut at ``change.base`` first."""
    history = row.history if len(row.history) == change.base and not change.entries else \
        [*row.history[: change.base], *change.entries]
    return _replace(row, state=change.state, attempt=change.attempt, updated_at=change.updated_at,
                    worker_id=change.worker_id, reason=change.reason, retries_used=change.retries_used,
                    not_before=change.not_before, outcome=change.outcome, history=history)


def combine(first: TaskRow | TaskChange, then: TaskChange) -> TaskRow | TaskChange:
    """One record with the effect of ``first`` followed by ``then`` (same task)."""
    if isinstance(first, TaskRow):
        return fold(first, then)
    kept = first.entries[: max(0, then.base - first.base)]
    return _replace(then, base=min(first.base, then.base), entries=[*kept, *then.entries])


class Changes:
    """Which form each task row takes in the journal: the whole row the first time (and after a
    restart), a :class:`TaskChange` when the row extends the last one journaled for its task (the
    same fixed fields, that row's history as its prefix), the whole row again otherwise. Keeps,
    per active task, the last row journaled (the core's own objects: its spec and history entries
    are shared, not copied); a terminal row ends the task's entry."""

    def __init__(self) -> None:
        self._last: dict[str, TaskRow] = {}

    def __len__(self) -> int:
        return len(self._last)

    def plan(self, records: list[Record]) -> list[JournalRecord]:
        """The journal's form of ``records``; :meth:`commit` them once they were accepted."""
        out: list[JournalRecord] = []
        last = self._last
        for rec in records:
            if type(rec) is TaskRow:
                prev = last.get(rec.task_id)
                if prev is not None and extends(rec, prev):
                    out.append(change_of(rec, len(prev.history)))
                    continue
            out.append(rec)
        return out

    def commit(self, records: list[Record]) -> None:
        last = self._last
        for rec in records:
            if type(rec) is TaskRow:
                if rec.state in TERMINAL:
                    last.pop(rec.task_id, None)
                else:
                    last[rec.task_id] = rec

    def forget(self) -> None:
        """Every task gets a whole row next (its stored row may have changed behind the store)."""
        self._last.clear()


def extends(row: TaskRow, prev: TaskRow) -> bool:
    """Whether ``row`` is ``prev`` after transitions: the fields fixed at submission equal and
    ``prev``'s history a prefix of ``row``'s. (The core shares the spec and the entries between a
    task's rows, so identity answers most comparisons; this runs on every append.)"""
    history, before = row.history, prev.history
    n = len(before)
    return (len(history) >= n and (row.spec is prev.spec or row.spec == prev.spec)
            and row.seq == prev.seq and row.submitted_at == prev.submitted_at and row.digest == prev.digest
            and row.type == prev.type and row.priority == prev.priority and row.submitted_by == prev.submitted_by
            and (history == before if len(history) == n else history[:n] == before))


def coalesce(records: list[JournalRecord]) -> tuple[list[TaskRow], list[TaskChange], list[Any]]:
    """Journal records in order -> (the last row of each task whose row they hold, with the
    later changes folded in; one combined change for each task whose row they do not hold; the
    other records, in order). Each task's run of changes is folded once, at the end (what
    :func:`fold` and :func:`combine` give applied one change at a time)."""
    first: dict[str, TaskRow | TaskChange] = {}  # per task: its last row, or its first change after none
    later: dict[str, list[TaskChange]] = {}  # the changes that follow it
    other: list[Any] = []
    for rec in records:
        t = type(rec)
        if t is TaskChange:
            tid = rec.task_id  # type: ignore[union-attr]
            if tid in first:
                if (run := later.get(tid)) is None:
                    later[tid] = [rec]  # type: ignore[list-item]
                else:
                    run.append(rec)  # type: ignore[arg-type]
            else:
                first[tid] = rec  # type: ignore[assignment]
        elif t is TaskRow:
            tid = rec.task_id  # type: ignore[union-attr]
            first[tid] = rec  # type: ignore[assignment]
            later.pop(tid, None)
        else:
            other.append(rec)
    rows: list[TaskRow] = []
    changes: list[TaskChange] = []
    for tid, head in first.items():
        run = later.get(tid)
        if isinstance(head, TaskRow):
            rows.append(head if run is None else _fold_run(head, run))
        else:
            changes.append(head if run is None else _combine_run(head, run))
    return rows, changes, other


def _fold_run(row: TaskRow, run: list[TaskChange]) -> TaskRow:
    """``fold`` of each change of ``run`` in turn, building one row."""
    history = list(row.history)
    for c in run:
        del history[c.base:]
        history += c.entries
    last = run[-1]
    return _replace(row, state=last.state, attempt=last.attempt, updated_at=last.updated_at,
                    worker_id=last.worker_id, reason=last.reason, retries_used=last.retries_used,
                    not_before=last.not_before, outcome=last.outcome, history=history)


def _combine_run(change: TaskChange, run: list[TaskChange]) -> TaskChange:
    """``combine`` of ``change`` with each change of ``run`` in turn, building one change."""
    base, entries = change.base, list(change.entries)
    for c in run:
        del entries[max(0, c.base - base):]
        entries += c.entries
        base = min(base, c.base)
    return _replace(run[-1], base=base, entries=entries)
