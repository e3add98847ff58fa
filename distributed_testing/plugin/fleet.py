"""The pytest plugin's calls to the coordinator (:class:`Fleet`), its client built from the
pytest options and the environment (:func:`_client`), and the cancel of what a run left queued.

Imported by every pytest where the package is installed (through :mod:`..pytest_plugin`): the
HTTP client and its TLS code are imported where a fleet run first needs them.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..config import env_pick, environ, parse_urls
from ..errors import ConfigError

if TYPE_CHECKING:
    from ..cli.http import ApiClient


# what the plugin's shipping threads import (pytest_plugin.FleetRunner._prepare)
SHIPPING_IMPORTS = ("bundles.environment", "bundles.upload", "cli.http", "cli.runs", "security.tls", "tasks.pyreqs")


def preload() -> None:
    """Import :data:`SHIPPING_IMPORTS` in the calling (main) thread, before the shipping threads
    start: a module's logger made in one of them while pytest's logging plugin walked the loggers
    at collection ended a run with INTERNALERROR ("dictionary changed size during iteration")."""
    for name in SHIPPING_IMPORTS:
        importlib.import_module(f"distributed_testing.{name}")


def _client(config: pytest.Config) -> ApiClient:
    from ..cli.http import ApiClient
    from ..security import tls

    env = environ()
    try:
        urls = parse_urls(config.getoption("--dt-coordinator"), "--dt-coordinator")
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from exc
    key, _ = env_pick(config.getoption("--dt-api-key"), env, "DT_API_KEY")
    if not key:
        raise pytest.UsageError("--dt-coordinator needs credentials: pass --dt-api-key or set DT_API_KEY")
    ca, ca_src = env_pick(config.getoption("--dt-ca-file"), env, "DT_CA_FILE")
    try:
        context = tls.client_context(Path(ca) if ca else None, "--dt-ca-file" if ca_src == "flag" else ca_src)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from exc
    return ApiClient(urls, key, ssl_context=context if any(u.startswith("https://") for u in urls) else None)


SUBMIT_BYTES = 4 * 1024 * 1024  # a quarter of the coordinator's default frame limit


def submit_batches(docs: list[dict[str, Any]], limit: int = SUBMIT_BYTES) -> list[list[dict[str, Any]]]:
    """``docs`` in order, cut into lists whose JSON is at most ``limit`` bytes (a document over it
    alone in its list)."""
    batches: list[list[dict[str, Any]]] = []
    size = 0
    for doc in docs:
        n = len(json.dumps(doc, separators=(",", ":")).encode()) + 1
        if not batches or size + n > limit:
            batches.append([])
            size = 0
        batches[-1].append(doc)
        size += n
    return batches


class Fleet:
    """Every coordinator call the plugin makes, in one place (the seam for a shared client)."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api

    def slots(self, *, bundle: bool = False) -> int:
        """Task slots of the connected workers (at least 1); with ``bundle`` only of those that run
        shipped code (``--accept-bundles``), the only ones a bundle's tasks can be placed on."""
        workers = self.api.get("/api/v1/workers").get("workers") or []
        return max(1, sum(int(w.get("max_concurrent") or 0) for w in workers
                          if w.get("state") != "disconnected" and (w.get("accept_bundles") or not bundle)))

    def start_run(self, name: str, labels: dict[str, str]) -> dict[str, Any]:
        """A new run for this session's tasks (``cli/runs.py``)."""
        from ..cli import runs

        return runs.create_run(self.api, name, labels)

    def submit(self, docs: list[dict[str, Any]]) -> None:
        """Submit ``docs`` in requests of at most :data:`SUBMIT_BYTES` of JSON each (one document
        over it goes alone): the coordinator refuses a body over its frame limit (16 MiB by
        default), and a suite of 150,000 tests, or one whose test names hold their data, sends more."""
        for batch in submit_batches(docs):
            self.api.post("/api/v1/tasks", batch, repeatable=True)  # every task has its id: a re-send is the same tasks

    def state(self, task_id: str, wait_s: float) -> dict[str, Any]:
        """The task without its result; waits up to ``wait_s`` for it to finish."""
        t: dict[str, Any] = self.api.get(f"/api/v1/tasks/{task_id}", {"wait": f"{wait_s:.3f}", "result": "0"})
        return t

    def reports(self, task_id: str, after: int, attempt: int | None, wait_s: float) -> dict[str, Any]:
        """The tests of the task's running attempt that ended there from the ``after``-th (of
        ``attempt``: another one starts from its first); waits up to ``wait_s`` for one or its end."""
        params = {"after": str(after), "wait": f"{wait_s:.3f}", **({"attempt": str(attempt)} if attempt is not None else {})}
        page: dict[str, Any] = self.api.get(f"/api/v1/tasks/{task_id}/reports", params)
        return page

    def finished(self, task_id: str) -> dict[str, Any]:
        t: dict[str, Any] = self.api.get(f"/api/v1/tasks/{task_id}")
        return t

    def cancel(self, task_id: str) -> None:
        """Cancel a task no longer needed; one that finished meanwhile (409) is left as it is."""
        from ..cli.http import ApiError

        try:
            self.api.post(f"/api/v1/tasks/{task_id}/cancel", None, repeatable=True)  # a second cancel changes nothing
        except ApiError as exc:
            if exc.status != 409:
                raise


def _cancel_all(fleet: Fleet, pending: Iterable[str], *, quiet: bool) -> None:
    """Cancel every task in ``pending``; ``quiet``: an exception is already on its way, so a
    coordinator that cannot be reached must not replace it."""
    from ..cli.http import ApiError

    for task_id in list(pending):
        try:
            fleet.cancel(task_id)
        except ApiError:
            if not quiet:
                raise
