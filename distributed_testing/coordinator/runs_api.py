"""REST handlers for runs: a run groups the tasks of one submission (a task file through ``dt
submit``, a pytest session, an API call that names one). A task joins a run by naming its
``run_id`` (``submission.check_runs``); what a run shows is derived from its tasks
(``core/runs.py``). The route table (``api.ROUTES``) takes ``ROUTES`` from here; each route
declares its permission, and cancel and re-run are for the key that created the run or an admin.

A run's record is kept by every store (``RunRow``), so it survives a restart and, in PostgreSQL,
a failover; its tasks are read back through the store's task query (``TaskQuery.run_id``), each
shown from memory when it is there (fresher), as ``views.task_page`` does.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Mapping
from typing import Any

import msgspec
from aiohttp import web

from ..errors import Conflict, NotFound, PermissionDenied, ValidationError
from ..security import auth as sa
from ..security import roles
from ..tasks import spec as specs
from .core import runs as cr
from .core.commands import Save
from .core.entities import Task
from .core.rows import RunRow
from .rest import PRINCIPAL, json_body, json_response
from .runtime import RUNTIME, Runtime
from .store.base import ResultQuery, TaskQuery
from .submission import accept

log = logging.getLogger(__name__)
MAX_RUN_TASKS = 10_000  # a run's detail, cancel and re-run read at most this many of its tasks
MAX_TEST_DETAILS = 100  # a run's detail shows the tests of at most this many test tasks
MAX_LIST = 200
DEFAULT_LIST = 20
MAX_NAME = 200
MAX_LABELS = 32
MAX_LABEL_KEY = 64
MAX_LABEL_VALUE = 256
_PRINTABLE = re.compile(r"^[^\x00-\x1f\x7f]*$")
RUN_ID = re.compile(r"^run-[0-9a-f]{12}$")


def new_run_id() -> str:
    return f"run-{secrets.token_hex(6)}"


def _text(value: Any, field: str, limit: int, errors: list[dict[str, str]]) -> str | None:
    if not isinstance(value, str) or not 0 < len(value) <= limit or not _PRINTABLE.match(value):
        errors.append({"field": field, "error": f"must be a string of 1 to {limit} printable characters"})
        return None
    return value


def parse_run_body(body: Any) -> tuple[str | None, dict[str, str], str | None]:
    """``name``, ``labels`` and ``run_id`` of a ``POST /api/v1/runs`` body; ValidationError naming
    each bad field."""
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise ValidationError([{"field": "(body)", "error": "expected an object with name and labels"}])
    errors = [{"field": k, "error": "unknown field"} for k in sorted(set(body) - {"name", "labels", "run_id"})]
    run_id = body.get("run_id")
    if run_id is not None and not (isinstance(run_id, str) and RUN_ID.match(run_id)):
        errors.append({"field": "run_id", "error": "must be 'run-' and 12 lowercase hex digits"})
    name = None if body.get("name") is None else _text(body["name"], "name", MAX_NAME, errors)
    labels = body.get("labels") or {}
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS:
        errors.append({"field": "labels", "error": f"must be an object of at most {MAX_LABELS} string values"})
        labels = {}
    for k, v in labels.items():
        _text(k, "labels", MAX_LABEL_KEY, errors)
        _text(v, f"labels.{k}", MAX_LABEL_VALUE, errors)
    if errors:
        raise ValidationError(errors)
    return name, labels, run_id


def default_name(principal: sa.Principal, now: float) -> str:
    return f"{principal.name} {time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime(now))}"


async def create(rt: Runtime, principal: sa.Principal, name: str | None, labels: dict[str, str],
                 run_id: str | None = None) -> RunRow:
    """A new run of ``principal``'s, on disk before this returns. ``run_id``: the id the client
    chose, so that sending the request again after a lost answer is harmless: the run it made
    is returned (None: the caller answers 200, not 201), and an id another key or another name
    or labels hold is a Conflict."""
    now = rt.clock()
    run = RunRow(run_id=run_id or new_run_id(), name=name or default_name(principal, now), created_at=now,
                 labels=labels, submitted_by=principal.key_id)
    await rt.execute([Save(run)])
    log.info("run %s (%s) created by %s", run.run_id, run.name, principal.name)
    return run


async def find_run(rt: Runtime, run_id: str) -> RunRow:
    run = (await rt.store.get_runs([run_id])).get(run_id)
    if run is None:
        raise NotFound(f"no run {run_id!r}")
    return run


async def run_tasks(rt: Runtime, run_id: str) -> list[Any]:
    """The run's tasks (at most ``MAX_RUN_TASKS``) in submission order, each from memory when it is there."""
    page = await rt.store.query_tasks(TaskQuery(run_id=run_id, limit=MAX_RUN_TASKS))
    return [rt.state.tasks.get(row.task_id) or row for row in reversed(page.tasks)]


