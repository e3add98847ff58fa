"""The liveness matrix against a coordinator with default liveness flags: workers with
``--heartbeat-interval`` 0.5, 1 and 10 (the worker guide's example) suffer no false death, and a
real death is found within that worker's TTL.

Per interval, one worker is left alone (a real agent in this process: it must keep its first
session, never closed, never re-registered) and one, a real ``run_worker_example.py`` process, is
frozen with SIGSTOP (its TCP connection stays open, it sends nothing: only the TTL can find it);
one more worker process at 10 s is SIGKILLed (its connection closes with it: found at once, long
before its 30 s TTL). The three cases run at once, so the window is the longest TTL (30 s) plus start-up; the
60 s matrix of the issue is ``benchmarks/liveness.py``.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from distributed_testing.testing import Cluster, Procs, hidden_accelerators, run_cluster, wait_for

ROOT = Path(__file__).resolve().parents[3]
INTERVALS = (0.5, 1.0, 10.0)
TICK_SLACK_S = 1.0  # the coordinator's 0.25 s tick, plus this test's 50 ms polling, plus a loaded machine

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    ps = Procs(tmp_path, cwd=ROOT)
    try:
        yield ps
    finally:
        for p in ps.running:  # a stopped process would sit out SIGTERM's 20 s timeout
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        ps.close()


async def start_worker(c: Cluster, procs: Procs, worker_id: str, interval: float, env: dict[str, str]) -> None:
    key = await c.create_key("worker")
    procs.start(["run_worker_example.py", "--coordinator", c.base_url, "--worker-id", worker_id,
                 "--heartbeat-interval", f"{interval:g}", "--reconnect-interval", "0.2"],
                procs.tmp / f"{worker_id}.log", env={**env, "DT_API_KEY": key}, drop_env=["DT_DB_PATH"])


async def test_no_false_deaths_and_real_deaths_found_within_each_workers_ttl(tmp_path: Path, procs: Procs) -> None:
    env = hidden_accelerators(tmp_path)
    async with run_cluster(tmp_path, workers=0) as c:  # the coordinator's liveness flags at their defaults
        state = c.runtime.state
        victims = {f"frozen-{i:g}": i for i in INTERVALS} | {"killed-10": 10.0}
        steady = {f"steady-{i:g}": i for i in INTERVALS}
        names = victims | steady
        for wid, interval in victims.items():
            await start_worker(c, procs, wid, interval, env)
        for wid, interval in steady.items():
            await c.add_worker(worker_id=wid, heartbeat_interval_s=interval)
        await wait_for(lambda: all(w in c.runtime.sessions for w in names), timeout=60,
                       what="every worker to register")
        sessions = {w: c.runtime.sessions[w].session_id for w in names}
        ttl = {w: state.workers[w].liveness.ttl_s for w in names}
        assert ttl == {w: 30.0 if i == 10 else 3.0 for w, i in names.items()}, ttl
        assert {w: state.workers[w].liveness.interval_s for w in names} == names

        by_id = {wid: p for wid, p in zip(victims, procs.running, strict=True)}
        stopped_at = time.time()
        for wid, p in by_id.items():
            if wid.startswith("frozen"):
                p.send_signal(signal.SIGSTOP)
            elif wid == "killed-10":
                p.send_signal(signal.SIGKILL)
        found: dict[str, tuple[float, float]] = {}  # victim -> (when found dead, its last frame)

        def check() -> bool:  # polled every 10 ms for the whole window
            for w in steady:
                s = c.runtime.sessions.get(w)
                assert state.workers[w].connected and s is not None and s.session_id == sessions[w], (
                    f"false death: {w} lost its first session")
            for v in victims:
                if v not in found and not state.workers[v].connected:
                    found[v] = (time.time(), state.workers[v].last_seen)
            return len(found) == len(victims)

        await wait_for(check, timeout=max(ttl.values()) + 15, what="every victim to be declared dead")
        window = time.time() - stopped_at
        check()
        for v, (at, last_frame) in found.items():
            found_after = at - stopped_at
            if v == "killed-10":
                assert found_after < 3.0, f"{v}: a killed worker's closed connection took {found_after:.1f}s"
            else:  # silent since its last frame: declared dead once its own TTL has passed, not before
                silent = at - last_frame
                assert ttl[v] <= silent <= ttl[v] + TICK_SLACK_S, f"{v}: declared dead after {silent:.1f}s of silence"
                assert found_after <= ttl[v] + TICK_SLACK_S, f"{v}: found {found_after:.1f}s after it froze"
        assert window >= 3 * 10.0 - 10.0, f"observation window only {window:.1f}s"  # >= 2 intervals of steady-10
        for w in steady:  # still heard from recently, in its first session
            assert time.time() - state.workers[w].last_seen <= ttl[w]
