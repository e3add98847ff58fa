"""The wait for one task of a plugin run (a thread per task): each of its tests as it ends there,
then its finished record.

While the task runs, its watcher long-polls ``GET /api/v1/tasks/{id}/reports`` (docs/tasks.md,
"Test reports while a task runs") and hands each new page of ended tests to the main thread
(:class:`Live`), which replays them at once, as pytest-xdist prints its workers' tests. From the
finished record (``GET /api/v1/tasks/{id}``) the main thread replays every test it has not
replayed live, so a page lost, a stream cut (the route failing: the watcher then only waits for
the end) or a worker that died mid-chunk loses no test and repeats none. A test is reported once,
from the first attempt that finished it: one replayed live from an attempt that is then retried
keeps that attempt's outcome here (the stored result, which the dashboard shows, is the retry's).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from .fleet import Fleet

WATCH_S = 1.0  # how long one of a task's watchers' requests waits for a test or its end
POLL_S = 0.5


@dataclass
class Live:
    """Tests of a running task's ``attempt`` that ended on ``worker`` (entries as its result will
    carry them, the next after those of the attempt's earlier pages; ``tree``: the worker's path of
    the tree they name)."""

    worker: str
    tree: str | None
    tests: list[dict[str, Any]]
    attempt: Any = None


News = queue.Queue[tuple[str, "dict[str, Any] | Live | BaseException"]]


def watch(fleet: Fleet, task_id: str, news: News, stop: threading.Event, stuck_after: float) -> None:
    """Wait for ``task_id``: its ended tests go to ``news`` as :class:`Live` pages, then its
    finished record; or, once no connected worker could run it for ``stuck_after`` seconds in a
    row, the cancelled task with the reason. An exception goes to ``news`` too."""
    from ..client import ApiError

    stuck_since: float | None = None
    live, after, attempt = True, 0, None
    try:
        while not stop.is_set():
            if live:
                try:
                    page = fleet.reports(task_id, after, attempt, WATCH_S)
                except ApiError:  # no live stream (an older coordinator, a failover): the result brings them
                    live = False
                    continue
                attempt, after = page.get("attempt"), int(page.get("next") or 0)
                if page.get("tests"):
                    worker = str(page.get("worker_id") or "-")
                    news.put((task_id, Live(worker, page.get("tree"), page["tests"], attempt)))
                if page.get("complete"):
                    news.put((task_id, fleet.finished(task_id)))
                    return
                if page.get("state") != "pending":
                    continue
                t = fleet.state(task_id, 0.0)
            else:
                t = fleet.state(task_id, WATCH_S)
            if t.get("outcome") is not None:
                news.put((task_id, fleet.finished(task_id)))
                return
            if not t.get("unschedulable"):
                stuck_since = None
                continue
            stuck_since = stuck_since or time.monotonic()
            if time.monotonic() - stuck_since >= stuck_after:
                reason = f"no connected worker can run it for {stuck_after:g} s: {t.get('pending_reason')}"
                fleet.cancel(task_id)
                news.put((task_id, {**t, "outcome": {"error": reason}}))
                return
            stop.wait(min(POLL_S, stuck_after))
    except BaseException as exc:  # noqa: BLE001 - the main thread raises it
        news.put((task_id, exc))
