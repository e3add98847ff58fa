"""Scenario b: three worker processes, 300 short tasks, the coordinator SIGKILLed twice mid-run
and restarted on the same DuckDB file and port. The workers notice, reconnect on their own,
re-announce what they run and re-send what they finished meanwhile. Every task ends with exactly
one outcome and none is lost.

No worker dies here, so no task should need a retry: the tasks get ``max_retries`` 0, and a task
the restart made the coordinator give up on shows up as lost."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from chaos_support import TERMINAL, ChaosCluster, Tally, quiesce, record_task

pytestmark = pytest.mark.timeout(240)

WORKERS = ("ca", "cb", "cc")
KILL_AT = (90, 200)  # tasks finished when the coordinator is killed
DOWN_S = 1.0


def finished(c: ChaosCluster, ids: list[str]) -> int:
    try:
        tasks = c.api.tasks()
    except OSError:
        return 0
    return sum(1 for t in ids if tasks.get(t, {}).get("state") in TERMINAL)


def test_coordinator_kills_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    seed = random.randrange(1_000_000)
    rng = random.Random(seed)
    c = ChaosCluster(tmp_path)
    tally = Tally("coordinator-kills")
    reconnects: list[float] = []
    done_at_kill: list[int] = []
    try:
        c.start_coordinator()
        for wid in WORKERS:
            c.add_worker(wid, slots=2)
        c.wait_registered(WORKERS)
        ids = c.api.submit([record_task(f"ckill-{i:03d}", c.exec_log, rng.uniform(0.05, 0.2), max_retries=0)
                            for i in range(300)])
        for threshold in KILL_AT:
            c.wait_terminal(ids[:threshold], timeout=120)  # FIFO: the first ones finish first
            c.check_alive()
            done_at_kill.append(finished(c, ids))
            killed_at = c.kill_coordinator()
            time.sleep(DOWN_S)
            c.start_coordinator()
            restarted_at = time.time()
            c.wait_registered(WORKERS)
            reconnects.append(time.time() - restarted_at)
            for wid in WORKERS:  # the workers' side: how long until each noticed the coordinator died
                lost = c.log_times(wid, "session with coordinator", killed_at)  # "... URL lost: why"
                tally.detections.append(lost[0] - killed_at if lost else float("inf"))
        first = c.wait_terminal(ids, timeout=150)
        quiesce(c, WORKERS)
        regs = c.registrations()
        tally.extra.update(seed=seed, coordinator_kills=len(KILL_AT), finished_at_kills=done_at_kill,
                           reconnect_after_restart_s=[round(r, 2) for r in reconnects],
                           unexpected_disconnects=sum(regs.values()) - len(WORKERS) * (1 + len(KILL_AT)))
        tally.check(c, ids, first).assert_clean()
        assert tally.max_detection is not None and tally.max_detection < 5, tally.summary()
    finally:
        c.close()
