"""What some ``data/*`` routes add to the coordinator's answers before the pages see them.

- ``coordinators``: the Overview's list. Every member ``GET /api/v1/cluster`` names (a member that
  died stays there, unhealthy, until the group forgets it an hour later) and every URL this
  dashboard was configured with, each once: ``url``, ``role`` (leader, standby, or null for a
  configured URL the group does not list), ``healthy``, ``in_use``, ``last_seen_age_s``,
  ``health`` (the member's ``/healthz`` answer) and ``error``. Mounted in a coordinator, the
  dashboard probes no URL of its own: the member it runs in is the one in use.
- ``benchmark_models``: the models that have benchmark results among the newest
  ``MODEL_SCAN`` (the Benchmarks page's picker), each with its result count and latest time.
"""

from __future__ import annotations

from typing import Any

from .client import CoordinatorClient

MODEL_SCAN = 1000


async def coordinators(client: CoordinatorClient, credential: str, browser: str | None,
                       mounted: bool) -> list[dict[str, Any]]:
    status, view = await client.request("GET", "/api/v1/cluster", credential, client=browser)
    members = view.get("members", []) if status == 200 and isinstance(view, dict) else []
    rows: dict[str, dict[str, Any]] = {}
    if not mounted:
        for probe in await client.health():
            rows[probe["url"].rstrip("/")] = {**probe, "role": None, "last_seen_age_s": None}
    for m in sorted(members, key=lambda m: (m.get("role") != "leader", m.get("url") or "")):
        url = str(m.get("url") or "").rstrip("/")
        if not url:
            continue
        probed = url in rows  # configured and probed: healthy when both it and the group say so
        row = rows.setdefault(url, {"url": url, "in_use": False, "health": None, "error": None})
        row.update(role=m.get("role"), last_seen_age_s=m.get("last_seen_age_s"), member_id=m.get("member_id"),
                   healthy=bool(m.get("healthy")) and (not probed or bool(row.get("healthy"))))
        if mounted and m.get("member_id") == view.get("self"):  # None == None for a lone coordinator
            row["in_use"] = True
        if not m.get("healthy"):
            age = m.get("last_seen_age_s")
            seen = f"for {age:.0f} s" if isinstance(age, (int, float)) else "lately"
            row["error"] = row.get("error") or f"the group has not seen it {seen}"
    return list(rows.values())


async def benchmark_models(client: CoordinatorClient, credential: str, browser: str | None) -> tuple[int, Any]:
    status, body = await client.request("GET", "/api/v1/results", credential, client=browser,
                                        params={"task_type": "benchmark", "limit": str(MODEL_SCAN)})
    if status != 200:
        return status, body
    seen: dict[str, dict[str, Any]] = {}
    for r in body.get("results", []):
        model = (r.get("output") or {}).get("model")
        if not isinstance(model, str) or not model:
            continue
        m = seen.setdefault(model, {"model": model, "results": 0, "last_at": None})
        m["results"] += 1
        at = r.get("finished_at")
        if isinstance(at, (int, float)) and (m["last_at"] is None or at > m["last_at"]):
            m["last_at"] = at
    models = sorted(seen.values(), key=lambda m: -(m["last_at"] or 0))
    return 200, {"models": models, "scanned": len(body.get("results", [])), "scan_limit": MODEL_SCAN}
