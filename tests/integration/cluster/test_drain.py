"""SIGTERM drains a real ``run_worker_example.py`` process: it takes no new work, lets a short task
finish, hands back a long one (which then runs on another worker as a new attempt without using a
retry), unregisters and exits 0. A second signal stops it at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from distributed_testing.testing import Cluster, hidden_accelerators, run_cluster, wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
ROOT = Path(__file__).resolve().parents[3]


def sleep(task_id: str, seconds: float) -> dict[str, Any]:
    return {"task_id": task_id, "type": "custom", "config": {"name": "sleep", "parameters": {"seconds": seconds}},
            "requirements": {"tags": ["drain"]}}


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    started: list[subprocess.Popen[bytes]] = []

    def start(c: Cluster, key: str, *argv: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / f"worker{len(started)}.log"
        env = ({k: v for k, v in os.environ.items() if not k.startswith("DT_")} | {"PYTHONUNBUFFERED": "1"}
               | hidden_accelerators(tmp_path))
        with open(log, "wb") as out:
            p = subprocess.Popen([sys.executable, str(ROOT / "run_worker_example.py"), "--coordinator", c.base_url,
                                  "--api-key", key, "--tags", "drain", "--heartbeat-interval", "1", *argv],
                                 cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, env=env)
        started.append(p)
        return p, log

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()


async def exit_code(p: subprocess.Popen[bytes], log: Path, timeout: float = 20) -> int:
    await wait_for(lambda: p.poll() is not None, timeout=timeout, what=f"worker to exit; log:\n{log.read_text()[-3000:]}")
    return int(p.returncode)


async def test_sigterm_finishes_short_tasks_hands_back_long_ones_and_exits_0(tmp_path: Path, spawn: Any) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        p, log = spawn(c, await c.create_key("worker"), "--worker-id", "leaving", "--max-concurrent-tasks", "2",
                       "--drain-timeout", "3")
        await wait_for(lambda: "leaving" in c.runtime.sessions, timeout=30, what="the worker process to register")
        await c.submit([sleep("short", 1), sleep("long", 60)])
        tasks = c.runtime.state.tasks
        await wait_for(lambda: tasks["short"].state == tasks["long"].state == "running", what="both tasks running")

        p.send_signal(signal.SIGTERM)
        await wait_for(lambda: c.runtime.state.workers["leaving"].health == "draining", what="a draining heartbeat")
        assert c.runtime.state.workers["leaving"].health_reason == "received SIGTERM"
        await c.add_worker(tags=("drain",))  # w0: where the handed-back task goes

        short = await c.wait("short")
        assert (short["state"], short["outcome"]["worker_id"], short["outcome"]["attempt"]) == ("succeeded", "leaving", 1)
        await wait_for(lambda: tasks["long"].worker_id == "w0" and tasks["long"].state == "running",
                       timeout=20, what="the long task to run on the other worker")
        assert (tasks["long"].attempt, tasks["long"].retries_used) == (2, 0)
        assert any("handed back by leaving: drain timeout after 3s" in h["cause"] for h in tasks["long"].history)

        assert await exit_code(p, log) == 0
        text = log.read_text()
        assert "handing back 1 task(s) still running after the 3s drain timeout: long (attempt 1)" in text
        assert "drain complete; unregistered from the coordinator" in text and "Traceback" not in text
        await c.request("POST", "/api/v1/tasks/long/cancel")


async def test_a_second_signal_stops_at_once(tmp_path: Path, spawn: Any) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        p, log = spawn(c, await c.create_key("worker"), "--worker-id", "impatient", "--drain-timeout", "120")
        await wait_for(lambda: "impatient" in c.runtime.sessions, timeout=30, what="the worker process to register")
        await c.submit([sleep("long", 60)])
        await wait_for(lambda: c.runtime.state.tasks["long"].state == "running", what="the task running")
        p.send_signal(signal.SIGTERM)
        await wait_for(lambda: c.runtime.state.workers["impatient"].health == "draining", what="a draining heartbeat")
        p.send_signal(signal.SIGINT)
        assert await exit_code(p, log, timeout=15) == 0  # well before the 120 s drain timeout
        assert "received SIGINT again; stopping now" in log.read_text()
        await c.request("POST", "/api/v1/tasks/long/cancel")
