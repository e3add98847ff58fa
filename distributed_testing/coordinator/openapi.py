"""The OpenAPI 3.1 description of the coordinator's HTTP API, generated from its router.

``document(routes)`` takes the routes the app actually serves (method, path, handler, permission:
see ``api.route_entries``), so the description cannot list a route the server lacks or miss one it
has. Per route: the summary is the handler docstring's first line, the required permission comes
from the route table, and the parameters, request body and responses come from ``SPECS`` below;
the task body's schema is the published task JSON Schema (``GET /api/v1/schema/task``), its
``$defs`` moved under ``components/schemas``. A route without an entry in ``SPECS`` is still
described (summary, permission, the generic error answers), and a test fails until it gets one.

Pure: no I/O. ``scripts/gen_openapi.py`` writes the result to docs/openapi.json.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..tasks import spec as specs
from ..tasks.states import RESULT_STATES, TASK_STATES, WORKER_STATES

TITLE = "distributed_testing coordinator"
VERSION = "1"
JSON = "application/json"
REF = "#/components/schemas/"
NULLABLE_STR = {"type": ["string", "null"]}
NULLABLE_NUM = {"type": ["number", "null"]}
FIELD_ERROR = {"type": "object", "required": ["field", "error"],
               "properties": {"field": {"type": "string"}, "error": {"type": "string"}}}
ERROR = {"type": "object", "required": ["error", "message"],
         "properties": {"error": {"type": "string"}, "message": {"type": "string"},
                        "errors": {"type": "array", "items": FIELD_ERROR}}}
_ERRORS = {400: "bad input: a field, a query parameter or the body (``errors`` names each)",
           401: "no valid credential", 403: "the credential's role lacks the route's permission, or the "
                "resource belongs to another key", 404: "no such resource", 405: "method not allowed",
           409: "conflicts with the resource's current state", 413: "body over the size limit",
           429: "too many failed authentications from this address (Retry-After)",
           502: "through an HA standby: the request reached the leader but its answer broke off or was "
                "unreadable (``answer_lost``: it may have been carried out; repeat it only if that is safe)",
           503: "unavailable: over a connection cap, the coordinator is stopping after a failed write, or, "
                "through an HA standby, no leader to send it to (``not_leader``, ``Retry-After``: ask another "
                "member; nothing was sent)",
           504: "through an HA standby: the request reached the leader but no answer came in time, or the "
                "leader fell silent meanwhile (``answer_lost``: as 502)"}
KEY_VIEW: dict[str, Any] = {"type": "object", "required": ["key_id", "name", "role", "created_at", "expires_at", "revoked_at"],
            "properties": {"key_id": {"type": "string"}, "name": {"type": "string"},
                           "role": {"enum": ["admin", "submitter", "viewer", "worker"]},
                           "created_at": {"type": "number"}, "expires_at": NULLABLE_NUM, "revoked_at": NULLABLE_NUM,
                           "allow_code": {"type": "boolean", "description": "may upload bundles (--allow-code)"}}}
_TASK_COMMON = {"task_id": {"type": "string"}, "type": {"type": "string"}, "state": {"type": "string"},
                "attempt": {"type": "integer"}, "worker_id": NULLABLE_STR, "priority": {"type": "integer"},
                "submitted_at": {"type": "number"}, "updated_at": {"type": "number"}, "pending_reason": NULLABLE_STR,
                "outcome": {"type": ["object", "null"]}, "retries_used": {"type": "integer"},
                "submitted_by": NULLABLE_STR, "gang": {"type": ["object", "null"]},
                "run_id": {**NULLABLE_STR, "description": "the run the task joined (POST /api/v1/runs)"},
                "progress": {"type": ["object", "null"],
                             "description": "the running attempt's latest progress report: fraction (0 to 1), "
                                            "message (a benchmark's 'cnn b8 fp32: 1.23 ms (3 of 6)'), at; "
                                            "null when none or not running"}}
TASK_SUMMARY = {"type": "object", "required": sorted(_TASK_COMMON), "properties": _TASK_COMMON}
TASK_VIEW = {"type": "object", "required": [*sorted(_TASK_COMMON), "spec", "history"],
             "properties": {**_TASK_COMMON, "spec": {"type": "object"}, "history": {"type": "array"},
                            "result": {"type": ["object", "null"]}}}
WORKER_VIEW = {"type": "object",
               "required": ["worker_id", "name", "state", "reason", "capabilities", "tags", "max_concurrent",
                            "accept_bundles", "running", "load", "last_seen", "hardware", "pipeline"],
               "properties": {"worker_id": {"type": "string"}, "name": {"type": "string"},
                              "state": {"enum": list(WORKER_STATES)},
                              "reason": NULLABLE_STR, "capabilities": {"type": "array", "items": {"type": "string"}},
                              "tags": {"type": "array", "items": {"type": "string"}},
                              "max_concurrent": {"type": "integer"},
                              "accept_bundles": {"type": "boolean",
                                                 "description": "started with --accept-bundles: runs shipped code"},
                              "running": {"type": "array"},
                              "load": {"type": "object"}, "last_seen": {"type": "number"},
                              "hardware": {"type": "object"},
                              "pipeline": {"type": "object", "required": ["depth", "window"],
                                           "description": "depth: the worker's --pipeline-depth; window: how many "
                                                          "tasks beyond its slots it may be sent now",
                                           "properties": {"depth": {"type": "integer"},
                                                          "window": {"type": "integer"}}}}}
RESULT_VIEW = {"type": "object", "required": ["task_id", "attempt", "worker_id", "status"],
               "properties": {"task_id": {"type": "string"}, "attempt": {"type": "integer"},
                              "worker_id": {"type": "string"}, "status": {"type": "string"},
                              "started_at": {"type": "number"}, "finished_at": {"type": "number"},
                              "received_at": {"type": "number"}, "output": {"type": "object"},
                              "error": NULLABLE_STR, "task_type": {"type": "string"}}}
INT64 = 2**63 - 1
HALF_INT64 = 2**62 - 1
WAIT = {"name": "wait", "in": "query", "required": False,
        "description": "seconds to wait for the task(s) to finish before answering",
        "schema": {"type": "number", "minimum": 0, "maximum": 300}}


@dataclass(frozen=True)
class RouteSpec:
    """What the route table does not say about a route: its inputs and its answers.
    ``ok`` maps each success status to (description, media type, schema or None); ``errors``
    lists the error statuses beyond those every route of its kind has."""

    ok: dict[int, tuple[str, str, dict[str, Any] | None]]
    query: tuple[dict[str, Any], ...] = ()
    body: dict[str, Any] | None = None
    body_required: bool = True
    body_media: str = JSON
    errors: tuple[int, ...] = ()
    tags: tuple[str, ...] = field(default=())


def _ok(schema: dict[str, Any], status: int = 200, what: str = "success") -> dict[int, tuple[str, str, Any]]:
    return {status: (what, JSON, schema)}


def _q(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "in": "query", "required": False, "schema": schema}
    if description:
        out["description"] = description
    return out


def _obj(**props: Any) -> dict[str, Any]:
    return {"type": "object", "required": sorted(props), "properties": props}


_SUBMITTED = {"type": "object", "required": ["task_id", "created", "state"],
              "properties": {"task_id": {"type": "string"}, "created": {"type": "boolean"},
                             "state": {"type": "string"}, "outcome": {"type": ["object", "null"]}}}
_RESULT_QUERY = (*(_q(k, {"type": "string"}) for k in ("task_id", "worker_id", "task_type", "model",
                                                       "precision", "hardware", "config_hash", "fingerprint")),
                 _q("status", {"enum": sorted(RESULT_STATES)}),
                 _q("since", {"type": "number"}, "received at or after (Unix seconds)"),
                 _q("until", {"type": "number"}, "received before (Unix seconds)"),
                 _q("batch_size", {"type": "integer", "minimum": -INT64 - 1, "maximum": INT64}),
                 # the server refuses offset + limit > 2**63 - 1; described as each at most half of that
                 _q("limit", {"type": "integer", "minimum": 0, "maximum": HALF_INT64}, "rows at most (default 100)"),
                 _q("offset", {"type": "integer", "minimum": 0, "maximum": HALF_INT64}, "rows skipped (default 0)"))

SPECS: dict[tuple[str, str], RouteSpec] = {
    ("GET", "/healthz"): RouteSpec(_ok(_obj(status={"const": "ok"}, workers={"type": "integer"},
                                            tasks={"type": "integer"}, tasks_by_state={"type": "object"}))),
    ("GET", "/api/v1/health"): RouteSpec(_ok(_obj(status={"const": "ok"}, role={"enum": ["leader", "standby", "single"]},
                                                 leader=NULLABLE_STR, epoch={"type": ["integer", "null"]},
                                                 member_id=NULLABLE_STR))),
    ("GET", "/api/v1/cluster"): RouteSpec(_ok(_obj(
        leader=NULLABLE_STR, epoch={"type": ["integer", "null"]}, self=NULLABLE_STR,
        members={"type": "array", "items": _obj(
            member_id=NULLABLE_STR, url=NULLABLE_STR, role={"enum": ["leader", "standby"]},
            epoch={"type": ["integer", "null"]}, last_seen_age_s={"type": "number"}, healthy={"type": "boolean"},
            started_at={"type": ["number", "null"]})}))),
    ("GET", "/metrics"): RouteSpec({200: ("Prometheus text format (docs/operations.md lists the metrics)",
                                          "text/plain", {"type": "string"})}),
    ("GET", "/api/v1/openapi.json"): RouteSpec(_ok({"type": "object"}, what="this document")),
    ("GET", "/ws/worker"): RouteSpec({101: ("switching to the worker WebSocket protocol (docs/protocol.md)",
                                            "", None)}, errors=(400,)),
    ("POST", "/api/v1/auth/token"): RouteSpec(_ok(_obj(token={"type": "string"}, expires_at={"type": "integer"},
                                                       role={"type": "string"}, key_id={"type": "string"},
                                                       session_expires_at={"type": "integer"}))),
    ("POST", "/api/v1/keys"): RouteSpec(
        _ok({"type": "object", "required": ["key", *KEY_VIEW["required"]],
             "properties": {"key": {"type": "string"}, **KEY_VIEW["properties"]}}, 201, "the key, shown once"),
        body={"type": "object", "additionalProperties": False, "required": ["role"],
              "properties": {"role": {"enum": ["admin", "submitter", "viewer", "worker"]},
                             "name": {"type": "string", "maxLength": 100, "pattern": "^[ -~]*$",
                                      "description": "printable characters (non-ASCII printable ones are accepted "
                                                     "too); empty: ROLE-key"},
                             "expires_in_s": {"type": "number", "exclusiveMinimum": 0},
                             "allow_code": {"type": "boolean", "description": "the key may upload bundles and "
                                            "submit tasks that run them (submitter and admin keys only)"}},
              "if": {"required": ["allow_code"], "properties": {"allow_code": {"const": True}}},
              "then": {"properties": {"role": {"enum": ["admin", "submitter"]}}}},
        errors=(400,)),
    ("GET", "/api/v1/keys"): RouteSpec(_ok(_obj(keys={"type": "array", "items": {"$ref": REF + "KeyView"}}))),
    ("POST", "/api/v1/keys/{key_id}/revoke"): RouteSpec(_ok({"$ref": REF + "KeyView"}), errors=(404,)),
    ("DELETE", "/api/v1/keys/{key_id}"): RouteSpec(_ok({"$ref": REF + "KeyView"}), errors=(404,)),
    ("POST", "/api/v1/tasks"): RouteSpec(
        {**_ok(_obj(tasks={"type": "array", "items": _SUBMITTED}), 201, "at least one task was new"),
         **_ok(_obj(tasks={"type": "array", "items": _SUBMITTED}), 200, "every task was already known")},
        query=(WAIT,), body={"$ref": REF + "TaskSubmission"}, errors=(400, 409)),
    ("GET", "/api/v1/tasks"): RouteSpec(
        _ok(_obj(tasks={"type": "array", "items": {"$ref": REF + "TaskSummary"}}, total={"type": "integer"})),
        query=(_q("state", {"enum": list(TASK_STATES)}), _q("type", {"type": "string"}), _q("worker_id", {"type": "string"}),
               _q("tag", {"type": "string"}, "tasks that require this tag"),
               _q("submitted_by", {"type": "string"}, "tasks submitted with this key id"),
               _q("since", {"type": "number"}, "submitted at or after (Unix seconds)"),
               _q("until", {"type": "number"}, "submitted before (Unix seconds)"),
               _q("limit", {"type": "integer", "minimum": 1, "maximum": 10000}, "most tasks listed (default 100)"),
               _q("offset", {"type": "integer", "minimum": 0, "maximum": 10_000_000}, "matches skipped (default 0)")),
        errors=(400,)),
    ("GET", "/api/v1/overview"): RouteSpec(_ok({"type": "object"}, what="workers and tasks by state, the last "
                                                                        "hour per minute, the latest failures")),
    ("GET", "/api/v1/events"): RouteSpec({200: ("the change feed as server-sent events; resumes after the "
                                                "Last-Event-ID header", "text/event-stream", {"type": "string"})}),
    ("GET", "/api/v1/tasks/{task_id}"): RouteSpec(
        _ok({"$ref": REF + "TaskView"}),
        query=(WAIT, _q("result", {"type": "string"}, "0: leave out the stored result")), errors=(400, 404)),
    ("POST", "/api/v1/tasks/{task_id}/cancel"): RouteSpec(_ok({"$ref": REF + "TaskView"}), errors=(404, 409)),
    ("GET", "/api/v1/workers"): RouteSpec(
        _ok(_obj(workers={"type": "array", "items": {"$ref": REF + "Worker"}}, total={"type": "integer"})),
        query=(_q("limit", {"type": "integer", "minimum": 1, "maximum": 10000}, "most workers listed (default 10000)"),
               _q("offset", {"type": "integer", "minimum": 0, "maximum": 10_000_000},
                  "workers skipped, in worker id order (default 0)"),
               _q("state", {"enum": list(WORKER_STATES)}, "only workers in this state")),
        errors=(400,)),
    ("POST", "/api/v1/workers/{worker_id}/drain"): RouteSpec(
        _ok(_obj(worker_id={"type": "string"}, state={"const": "draining"}, deadline_s={"type": "number"},
                 reason={"type": "string"}), 202, "the worker was told to drain"),
        body={"type": "object", "additionalProperties": False,
              "properties": {"deadline_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400},
                             "reason": {"type": "string", "minLength": 1, "maxLength": 1000}}},
        body_required=False, errors=(400, 404, 409)),
    ("POST", "/api/v1/workers/{worker_id}/release"): RouteSpec(
        _ok(_obj(worker_id={"type": "string"}, released={"const": True})),
        body={"type": "object", "maxProperties": 0}, body_required=False, errors=(400, 404, 409)),
    ("GET", "/api/v1/results"): RouteSpec(
        _ok(_obj(results={"type": "array", "items": {"$ref": REF + "Result"}})), query=_RESULT_QUERY, errors=(400,)),
    ("GET", "/api/v1/schema/task"): RouteSpec(_ok({"type": "object"}, what="the task JSON Schema (draft 2020-12)")),
}

_DIGEST = {"type": "string", "pattern": "^[0-9a-f]{64}$", "description": "lower-case hex SHA-256"}
_BLOB = {"type": "string", "format": "binary"}
SPECS.update({
    ("POST", "/api/v1/blobs/missing"): RouteSpec(
        _ok(_obj(missing={"type": "array", "items": _DIGEST})),
        body={"type": "object", "required": ["digests"], "properties": {
            "digests": {"type": "array", "items": _DIGEST, "maxItems": 20000}}}),
    ("PUT", "/api/v1/blobs/{digest}"): RouteSpec(
        {**_ok(_obj(digest=_DIGEST, size={"type": "integer"}, created={"type": "boolean"}), 201, "stored"),
         **_ok(_obj(digest=_DIGEST, size={"type": "integer"}, created={"type": "boolean"}), 200, "already stored")},
        body=_BLOB, body_media="application/octet-stream"),
    ("POST", "/api/v1/blobs"): RouteSpec(
        _ok(_obj(stored={"type": "integer"}, created={"type": "integer"})),
        body={**_BLOB, "description": "records <digest: 64 ASCII hex><length: 8 bytes big-endian><bytes>"},
        body_media="application/octet-stream"),
    ("GET", "/api/v1/blobs/{digest}"): RouteSpec({200: ("the blob's bytes", "application/octet-stream", _BLOB)},
                                                 errors=(400, 404)),
    ("PUT", "/api/v1/bundles/{digest}"): RouteSpec(
        {**_ok(_obj(bundle=_DIGEST, files={"type": "integer"}, size={"type": "integer"}), 201, "stored"),
         **_ok(_obj(bundle=_DIGEST, files={"type": "integer"}, size={"type": "integer"}), 200, "already stored")},
        body={"$ref": REF + "Manifest"}),
    ("GET", "/api/v1/bundles/{digest}"): RouteSpec(_ok({"$ref": REF + "Manifest"}, what="the manifest's bytes"),
                                                   errors=(400, 404)),
})
LOG_VIEW = _obj(task_id={"type": "string"}, attempt={"type": "integer", "description": "the attempt shown"},
                state={"type": "string"},
                source={"enum": ["live", "result", "none"],
                        "description": "live: streamed by the running attempt's worker; result: kept with its result"},
                offset={"type": "integer", "description": "the byte offset the text starts at"},
                next_offset={"type": "integer", "description": "ask again from here for what follows"},
                bytes={"type": "integer", "description": "bytes the attempt wrote, kept or not"},
                text={"type": "string", "description": "the output from offset; bytes no longer kept read as one "
                                                       "'[... N bytes left out ...]' line"},
                complete={"type": "boolean", "description": "the task ended: nothing more will come"},
                started_at=NULLABLE_NUM, finished_at=NULLABLE_NUM,
                elapsed_s={**NULLABLE_NUM, "description": "seconds since the attempt began (to its end once ended)"})
SPECS[("GET", "/api/v1/tasks/{task_id}/logs")] = RouteSpec(
    _ok(LOG_VIEW, what="the task's output (stdout, stderr, pytest's report), bounded: its first 32 KiB and last "
                       "224 KiB"),
    query=(_q("offset", {"type": "integer", "minimum": 0, "maximum": INT64}, "byte offset to read from (default 0)"),
           _q("follow", {"enum": ["0", "1"]}, "1: wait until there is output past offset or the task ends"),
           _q("wait", {"type": "number", "minimum": 0, "maximum": 60}, "with follow: seconds to wait at most "
                                                                       "(default 4)"),
           _q("attempt", {"type": "integer", "minimum": 0, "maximum": INT64}, "the attempt read before: when the task shows another, "
                                                            "the answer starts at offset 0")),
    errors=(400, 404))
SPECS[("GET", "/api/v1/tasks/{task_id}/reports")] = RouteSpec(
    _ok(_obj(task_id={"type": "string"}, attempt={"type": "integer", "description": "the task's current attempt"},
             state={"type": "string"}, worker_id={**NULLABLE_STR, "description": "the worker it is assigned to"},
             complete={"type": "boolean", "description": "the task ended: its result carries every test, nothing "
                                                         "more comes here"},
             tree={**NULLABLE_STR, "description": "the worker's path of the tree the reports name"},
             after={"type": "integer", "description": "the index of the first test in tests"},
             next={"type": "integer", "description": "ask again with after= this for the tests that follow"},
             tests={"type": "array", "items": {"type": "object"},
                    "description": "each test's entry as the result's output.tests will carry it"}),
        what="the tests of the running attempt that ended there, in the order they ended (at most 4 MiB of them "
             "are kept; the result carries every test)"),
    query=(_q("after", {"type": "integer", "minimum": 0, "maximum": INT64}, "the index of the first test wanted "
                                                                           "(default 0)"),
           _q("wait", {"type": "number", "minimum": 0, "maximum": 60}, "seconds to wait for a test past after, or "
                                                                       "the task's end (default 0)"),
           _q("attempt", {"type": "integer", "minimum": 0, "maximum": INT64}, "the attempt read before: when the "
                                                                              "task is at another, the answer starts "
                                                                              "at its first test")),
    errors=(400, 404))
_RUN_FIELDS = {"run_id": {"type": "string", "pattern": specs.RUN_ID_PATTERN}, "name": {"type": "string"},
               "labels": {"type": "object", "additionalProperties": {"type": "string"}},
               "submitted_by": NULLABLE_STR, "created_at": {"type": "number"}}
RUN = {"type": "object", "required": sorted(_RUN_FIELDS), "properties": _RUN_FIELDS}
_RUN_SUMMARY_FIELDS = {
    **_RUN_FIELDS, "state": {"enum": ["queued", "running", "succeeded", "failed", "cancelled"]},
    "counts": {"type": "object", "additionalProperties": {"type": "integer"}, "description": "tasks by state"},
    "total": {"type": "integer"}, "started_at": {**NULLABLE_NUM, "description": "when its first task was first sent to a worker"},
    "ended_at": {**NULLABLE_NUM, "description": "the last task's end, once every task has finished"}}
RUN_SUMMARY = {"type": "object", "required": sorted(_RUN_SUMMARY_FIELDS), "properties": _RUN_SUMMARY_FIELDS}
_RUN_TASK = _obj(task_id={"type": "string"}, type={"type": "string"}, state={"enum": list(TASK_STATES)},
                 worker_id=NULLABLE_STR, started_at=NULLABLE_NUM, finished_at=NULLABLE_NUM, duration_s=NULLABLE_NUM,
                 error_line={**NULLABLE_STR, "description": "the first line of the task's error"},
                 tests={"type": ["object", "null"], "description": "test tasks: passed, failed, skipped, xfailed, "
                                                                   "errors and the failing tests' node ids"})
_PRINTABLE = "^[^\\x00-\\x1f\\x7f]*$"
_RUN_NAME = {"type": "string", "minLength": 1, "maxLength": 200, "pattern": _PRINTABLE}
SPECS.update({
    ("POST", "/api/v1/runs"): RouteSpec(
        {**_ok({"$ref": REF + "Run"}, 201, "the new run"),
         **_ok({"$ref": REF + "Run"}, 200, "the run this key made with this run_id, name and labels (a request sent "
                                            "again)")},
        body={"type": "object", "additionalProperties": False, "properties": {
            "run_id": {"type": "string", "pattern": "^run-[0-9a-f]{12}$",
                       "description": "an id the client chose, so the request may be sent again after a lost answer; "
                                      "held by another key, name or labels: 409"},
            "name": {**_RUN_NAME, "description": "the CI job, commit or branch; default: the key's name and the time"},
            "labels": {"type": "object", "maxProperties": 32,
                       "propertyNames": {"minLength": 1, "maxLength": 64, "pattern": _PRINTABLE},
                       "additionalProperties": {"type": "string", "minLength": 1, "maxLength": 256,
                                                "pattern": _PRINTABLE}}}},
        body_required=False, errors=(400, 409)),
    ("GET", "/api/v1/runs"): RouteSpec(
        _ok(_obj(runs={"type": "array", "items": {"$ref": REF + "RunSummary"}})),
        query=(_q("limit", {"type": "integer", "minimum": 1, "maximum": 200}, "most runs listed (default 20)"),
               _q("offset", {"type": "integer", "minimum": 0, "maximum": 10_000_000}, "runs skipped, newest first"),
               _q("submitted_by", {"type": "string"}, "runs created with this key id"),
               _q("state", {"enum": ["queued", "running", "succeeded", "failed", "cancelled"]},
                  "only the runs of the page in this state")),
        errors=(400,)),
    ("GET", "/api/v1/runs/{run_id}"): RouteSpec(
        _ok({"allOf": [{"$ref": REF + "RunSummary"}, _obj(tasks={"type": "array", "items": _RUN_TASK})]}),
        errors=(404,)),
    ("POST", "/api/v1/runs/{run_id}/cancel"): RouteSpec(
        _ok(_obj(run_id={"type": "string"}, cancelled={"type": "array", "items": {"type": "string"}},
                 finished={"type": "integer", "description": "tasks that had already finished"})),
        errors=(404,)),
    ("POST", "/api/v1/runs/{run_id}/rerun"): RouteSpec(
        _ok({"allOf": [{"$ref": REF + "RunSummary"}, _obj(
            source={"type": "string"},
            task_ids={"type": "object", "additionalProperties": {"type": "string"},
                      "description": "each task run again: its old id -> its new id"})]}, 201, "the new run"),
        body={"type": "object", "additionalProperties": False, "properties": {
            "failed": {"type": "boolean", "description": "only the tasks that failed, timed out, errored or "
                                                         "were cancelled"},
            "name": {**_RUN_NAME, "description": "default: the old run's name with (re-run)"}}},
        body_required=False, errors=(400, 404)),
})
MANIFEST = {"type": "object", "required": ["files"], "description": "a bundle's manifest (docs/tasks.md, \"Bundles\")",
            "properties": {"version": {"const": 1}, "files": {"type": "array", "items": {
                "type": "object", "required": ["path", "digest", "size"],
                "properties": {"path": {"type": "string"}, "digest": _DIGEST, "size": {"type": "integer", "minimum": 0},
                               "mode": {"enum": [420, 493]}}}}}}

Entry = tuple[str, str, Callable[..., Any], str | None]


def document(routes: Iterable[Entry]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes`` (method, path, handler, permission or None)."""
    paths: dict[str, dict[str, Any]] = {}
    for method, path, handler, perm in routes:
        paths.setdefault(path, {})[method.lower()] = _operation(method, path, handler, perm)
    return {"openapi": "3.1.0",
            "info": {"title": TITLE, "version": VERSION,
                     "description": "Every route names the permission it needs (x-permission); roles and "
                                    "permissions: docs/security.md. Errors share one JSON shape (Error)."},
            "paths": dict(sorted(paths.items())),
            "components": {"schemas": _schemas(),
                           "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                                          "description": "an API key, or a JWT from "
                                                                         "POST /api/v1/auth/token"}}}}


