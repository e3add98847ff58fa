"""Scenario a: three worker processes, 300 short tasks, ten random worker SIGKILLs mid-run, each
worker restarted with the same ``--worker-id`` and ``--db-path`` (so its outbox re-sends what the
coordinator had not acknowledged). Every task ends with exactly one outcome and none is lost; the
coordinator notices each kill (the TCP connection closes with the process) within the TTL."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from chaos_support import TTL_S, ChaosCluster, Tally, WorkerWatch, quiesce, record_task

from distributed_testing.testing import wait_until

pytestmark = pytest.mark.timeout(240)

WORKERS = ("ka", "kb", "kc")
WAVES, PER_WAVE, KILLS = 10, 30, 10


def test_random_worker_kills_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    seed = random.randrange(1_000_000)
    rng = random.Random(seed)
    c = ChaosCluster(tmp_path)
    tally = Tally("worker-kills")
    try:
        c.start_coordinator()
        for wid in WORKERS:
            c.add_worker(wid, slots=2)
        c.wait_registered(WORKERS)
        ids: list[str] = []
        with WorkerWatch(c) as watch:
            for wave in range(WAVES):
                docs = [record_task(f"kill-{wave}-{i:02d}", c.exec_log, rng.uniform(0.05, 0.2), max_retries=10)
                        for i in range(PER_WAVE)]
                ids += c.api.submit(docs)
                time.sleep(rng.uniform(0.3, 0.9))  # let the wave get going
                if wave >= KILLS:
                    continue
                c.check_alive()
                wait_until(lambda: any(watch.connected(w) for w in WORKERS), 90, "a worker to be connected")
                victim = rng.choice([w for w in WORKERS if watch.connected(w)])
                killed_at = c.kill_worker(victim)
                tally.detections.append(watch.wait_disconnected(victim, killed_at, timeout=TTL_S + 10))
                c.start_worker(victim)
            first = c.wait_terminal(ids, timeout=150)
            quiesce(c, WORKERS)
        regs = c.registrations()
        tally.extra.update(seed=seed, kills=KILLS, restarts=sum(w.starts - 1 for w in c.workers.values()),
                           unexpected_disconnects=sum(regs.values()) - sum(w.starts for w in c.workers.values()))
        tally.check(c, ids, first).assert_clean()
        assert tally.max_detection is not None and tally.max_detection < TTL_S + 2, tally.summary()
        assert tally.extra["unexpected_disconnects"] == 0, tally.summary()
    finally:
        c.close()
