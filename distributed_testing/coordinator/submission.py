"""Accepting tasks: ``POST /api/v1/tasks`` after authorization, whichever HTTP layer took it
(``fast_http`` or aiohttp), and a run's re-run (``runs_api``), which submits its tasks again.

A task naming a ``run_id`` joins that run: the run must exist (400 naming ``run_id`` otherwise)
and belong to the submitting key unless that key is an admin's (403).
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import PermissionDenied, ValidationError
from ..security import auth as sa
from ..security import roles
from ..tasks import spec as specs
from . import bundles_api, views
from .runtime import Runtime

log = logging.getLogger(__name__)
MAX_WAIT_S = 300.0
# A ``?wait`` submission is answered only with its outcome, so its records need not be durable
# before the outcome's: they wait up to this long to share one fsync with the result of a task
# that finishes that fast (a task that takes longer costs nothing more). Measured with
# benchmarks/dispatch.py: see docs/architecture.md, "Measured".
WAIT_SUBMIT_LINGER_S = 0.002


async def submit(rt: Runtime, principal: sa.Principal, raw: bytes, wait: float) -> tuple[int, dict[str, Any]]:
    """Accept the tasks in ``raw``, wait up to ``wait`` s for them; (status, body)."""
    parsed, warnings = specs.parse_task_json_with_warnings(raw)
    return await accept(rt, principal, parsed, wait, listed=specs.is_list(raw), warnings=warnings)


async def accept(rt: Runtime, principal: sa.Principal, parsed: list[specs.TaskSpec], wait: float = 0.0, *,
                 listed: bool = True, warnings: list[str] | None = None) -> tuple[int, dict[str, Any]]:
    """Accept ``parsed`` for ``principal`` (its bundles and runs checked first); (status, body)."""
    await bundles_api.check_bundles(rt, principal, parsed, listed)
    await check_runs(rt, principal, parsed)
    for warning in warnings or []:
        log.warning("submission by key %s: %s", principal.key_id, warning)
    # a resubmitted id may belong to a task that finished and left memory: read it back first, so
    # the answer is the same (created false, or a conflict) as while it was in memory
    if rt.state.missing(s.task_id for s in parsed if s.task_id is not None):
        await views.load_missing(rt.state, rt.store, [s.task_id for s in parsed if s.task_id is not None])
    now = rt.clock()
    accepted, cmds = rt.state.submit(parsed, now, submitted_by=principal.key_id)
    created = sum(1 for a in accepted if a["created"])
    rt.metrics.submitted.inc(created)
    rt.activity.submitted(now, created)
    await rt.execute(cmds, linger_s=WAIT_SUBMIT_LINGER_S if wait > 0 else 0.0)
    status = 201 if created else 200
    if wait > 0:
        ids = [a["task_id"] for a in accepted]
        await rt.wait_finished(ids, wait)
        for a, t in zip(accepted, await rt.settled(ids, MAX_WAIT_S), strict=True):
            a["state"], a["outcome"] = t.state, t.outcome
    return status, ({"tasks": accepted, "warnings": warnings} if warnings else {"tasks": accepted})


async def check_runs(rt: Runtime, principal: sa.Principal, parsed: list[specs.TaskSpec]) -> None:
    """Every run the tasks name exists (ValidationError on ``run_id``) and is the key's own, or
    the key is an admin's (PermissionDenied)."""
    wanted = sorted({s.run_id for s in parsed if s.run_id is not None})
    if not wanted:
        return
    found = await rt.store.get_runs(wanted)
    missing = [r for r in wanted if r not in found]
    if missing:
        raise ValidationError([{"field": "run_id", "error": f"no run {r!r}: create it with POST /api/v1/runs"}
                               for r in missing])
    if principal.role != roles.Role.ADMIN:
        for run in found.values():
            if run.submitted_by not in (None, principal.key_id):
                raise PermissionDenied(f"run {run.run_id} was created by another key; only it or an admin "
                                       "may add tasks to it")
