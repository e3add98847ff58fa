"""One address for the group, as a load balancer gives it (issue 40): three real coordinators on
PostgreSQL (``HaCluster``) behind a round-robin TCP proxy (``testing.RoundRobinProxy``), and the
project's own clients knowing only the proxy: ``dt submit --wait`` of 20 tasks, each with a
``task_id`` (``DT_COORDINATOR_URL`` set to the proxy), and the pytest plugin's ``Fleet`` (submit,
``?wait`` polls, a cancel). The leader is paused (SIGSTOP) for 12 s just before they start, so
every first request meets the paused group: a timeout at the silent member, a standby's 503, or
its 504 ``answer_lost``. Both ride it out on their own (they used to stop at the first such answer
with one URL: exit 1 "HTTP 504 answer_lost ... send it again only if that is safe", or exit 2
"cannot reach coordinator ... timed out"), and every task ends as asked exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from chaos_group import HaCluster, group_behind_proxy
from chaos_support import ROOT, TERMINAL

from distributed_testing.client import ApiClient
from distributed_testing.pytest_plugin import Fleet
from distributed_testing.testing import wait_until

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

PAUSE_S = 12.0  # the pause: past the lease TTL (5 s), so a standby takes over meanwhile
TASKS = 20


def sleep_task(task_id: str, seconds: float) -> dict[str, Any]:
    return {"task_id": task_id, "type": "custom", "max_retries": 2,
            "config": {"name": "sleep", "parameters": {"seconds": seconds}}}


def plugin_run(fleet: Fleet, errors: list[BaseException], ends: dict[str, str]) -> None:
    """What the plugin does for a run: submit (every task has an id), poll each with ``?wait``
    until it ends, cancel the one no longer needed."""
    try:
        fleet.submit([sleep_task("lb-plugin-0", 0.5), sleep_task("lb-plugin-1", 0.5),
                      sleep_task("lb-plugin-spare", 300)])
        fleet.cancel("lb-plugin-spare")
        for task_id in ("lb-plugin-0", "lb-plugin-1", "lb-plugin-spare"):
            while (state := fleet.state(task_id, 2.0)["state"]) not in TERMINAL:
                pass
            ends[task_id] = state
    except BaseException as exc:  # reported by the test's thread
        errors.append(exc)


def test_dt_and_the_plugin_ride_out_a_paused_leader_through_one_address(tmp_path: Path) -> None:
    with group_behind_proxy(tmp_path, "dt_chaos_lb_pause") as (cluster, proxy):
        _run(cluster, proxy.url, tmp_path)


def _run(cluster: HaCluster, proxy_url: str, tmp_path: Path) -> None:
    key = cluster.api.key
    ids = [f"lb-dt-{i}" for i in range(TASKS)]
    doc = tmp_path / "tasks.json"
    doc.write_text(json.dumps([sleep_task(t, 0.5) for t in ids]))
    wait_until(lambda: cluster.leader() is not None, 60, "a leader")
    leader = cluster.leader()
    assert leader is not None
    cluster.pause_member(leader)
    paused = time.monotonic()
    env = {**os.environ, "DT_COORDINATOR_URL": proxy_url, "DT_API_KEY": key}
    dt = subprocess.Popen([sys.executable, "-m", "distributed_testing.cli.dt", "submit", str(doc), "--wait",
                           "--progress", "plain"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    errors: list[BaseException] = []
    ends: dict[str, str] = {}
    plugin = threading.Thread(target=plugin_run, args=(Fleet(ApiClient(proxy_url, key)), errors, ends))
    plugin.start()
    try:
        time.sleep(max(0.0, paused + PAUSE_S - time.monotonic()))  # the disruption's length, not a wait for a condition
    finally:
        cluster.resume_member(leader)
    out, err = dt.communicate(timeout=200)
    took = time.monotonic() - paused
    plugin.join(120)
    assert dt.returncode == 0, err.decode(errors="replace")[-3000:]
    assert out.decode().split() == ids
    assert not plugin.is_alive() and not errors, errors
    assert ends == {"lb-plugin-0": "succeeded", "lb-plugin-1": "succeeded", "lb-plugin-spare": "cancelled"}, ends
    for task_id in ids + ["lb-plugin-0", "lb-plugin-1"]:
        history = cluster.api.ok("GET", f"/api/v1/tasks/{task_id}", params={"result": "0"})["history"]
        assert sum(h["to"] == "succeeded" for h in history) == 1, (task_id, history)  # submitted and run once
    print(f"\npause {PAUSE_S:g}s -> dt submit --wait of {TASKS} tasks exited 0 after {took:.1f}s")