def _owned(run: RunRow, principal: sa.Principal, what: str) -> None:
    if principal.role != roles.Role.ADMIN and run.submitted_by not in (None, principal.key_id):
        raise PermissionDenied(f"run {run.run_id} was created by another key; only it or an admin may {what} it")


async def outputs_of_tests(rt: Runtime, tasks: list[Any]) -> dict[str, Mapping[str, Any]]:
    """The result output of each finished test task's outcome, by task id: of the failed ones
    first, at most ``MAX_TEST_DETAILS`` (one result query each)."""
    done = [t for t in tasks if t.type == "test" and t.outcome is not None and "attempt" in t.outcome]
    done.sort(key=lambda t: t.state not in cr.FAILED)
    found: dict[str, Mapping[str, Any]] = {}
    for t in done[:MAX_TEST_DETAILS]:
        for r in await rt.store.query_results(ResultQuery(task_id=t.task_id, limit=1000)):
            if r.attempt == t.outcome["attempt"]:
                found[t.task_id] = r.output
    return found


# ------------------------------------------------------------------- routes


async def create_run(request: web.Request) -> web.Response:
    """Create a run: body ``{"name": TEXT, "labels": {TEXT: TEXT}, "run_id": "run-<12 hex>"}`` (all
    optional). Tasks join it by naming its ``run_id``; only this key (or an admin) may add tasks,
    cancel or re-run it. A client that picks the ``run_id`` may send the request again after a lost
    answer: the same key, name and labels get the run they made (200), anything else 409."""
    rt: Runtime = request.app[RUNTIME]
    principal = request[PRINCIPAL]
    name, labels, run_id = parse_run_body(await json_body(request))
    if run_id is not None and (held := (await rt.store.get_runs([run_id])).get(run_id)) is not None:
        if (held.submitted_by, held.labels) != (principal.key_id, labels) or (name is not None and held.name != name):
            raise Conflict(f"run {run_id} already exists with another key, name or labels")
        return json_response(cr.run_view(held))  # the same request again: what it made
    return json_response(cr.run_view(await create(rt, principal, name, labels, run_id)), status=201)


async def list_runs(request: web.Request) -> web.Response:
    """Runs, newest first, each with its state, counts by task state, start and end.

    ``limit`` (1 to 200, default 20) from ``offset``; ``submitted_by`` lists one key's runs;
    ``state`` keeps the runs in that state (of those on the page)."""
    rt: Runtime = request.app[RUNTIME]
    limit, offset, submitted_by, state = _list_query(request.query)
    rows = await rt.store.query_runs(limit, offset, submitted_by)
    stats = await rt.store.run_stats([r.run_id for r in rows])  # counted by the store: no task read out
    out = [cr.summary_of(r, stats[r.run_id]) for r in rows]
    return json_response({"runs": [r for r in out if state is None or r["state"] == state]})


def _list_query(query: Mapping[str, str]) -> tuple[int, int, str | None, str | None]:
    errors = [{"field": k, "error": "unknown query parameter"}
              for k in sorted(set(query) - {"limit", "offset", "submitted_by", "state"})]
    values = {"limit": DEFAULT_LIST, "offset": 0}
    for name, hi in (("limit", MAX_LIST), ("offset", 10_000_000)):
        raw = query.get(name)
        if raw is None or raw == "":
            continue
        try:
            values[name] = int(raw)
        except ValueError:
            errors.append({"field": name, "error": f"not an integer: {raw!r}"})
            continue
        if not (1 if name == "limit" else 0) <= values[name] <= hi:
            errors.append({"field": name, "error": f"must be between {1 if name == 'limit' else 0} and {hi}"})
    state = query.get("state") or None
    if state is not None and state not in cr.RUN_STATES:
        errors.append({"field": "state", "error": f"must be one of {', '.join(cr.RUN_STATES)}, got {state!r}"})
    if errors:
        raise ValidationError(errors)
    return values["limit"], values["offset"], query.get("submitted_by") or None, state


