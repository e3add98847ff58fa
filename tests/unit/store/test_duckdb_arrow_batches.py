"""The Arrow batches a DuckDB checkpoint hands DuckDB (store/duckdbsql.py): each column as the
record holds it, a JSON column as the JSON text of the value (null for None), built a column at a
time from the encoder's bytes."""

from __future__ import annotations

import json

import pyarrow as pa

from distributed_testing.coordinator.core.rows import ResultRow, TaskRow
from distributed_testing.coordinator.store.changes import TaskChange
from distributed_testing.coordinator.store.duckdbsql import TABLES, changes_to_arrow

SPEC = {"type": "custom", "config": {"name": "noop", "parameters": {"s": "é\u2028\"", "f": 0.1}}}
HISTORY = [{"at": 1.0, "from": None, "to": "pending", "cause": "submitted", "attempt": 0}]


def test_task_rows_become_their_columns_with_json_text() -> None:
    rows = [TaskRow("t1", "custom", "pending", 0, 3, 1.0, 2.0, "d" * 64, SPEC, None, None, 0, 0.0, HISTORY, None, 7,
                    "k", None),
            TaskRow("t2", "custom", "succeeded", 1, 0, 1.5, 2.5, "e" * 64, SPEC, "w", "r", 2, 0.5, HISTORY,
                    {"status": "succeeded"}, 8, None, "run-0123456789ab")]
    table = TABLES[TaskRow].to_arrow(rows)
    got = table.to_pylist()
    assert [r["task_id"] for r in got] == ["t1", "t2"] and [r["seq"] for r in got] == [7, 8]
    assert [r["outcome"] for r in got] == [None, '{"status":"succeeded"}']
    assert all(json.loads(r["spec"]) == SPEC and json.loads(r["history"]) == HISTORY for r in got)
    assert [r["run_id"] for r in got] == [None, "run-0123456789ab"] and got[1]["worker_id"] == "w"
    assert table.schema.field("spec").type == pa.string()


def test_result_rows_become_their_columns() -> None:
    table = TABLES[ResultRow].to_arrow([ResultRow("t1", 2, "w", "failed", 1.0, 2.0, 3.0, {"x": [1]}, "boom", "custom")])
    [row] = table.to_pylist()
    assert (row["attempt"], row["error"], json.loads(row["output"])) == (2, "boom", {"x": [1]})


def test_changes_become_their_columns_with_json_text() -> None:
    entry = {"at": 3.0, "from": "assigned", "to": "succeeded", "cause": "result", "attempt": 1, "worker_id": "w"}
    changes = [TaskChange("t1", "succeeded", 1, 3.0, 2, [entry], "w", None, 0, 0.0, {"status": "succeeded"}, 5),
               TaskChange("t2", "assigned", 1, 2.0, 1, [], "w")]
    got = changes_to_arrow(changes).to_pylist()
    assert [(r["task_id"], r["state"], r["seq"]) for r in got] == [("t1", "succeeded", 5), ("t2", "assigned", -1)]
    assert [r["outcome"] for r in got] == ['{"status":"succeeded"}', None]
    assert [json.loads(r["entries"]) for r in got] == [[entry], []]