def _operation(method: str, path: str, handler: Callable[..., Any], perm: str | None) -> dict[str, Any]:
    spec = SPECS.get((method, path), RouteSpec({200: ("success", JSON, None)}))
    doc = (handler.__doc__ or "").strip()
    op: dict[str, Any] = {"operationId": f"{method.lower()}{_op_name(path)}",
                          "summary": doc.splitlines()[0] if doc else f"{method} {path}",
                          "x-permission": perm}
    if doc:
        op["description"] = " ".join(doc.split())
    if perm is None and path != "/ws/worker":
        op["security"] = []
    else:
        op["security"] = [{"bearer": []}]
    params = [{"name": n, "in": "path", "required": True, "schema": _DIGEST if n == "digest" else {"type": "string"}}
              for n in _path_params(path)] + list(spec.query)
    if params:
        op["parameters"] = params
    if spec.body is not None:
        op["requestBody"] = {"required": spec.body_required, "content": {spec.body_media: {"schema": spec.body}}}
    responses: dict[str, Any] = {}
    for status, (what, media, schema) in spec.ok.items():
        responses[str(status)] = {"description": what}
        if media:
            responses[str(status)]["content"] = {media: {"schema": schema or {}}}
    errors = set(spec.errors) | {405}
    if perm is not None or path == "/ws/worker":
        errors |= {401, 403, 429, 502, 503, 504}
    if spec.body is not None:
        errors |= {400, 413}
    for status in sorted(errors):
        responses[str(status)] = {"description": _ERRORS[status],
                                  "content": {JSON: {"schema": {"$ref": REF + "Error"}}}}
    op["responses"] = responses
    return op


def _path_params(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{") and part.endswith("}")]


def _op_name(path: str) -> str:
    words = [p.strip("{}").replace(".", "_").replace("-", "_") for p in path.split("/") if p]
    return "".join(w[:1].upper() + w[1:] for w in words)


def _schemas() -> dict[str, Any]:
    task = specs.task_json_schema()
    text = json.dumps(task).replace('"#/$defs/', f'"{REF}')
    moved: dict[str, Any] = json.loads(text)
    schemas: dict[str, Any] = dict(moved.pop("$defs"))
    schemas["TaskSubmission"] = {"description": "one task or a list of tasks (docs/tasks.md)",
                                 "oneOf": moved["oneOf"]}
    schemas.update(Error=ERROR, KeyView=KEY_VIEW, TaskSummary=TASK_SUMMARY, TaskView=TASK_VIEW, Worker=WORKER_VIEW,
                   Result=RESULT_VIEW, Manifest=MANIFEST, Run=RUN, RunSummary=RUN_SUMMARY)
    return schemas
