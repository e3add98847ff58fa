"""A paused (SIGSTOP) leader, as its clients see it: three real coordinator processes on
PostgreSQL, a ``--high-availability`` worker given every member and ``dt submit --wait`` polling
the leader when it freezes. ``dt`` gives up on the silent member after the first-byte bound and
follows its task on the new leader (it used to exit 2, "timed out"); the worker, whose session
with the paused leader ended, tries the other members before going back to it, although they name
the paused one as leader until its lease runs out (it used to go back and wait out its 10 s
handshake timeout)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ha_support import ROOT, HaGroup, db_tasks

from distributed_testing.testing import pg_database_sync, wait_until

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


@pytest.fixture
def group(tmp_path: Path) -> Iterator[HaGroup]:
    with pg_database_sync(prefix="dt_ha_paused") as dsn:
        g = HaGroup(tmp_path, dsn)
        try:
            yield g
        finally:
            g.close()


def test_dt_wait_and_a_worker_move_past_a_paused_leader(group: HaGroup, tmp_path: Path) -> None:
    a = group.start_member("a")
    group.wait_role(a, "leader")
    b, c = group.start_member("b"), group.start_member("c")
    group.wait_role(b, "standby")
    group.wait_role(c, "standby")
    admin = group.admin(a)
    urls = [a.url, b.url, c.url]
    group.start_worker("w1", urls, admin.create_key("worker"), "--high-availability")
    wait_until(lambda: "w1" in admin.workers(), 60, "the worker to register")
    doc = tmp_path / "tasks.json"
    doc.write_text(json.dumps([{"type": "custom", "max_retries": 2,
                                "config": {"name": "sleep", "parameters": {"seconds": 2}}}]))
    dt = subprocess.Popen([sys.executable, "-m", "distributed_testing.cli.dt", "--coordinator", ",".join(urls),
                           "--api-key", admin.key, "submit", str(doc), "--wait", "--progress", "plain"],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert dt.stdout is not None
    task_id = dt.stdout.readline().decode().strip()
    a.proc.send_signal(signal.SIGSTOP)
    paused = time.time()
    try:
        out, err = dt.communicate(timeout=120)
        assert dt.returncode == 0, err.decode()[-3000:]
        assert db_tasks(group.dsn)[task_id]["state"] == "succeeded"
        log = (tmp_path / "w1.log").read_text(errors="replace")
        lost = log.find(f"session with coordinator {a.url} lost")
        assert lost >= 0, log[-3000:]
        back = log.find("registered with coordinator as w1", lost)
        assert back >= 0, log[lost:][-3000:]
        assert f"coordinator {a.url}: " not in log[lost:back], log[lost:back]  # no attempt on the paused one
    finally:
        a.proc.send_signal(signal.SIGCONT)
    print(f"\npause -> dt --wait done {time.time() - paused:.1f}s")
