"""The records the coordinator persists, and the snapshot it loads at start. Plain data.

The scheduling core (:mod:`.state`) makes these from its tasks and workers and the store
(``coordinator/store``) writes and reads them; they live here so the core needs no store.
Records are idempotent upserts (tasks, workers, keys, meta, runs) or inserts keyed by
(task_id, attempt) (results), so replaying them twice is harmless.
"""

from __future__ import annotations

from typing import Any

import msgspec


class _Rec(msgspec.Struct, frozen=True, tag_field="rec"):
    """Base of journal records; ``rec`` tags the record kind."""


class TaskRow(_Rec, frozen=True, tag="task"):
    task_id: str
    type: str
    state: str
    attempt: int
    priority: int
    submitted_at: float
    updated_at: float
    digest: str
    spec: dict[str, Any]
    worker_id: str | None = None
    reason: str | None = None
    retries_used: int = 0
    not_before: float = 0.0
    history: list[dict[str, Any]] = []
    outcome: dict[str, Any] | None = None
    seq: int = 0
    submitted_by: str | None = None
    run_id: str | None = None  # the run it joined (spec["run_id"]; schema version 5)


class ResultRow(_Rec, frozen=True, tag="result"):
    task_id: str
    attempt: int
    worker_id: str
    status: str
    started_at: float
    finished_at: float
    received_at: float
    output: dict[str, Any] = {}
    error: str | None = None
    task_type: str = ""


# A WorkerRow in this state deletes the worker's row (a worker forgotten after --worker-retention).
FORGOTTEN = "forgotten"


class WorkerRow(_Rec, frozen=True, tag="worker"):
    """A worker as last known; ``state`` ``FORGOTTEN`` deletes its row instead."""

    worker_id: str
    name: str
    hardware: dict[str, Any]
    capabilities: list[str]
    tags: list[str]
    first_seen: float
    last_seen: float
    state: str
    key_id: str | None = None  # the key this worker id is bound to (None: not bound; schema version 2)


class KeyRow(_Rec, frozen=True, tag="key"):
    key_id: str
    name: str
    role: str
    hash: str
    created_at: float
    expires_at: float | None = None
    revoked_at: float | None = None
    allow_code: bool = False  # may upload bundles and submit tasks that run them (--allow-code)


class RunRow(_Rec, frozen=True, tag="run"):
    """A run: the tasks of one submission (``coordinator/runs_api.py``). What it holds is fixed at
    its creation; its counts, state, start and end are derived from its tasks."""

    run_id: str
    name: str
    created_at: float
    labels: dict[str, str] = {}
    submitted_by: str | None = None


class MetaRow(_Rec, frozen=True, tag="meta"):
    """A key/value setting of the store; a row with an empty ``value`` deletes ``key``."""

    key: str
    value: str


Record = TaskRow | ResultRow | WorkerRow | KeyRow | MetaRow | RunRow


class Snapshot(msgspec.Struct):
    """What a coordinator loads at start: the active work, not the history.

    ``tasks`` holds only tasks whose state is not in ``TERMINAL`` (pending, assigned, running), in
    ``seq`` order; finished tasks and results stay in the store and are queried
    (``get_tasks``, ``query_tasks``, ``query_results``), so start time and memory follow the
    active work, not everything ever submitted. ``task_counts`` counts every stored task by state
    (terminal ones included) and ``max_seq`` is the largest ``seq`` of any stored task (0 when
    none), so submission order continues after a restart."""

    tasks: list[TaskRow] = []
    workers: list[WorkerRow] = []
    keys: list[KeyRow] = []
    meta: dict[str, str] = {}
    task_counts: dict[str, int] = {}
    max_seq: int = 0
