"""The journal form of task rows (``store/changes.py``): a task's later rows become changes, and
folding them back gives the rows exactly; a change's size does not grow with the task's history."""

from __future__ import annotations

from typing import Any

import msgspec
import pyarrow as pa

from distributed_testing.coordinator.core.rows import ResultRow, TaskRow
from distributed_testing.coordinator.store.changes import Changes, TaskChange, coalesce, combine, extends, fold
from distributed_testing.coordinator.store.duckdbsql import changes_to_arrow

SPEC: dict[str, Any] = {"type": "custom", "config": {"name": "noop", "args": list(range(50))}}


def row(state: str, history: list[dict[str, Any]], **kw: Any) -> TaskRow:
    return TaskRow("t1", "custom", state, kw.pop("attempt", 1), 0, 1.0, float(len(history)), "sha256:d", SPEC,
                   history=history, **kw)


def lifecycle(transitions: int) -> list[TaskRow]:
    """The rows the core saves for one task: submitted, then requeued ``transitions`` times
    (each row a new list sharing the earlier entries, as ``Task.row`` makes them), then done."""
    history = [{"at": 0.0, "from": None, "to": "pending", "cause": "submitted", "attempt": 0}]
    rows = [row("pending", list(history))]
    for i in range(transitions):
        state = "assigned" if i % 2 == 0 else "pending"
        history.append({"at": float(i), "from": rows[-1].state, "to": state, "cause": "c", "attempt": i // 2 + 1})
        rows.append(row(state, list(history), attempt=i // 2 + 1, worker_id="w1" if state == "assigned" else None))
    history.append({"at": 99.0, "from": rows[-1].state, "to": "succeeded", "cause": "result", "attempt": 9})
    rows.append(row("succeeded", list(history), outcome={"status": "succeeded"}))
    return rows


def journal_form(rows: list[TaskRow], per_append: int = 1) -> list[Any]:
    changes, out = Changes(), []
    for i in range(0, len(rows), per_append):
        batch = list(rows[i : i + per_append])
        out += changes.plan(batch)  # type: ignore[arg-type]
        changes.commit(batch)  # type: ignore[arg-type]
    return out


def test_first_row_whole_later_rows_changes_and_a_terminal_row_ends_the_entry() -> None:
    rows = lifecycle(3)
    changes = Changes()
    planned = []
    for r in rows:
        planned += changes.plan([r])
        changes.commit([r])
    assert planned[0] is rows[0]
    assert all(isinstance(p, TaskChange) for p in planned[1:])
    assert [p.entries for p in planned[1:]] == [[r.history[-1]] for r in rows[1:]]
    assert len(changes) == 0  # the terminal row ended it: the next row of t1 would be whole
    assert changes.plan([rows[1]]) == [rows[1]]


def test_a_row_that_does_not_extend_the_last_one_is_journaled_whole() -> None:
    first = lifecycle(1)[0]
    other_spec = msgspec.structs.replace(first, spec={"type": "custom", "config": {}}, history=[*first.history, {}])
    rewritten = msgspec.structs.replace(first, history=[{"rewritten": True}, {}])
    assert not extends(other_spec, first) and not extends(rewritten, first)
    changes = Changes()
    changes.plan([first])
    changes.commit([first])
    assert changes.plan([other_spec, rewritten]) == [other_spec, rewritten]


def checkpoint(stored: dict[str, TaskRow], part: list[Any]) -> None:
    """What a checkpoint of ``part`` does to the stored rows (DuckDBStore._apply_sync's effect)."""
    rows, changes, _ = coalesce(part)
    stored.update((r.task_id, r) for r in rows)
    for c in changes:
        stored[c.task_id] = fold(stored[c.task_id], c)  # a change without its row raises here


def test_folding_the_journal_form_gives_back_every_row() -> None:
    for per_append in (1, 2, 3):
        rows = lifecycle(6)
        form = journal_form(rows, per_append)
        for n in range(1, len(form) + 1):  # one checkpoint, ending after any record
            stored: dict[str, TaskRow] = {}
            checkpoint(stored, form[:n])
            assert stored["t1"] == rows[n - 1]
        for cut in range(1, len(form)):  # two checkpoints: a boundary after any record
            stored = {}
            checkpoint(stored, form[:cut])
            checkpoint(stored, form[cut:])
            assert stored["t1"] == rows[-1]


def test_combine_and_fold_are_idempotent_under_a_replay() -> None:
    rows = lifecycle(4)
    form = journal_form(rows)
    last = rows[0]
    for ch in form[1:]:
        last = fold(fold(last, ch), ch)  # a change applied twice changes nothing more
    assert last == rows[-1]
    assert combine(combine(form[1], form[2]), form[2]) == combine(form[1], form[2])


def test_other_records_pass_through_in_order() -> None:
    r1 = ResultRow("t1", 1, "w1", "succeeded", 1.0, 2.0, 3.0)
    r2 = ResultRow("t2", 1, "w1", "succeeded", 1.0, 2.0, 3.0)
    assert coalesce([r1, *journal_form(lifecycle(1)), r2])[2] == [r1, r2]


def test_a_change_costs_the_same_whatever_the_history_before_it() -> None:
    """Journal bytes (msgpack) and checkpoint bytes (the Arrow batch) of one transition's record
    are flat in the length of the task's history: 3 entries or 300, the same."""
    encode = msgspec.msgpack.Encoder().encode
    sizes = []
    for transitions in (2, 30, 300):
        form = journal_form(lifecycle(transitions))
        change = form[-2]  # the last requeue/dispatch before the result
        assert isinstance(change, TaskChange) and len(change.entries) == 1
        batch: pa.Table = changes_to_arrow([change])
        sizes.append((len(encode(change)), batch.nbytes))
        assert len(encode(form[0])) < len(encode(lifecycle(transitions)[-1]))  # the whole row does grow
    journal_bytes = [s[0] for s in sizes]
    assert max(journal_bytes) - min(journal_bytes) <= 8  # the entry's numbers differ in width, no more
    assert max(s[1] for s in sizes) - min(s[1] for s in sizes) <= 8


def one_at_a_time(records: list[Any]) -> tuple[list[TaskRow], list[TaskChange]]:
    """``coalesce``'s meaning, one record at a time with ``fold`` and ``combine``."""
    tasks: dict[str, Any] = {}
    for rec in records:
        if isinstance(rec, TaskRow):
            tasks[rec.task_id] = rec
        else:
            prev = tasks.get(rec.task_id)
            tasks[rec.task_id] = rec if prev is None else combine(prev, rec)
    return ([t for t in tasks.values() if isinstance(t, TaskRow)],
            [t for t in tasks.values() if isinstance(t, TaskChange)])


def test_coalesce_folds_each_run_as_one_change_at_a_time_would() -> None:
    """Interleaved tasks, a change replayed (its base below the history already folded), a whole
    row in the middle of a run of changes, and runs with and without their row."""
    a = journal_form(lifecycle(4))
    b = [msgspec.structs.replace(r, task_id="t2") for r in journal_form(lifecycle(3))]
    replayed = [a[0], a[1], a[2], a[1], a[2], a[3]]  # a crash between a checkpoint and its deletions
    for records in ([*a, *b], [x for pair in zip(a, b, strict=False) for x in pair], a[1:], a[2:] + b[1:], replayed,
                    [a[1], a[2], a[0], a[3], a[4]], [*b[1:3], b[0], *b[1:]]):
        rows, changes, other = coalesce(records)
        assert (rows, changes, other) == (*one_at_a_time(records), [])
