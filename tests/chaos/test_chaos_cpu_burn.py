"""Scenario d: tasks burning 100 % CPU for 30 s on a worker under the default 3 s TTL are no reason
to declare it dead: heartbeats come from the agent's event loop, tasks run in child processes.
Two burning tasks (one per core of the 2-core CI machine) run next to a stream of short tasks on
the same worker; it stays connected throughout and each burning task runs exactly once.

In parallel (the burn takes 30 s anyway), scenario e: another worker is frozen with SIGSTOP for
longer than the TTL. The coordinator notices the silence (ping/pong) within the TTL; after
SIGCONT the worker finds its connection gone, reconnects within the grace period, re-announces
what it runs and reports what finished meanwhile, so nothing runs twice or is lost."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest
from chaos_support import TTL_S, ChaosCluster, Tally, WorkerWatch, quiesce, record_task

pytestmark = [pytest.mark.timeout(240), pytest.mark.serial]  # it burns the CPUs: alone, after the parallel phase

BURN_S = 30.0
FREEZE_S = TTL_S + 1.5


def test_cpu_burn_is_no_false_death_and_a_frozen_worker_is_detected(tmp_path: Path) -> None:
    seed = random.randrange(1_000_000)
    rng = random.Random(seed)
    c = ChaosCluster(tmp_path)
    burn, frozen = Tally("cpu-burn"), Tally("sigstop")
    try:
        c.start_coordinator()
        c.add_worker("burner", slots=3, tags=["burn"])
        c.add_worker("frozen", slots=2, tags=["freeze"])
        c.wait_registered(["burner", "frozen"])
        burn_docs = [record_task(f"burn-{i}", c.exec_log, BURN_S, max_retries=0, tags=["burn"], burn=True)
                     for i in range(2)]
        burn_docs += [record_task(f"burn-side-{i:02d}", c.exec_log, rng.uniform(0.05, 0.2), max_retries=0,
                                  tags=["burn"]) for i in range(150)]
        freeze_docs = [record_task(f"freeze-{i:02d}", c.exec_log, rng.uniform(0.2, 0.6), max_retries=0,
                                   tags=["freeze"]) for i in range(50)]
        with WorkerWatch(c) as watch:
            burn_ids = c.api.submit(burn_docs)
            freeze_ids = c.api.submit(freeze_docs)
            started = time.time()
            time.sleep(2.0)
            frozen_proc = c.workers["frozen"].proc
            assert frozen_proc is not None and c.api.workers()["frozen"]["running"], "nothing runs on the frozen worker"
            frozen_proc.send_signal(signal.SIGSTOP)
            stopped_at = time.time()
            try:
                frozen.detections.append(watch.wait_disconnected("frozen", stopped_at, timeout=TTL_S + 10))
                time.sleep(max(0.0, stopped_at + FREEZE_S - time.time()))
            finally:
                frozen_proc.send_signal(signal.SIGCONT)
            resumed_at = time.time()
            c.wait_registered(["frozen"])
            frozen.extra["reconnect_after_sigcont_s"] = round(time.time() - resumed_at, 2)
            first_freeze = c.wait_terminal(freeze_ids, timeout=120)
            first_burn = c.wait_terminal(burn_ids, timeout=BURN_S + 120)
            burn_wall = time.time() - started
            quiesce(c, ["burner", "frozen"])
            burner_disconnects = watch.disconnects("burner")
        regs = c.registrations()
        runs = [r for r in c.api.results(worker_id="burner") if r["task_id"] in ("burn-0", "burn-1")]
        burn.extra.update(seed=seed, burn_tasks=2, burn_s=BURN_S, scenario_wall_s=round(burn_wall, 1),
                          burn_cpu_s=[r["output"].get("cpu_s") for r in runs],
                          burner_disconnects=burner_disconnects + regs["burner"] - 1,
                          burn_dispatches=[sum(1 for h in c.api.ok("GET", f"/api/v1/tasks/{t}")["history"]
                                               if h["to"] == "assigned") for t in ("burn-0", "burn-1")])
        frozen.extra.update(frozen_s=FREEZE_S, sessions=regs["frozen"])
        burn.check(c, burn_ids, first_burn)
        frozen.check(c, freeze_ids, first_freeze)
        burn.assert_clean()
        frozen.assert_clean()
        assert burn.extra["burner_disconnects"] == 0, f"a worker busy with CPU-bound tasks was declared dead\n{burn.summary()}"
        assert burn.extra["burn_dispatches"] == [1, 1], burn.summary()
        # really burning: a share of the two cores the machine has, whatever else runs on it
        assert all(cpu is not None and cpu > 0.25 * BURN_S for cpu in burn.extra["burn_cpu_s"]), burn.summary()
        assert frozen.max_detection is not None and frozen.max_detection < TTL_S + 2, frozen.summary()
        log = (tmp_path / "coordinator.log").read_text()
        assert "worker frozen: closing its session: nothing heard for" in log and "unexpected ERROR frame" not in log, frozen.summary()
    finally:
        c.close()
