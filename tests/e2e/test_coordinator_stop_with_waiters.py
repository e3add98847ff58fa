"""A coordinator stops on SIGTERM while clients wait on it (``dt submit --wait``, ``?wait=`` on a
task): each gets its answer with the state as it is, at once, and the process exits 0.

The regression: the lean front's site waited up to its 60 s shutdown bound for busy connections
before aiohttp ran ``on_shutdown``, the hook that answers the ``?wait`` requests, so one waiting
client held a stopping coordinator for as long as it asked to wait (up to 300 s)."""

from __future__ import annotations

import json
import signal
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from distributed_testing.testing import Procs, Rest, start_coordinator_process, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
# the waits below ask for 300 s; the stop takes about a second here
EXIT_BOUND_S = 60.0


def test_sigterm_answers_the_waiting_clients_and_exits_without_waiting_them_out(procs: Procs, tmp_path: Path) -> None:
    coordinator, port = start_coordinator_process(procs, tmp_path / "c" / "c.duckdb")
    url = f"http://127.0.0.1:{port}"
    key = (tmp_path / "c" / "admin.key").read_text().strip()
    [held] = Rest(url, key).submit({"type": "custom", "config": {"name": "noop"}})  # no worker: it stays pending
    answers: dict[str, Any] = {}

    def call(name: str, method: str, path: str, body: Any = None) -> None:
        req = urllib.request.Request(url + path, method=method, headers={"Authorization": f"Bearer {key}"},
                                     data=None if body is None else json.dumps(body).encode())
        with urllib.request.urlopen(req, timeout=400) as r:
            answers[name] = (r.status, json.loads(r.read()))

    threads = [threading.Thread(target=call, args=("submit", "POST", "/api/v1/tasks?wait=300",
                                                   {"type": "custom", "config": {"name": "noop"}})),
               threading.Thread(target=call, args=("task", "GET", f"/api/v1/tasks/{held}?wait=300"))]
    for t in threads:
        t.start()
    wait_until(lambda: len(Rest(url, key).tasks()) == 2, 30, "the waiting submission to be accepted")
    coordinator.send_signal(signal.SIGTERM)
    assert coordinator.wait(EXIT_BOUND_S) == 0
    for t in threads:
        t.join(10)
    status, body = answers["submit"]
    assert status == 201 and body["tasks"][0]["state"] == "pending" and body["tasks"][0]["outcome"] is None
    status, body = answers["task"]
    assert status == 200 and body["task_id"] == held and body["state"] == "pending"
