"""Scenario c: a worker in its own network namespace (veth pair, its own address) loses its link
for longer than the TTL while it runs tasks, then gets it back. The coordinator marks it
disconnected (ping/pong) within the TTL; the results it finished while cut off arrive from its
outbox once it reconnects; no task gets a second outcome and none is lost. A worker in the root
namespace keeps working throughout and is never disconnected. The cut-off worker ends its session
within a TTL of the cut too, while its link is still down.

Needs ``ip netns`` (root or CAP_SYS_ADMIN); skipped with the reason otherwise."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from chaos_support import TTL_S, ChaosCluster, Tally, WorkerWatch, quiesce, record_task

from distributed_testing.testing.netns import NetNs

pytestmark = pytest.mark.timeout(240)

CUT_S = TTL_S + 2.0  # longer than the TTL


def test_network_cut_delivers_outbox_results_without_duplicates(tmp_path: Path, netns: NetNs) -> None:
    seed = random.randrange(1_000_000)
    rng = random.Random(seed)
    c = ChaosCluster(tmp_path, host=netns.host_addr)  # listens on the root-namespace end of the veth
    tally = Tally("network-cut")
    try:
        c.start_coordinator()
        c.add_worker("cutoff", slots=2, tags=["netns"], prefix=netns.prefix)
        c.add_worker("steady", slots=2)
        c.wait_registered(["cutoff", "steady"])
        docs = [record_task(f"cut-ns-{i:02d}", c.exec_log, rng.uniform(0.3, 0.8), max_retries=3, tags=["netns"])
                for i in range(40)]
        docs += [record_task(f"cut-any-{i:03d}", c.exec_log, rng.uniform(0.05, 0.2), max_retries=3)
                 for i in range(100)]
        with WorkerWatch(c) as watch:
            ids = c.api.submit(docs)
            c.wait_registered([])  # (checks both workers are alive)
            time.sleep(2.0)
            assert c.api.workers()["cutoff"]["running"], "the namespaced worker runs nothing to cut off"
            netns.down()
            cut_at = time.time()
            tally.detections.append(watch.wait_disconnected("cutoff", cut_at, timeout=TTL_S + 10))
            time.sleep(max(0.0, cut_at + CUT_S - time.time()))
            netns.up()
            up_at = time.time()
            c.wait_registered(["cutoff"])
            reconnect_s = time.time() - up_at
            first = c.wait_terminal(ids, timeout=150)
            quiesce(c, ["cutoff", "steady"])
        delivered = [r for r in c.api.results(worker_id="cutoff")
                     if cut_at <= r["finished_at"] <= up_at and r["received_at"] > up_at]
        regs = c.registrations()
        tally.extra.update(seed=seed, cut_s=round(up_at - cut_at, 2), reconnect_after_up_s=round(reconnect_s, 2),
                           outbox_results_after_cut=len(delivered),
                           outbox_results_that_became_the_outcome=sum(
                               1 for r in delivered if (first[r["task_id"]]["outcome"] or {}).get("attempt") == r["attempt"]),
                           steady_disconnects=watch.disconnects("steady") + regs["steady"] - 1)
        tally.check(c, ids, first).assert_clean()
        assert tally.max_detection is not None and tally.max_detection < TTL_S + 2, tally.summary()
        # the worker's side: it ended the session within a TTL, while the link was still down (its
        # heartbeats go unacknowledged), not only once a ping went unanswered
        lost = [t for t in c.log_times("cutoff", "session with coordinator", cut_at) if t <= up_at]
        assert lost and lost[0] - cut_at <= TTL_S + 1.5, (lost, cut_at, c.log_tail("cutoff"))
        assert delivered, f"no result finished during the cut arrived afterwards\n{tally.summary()}"
        assert tally.extra["steady_disconnects"] == 0, tally.summary()
    finally:
        c.close()