async def get_run(request: web.Request) -> web.Response:
    """One run: its summary and its tasks, failures first, then running ones, then the rest, each
    with its worker, start, end, duration, the first line of its error and (test tasks) its tests."""
    rt: Runtime = request.app[RUNTIME]
    run = await find_run(rt, request.match_info["run_id"])
    tasks = await run_tasks(rt, run.run_id)
    outputs = await outputs_of_tests(rt, tasks)
    lines = cr.ordered([cr.task_line(t, outputs.get(t.task_id)) for t in tasks])
    return json_response({**cr.summary(run, tasks), "tasks": lines})


async def cancel_run(request: web.Request) -> web.Response:
    """Cancel every unfinished task of the run; ``cancelled`` lists them, ``finished`` counts the
    tasks that had already finished."""
    rt: Runtime = request.app[RUNTIME]
    principal = request[PRINCIPAL]
    run = await find_run(rt, request.match_info["run_id"])
    _owned(run, principal, "cancel")
    tasks = await run_tasks(rt, run.run_id)
    cause = f"run {run.run_id} cancelled by {principal.name}"
    # every unfinished task is in memory; the pending ones first, so no slot a running one frees
    # is given to a task of this run that is cancelled next. One event: one write, one answer.
    live = [t for t in tasks if (m := rt.state.tasks.get(t.task_id)) is not None and m.outcome is None]
    live.sort(key=lambda t: t.state != "pending")
    now, cmds = rt.clock(), []
    for t in live:
        cmds += rt.state.cancel(t.task_id, now, cause)
    await rt.execute(cmds)
    order = {t.task_id: i for i, t in enumerate(tasks)}
    cancelled = sorted((t.task_id for t in live), key=order.__getitem__)
    log.info("%s: %d tasks", cause, len(cancelled))
    return json_response({"run_id": run.run_id, "cancelled": cancelled, "finished": len(tasks) - len(cancelled)})


async def rerun(request: web.Request) -> web.Response:
    """Submit the run's tasks again as a new run: body ``{"failed": BOOL, "name": TEXT}`` (both
    optional). Each new task has the old one's body and a derived id (``<id>@<new run's short
    id>``); with ``failed`` only the tasks that failed, timed out, errored or were cancelled."""
    rt: Runtime = request.app[RUNTIME]
    principal = request[PRINCIPAL]
    body = await json_body(request)
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise ValidationError([{"field": "(body)", "error": "expected an object with failed and name"}])
    errors = [{"field": k, "error": "unknown field"} for k in sorted(set(body) - {"failed", "name"})]
    failed = body.get("failed", False)
    if not isinstance(failed, bool):
        errors.append({"field": "failed", "error": "must be true or false"})
    name = None if body.get("name") is None else _text(body["name"], "name", MAX_NAME, errors)
    if errors:
        raise ValidationError(errors)
    source = await find_run(rt, request.match_info["run_id"])
    _owned(source, principal, "re-run")
    chosen = cr.to_rerun(await run_tasks(rt, source.run_id), failed)
    if not chosen:
        raise ValidationError([{"field": "failed" if failed else "run_id",
                                "error": f"run {source.run_id} has no {'failed ' if failed else ''}tasks to run again"}])
    run = await create(rt, principal, name or f"{source.name} (re-run{' failed' if failed else ''})",
                       {**source.labels, "rerun_of": source.run_id})
    new_specs = [_respec(t, source, run.run_id) for t in chosen]
    await accept(rt, principal, new_specs)
    tasks = await run_tasks(rt, run.run_id)
    return json_response({**cr.summary(run, tasks), "source": source.run_id,
                          "task_ids": {t.task_id: s.task_id for t, s in zip(chosen, new_specs, strict=True)}},
                         status=201)


def _respec(t: Task | Any, source: RunRow, run_id: str) -> specs.TaskSpec:
    spec = t.spec if isinstance(t, Task) else specs.spec_from_dict(t.spec)
    return msgspec.structs.replace(spec, task_id=cr.derived_id(t.task_id, source, run_id), run_id=run_id)


ROUTES: list[tuple[str, str, Any, str]] = [
    ("POST", "/api/v1/runs", create_run, "tasks:submit"),
    ("GET", "/api/v1/runs", list_runs, "tasks:read"),
    ("GET", "/api/v1/runs/{run_id}", get_run, "tasks:read"),
    ("POST", "/api/v1/runs/{run_id}/cancel", cancel_run, "tasks:cancel"),
    ("POST", "/api/v1/runs/{run_id}/rerun", rerun, "tasks:submit"),
]
