"""``dt logs -f`` through a failover (issue 38, logs): two coordinators on PostgreSQL and a worker
with ``--high-availability`` run a custom task that prints a line and waits for a file. A real
``dt logs -f`` process that knows both members prints the first line; the leader is SIGKILLed;
the task then prints its second line and ends on the new leader. ``dt`` must print each line
exactly once (the worker sends its kept output again to the new leader from offset 0; the reader
asks from where it was) and exit 0 for the task's success."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from chaos_group import HaCluster
from chaos_support import ROOT

from distributed_testing.testing import pg_database_sync, wait_until

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def test_dt_logs_follows_a_task_across_a_leader_kill(tmp_path: Path) -> None:
    go = tmp_path / "go"
    with pg_database_sync(prefix="dt_chaos_logs") as db_url:
        cluster = HaCluster(tmp_path, db_url, members=2)
        try:
            cluster.start_group()
            cluster.add_ha_worker("lw", slots=1)
            cluster.wait_registered(["lw"])
            status, body = cluster.api.request("POST", "/api/v1/tasks", json={
                "task_id": "follow-me", "type": "custom",
                "config": {"name": "chaos_print_wait", "parameters": {"go": str(go)}}})
            assert status == 201, body
            env = {k: v for k, v in os.environ.items() if not k.startswith("DT_")}
            follower = subprocess.Popen(
                [sys.executable, "-m", "distributed_testing.cli.dt", "--coordinator", ",".join(cluster.urls),
                 "--api-key", cluster.api.key, "logs", "-f", "follow-me"],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                assert follower.stdout is not None
                assert follower.stdout.readline() == "first line\n"  # the task waits for go meanwhile
                old = cluster.leader()
                assert old is not None
                cluster.kill_member(old)
                wait_until(lambda: cluster.leader() not in (None, old), 60, "a new leader")
                go.touch()
                out, err = follower.communicate(timeout=120)
            finally:
                if follower.poll() is None:
                    follower.kill()
            assert follower.returncode == 0, err
            assert out == "second line\n", (out, err)
            status, task = cluster.api.request("GET", "/api/v1/tasks/follow-me")
            assert task["state"] == "succeeded", task
            status, page = cluster.api.request("GET", "/api/v1/tasks/follow-me/logs")
            assert page["text"] == "first line\nsecond line\n" and page["source"] == "result", page
        finally:
            cluster.close()
