"""CPU the coordinator's own code spends per task, without sockets or other processes (issue 30 §5).

A real ``Runtime`` on a real ``DuckDBStore`` (journal with fsync, checkpoints on their own
thread), two registered workers with default flags (one slot each, pipelining on) whose sessions
are driven in this process: ``--tasks`` no-op tasks go through ``api.submit`` in JSON lists of
500 from 4 concurrent clients, and every assignment frame a session's writer would sign is sealed and opened with the
session's channel, answered with a results frame of the tasks it assigned (at most
``--per-frame``, as a busy worker batches them), which goes through ``ws._handle_frame`` like a
received one. What is left out: HTTP parsing, the WebSocket framing and the system calls that
move the bytes, and everything the workers do. Each round times ``time.process_time`` (every
thread of the process: the checkpoints included) from the first submission until every task's
records are in DuckDB, per task; the figure printed is the median of ``--rounds`` rounds after a
warm-up. Unlike the cluster benchmarks it does not depend on how the machine schedules five
processes on two cores, so two checkouts compare on a busy machine too.

Run: ``PYTHONPATH=. python benchmarks/coordinator_cpu.py`` from a checkout (``--root DIR`` runs it
from another checkout in a subprocess, alternating with this one, and prints both).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


async def one_round(tmp: Path, n: int, per_frame: int, warm: int) -> float:
    """Process CPU µs per task over ``n`` tasks, after ``warm`` tasks of warm-up."""
    from distributed_testing.config import CoordinatorConfig
    from distributed_testing.coordinator import api, ws
    from distributed_testing.coordinator.runtime import Runtime, Session
    from distributed_testing.coordinator.store.duckdb import DuckDBStore
    from distributed_testing.protocol import messages as m
    from distributed_testing.protocol.signing import Channel
    from distributed_testing.security.auth import Principal
    from distributed_testing.security.roles import Role

    store = DuckDBStore(tmp / "c.duckdb")
    snap = await store.open()
    rt = Runtime(CoordinatorConfig(db_path=str(tmp / "c.duckdb")), store)
    rt.state.restore(snap, time.time())
    principal = Principal(key_id="k", role=Role.ADMIN, name="bench", via="api_key")
    sessions: list[tuple[Session, Channel]] = []  # (coordinator side, worker side)
    for i in range(2):
        key = bytes([i]) * 32
        s = Session(session_id=f"s{i}", worker_id=f"w{i}", key_id="k", channel=Channel(key))
        rt.sessions[s.worker_id] = s
        reg = m.Register(worker_id=s.worker_id, name=s.worker_id, protocol_version=m.PROTOCOL_VERSION,
                         hardware={}, capabilities=["cpu"], tags=[], max_concurrent=1, handlers=["noop"],
                         pipeline_depth=64)
        rt.execute(rt.state.register(reg, s.session_id, time.time(), key_id="k"))
        sessions.append((s, Channel(key)))
    body = json.dumps([{"type": "custom", "config": {"name": "noop"}} for _ in range(500)]).encode()

    async def worker(s: Session, channel: Channel, target: int, done: list[int], finished: asyncio.Event) -> None:
        """A session's writer and its worker in one: each frame the writer would send is sealed
        and opened. As a busy worker does, results wait while the last results frame is not yet
        acknowledged (its result hold) and then go out together, at most ``per_frame`` a frame."""
        held: list[m.TaskAssignment] = []
        unacked = False
        while done[0] < target:
            msg = await s.outbox.get()
            if msg is None:
                raise RuntimeError(f"session {s.worker_id} closed: {s.closing}")
            opened = channel.open(s.channel.seal(msg, time.time()), time.time())
            if isinstance(opened, m.AssignTasks):
                held += opened.tasks
            elif isinstance(opened, m.ResultAck):
                unacked = False
            if unacked or not held or not s.outbox.empty():
                continue
            now = time.time()
            answered, held = held[:per_frame], held[per_frame:]
            results = [m.TaskResult(a.task_id, a.attempt, "succeeded", now, now, {}, None, s.worker_id)
                       for a in answered]
            unacked = True
            await ws._handle_frame(rt, s, channel.seal(m.Results(results), now))
            done[0] += len(results)
        finished.set()

    async def drive(count: int) -> None:
        done, finished = [0], asyncio.Event()
        workers = [asyncio.ensure_future(worker(s, c, count, done, finished)) for s, c in sessions]
        lists = [body] * (count // 500)

        async def client() -> None:  # as the cluster benchmarks' clients: one list after another
            while lists:
                await api.submit(rt, principal, lists.pop(), 0.0)

        await asyncio.gather(*(client() for _ in range(4)))
        await finished.wait()
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        await store.journal.append([])  # everything durable
        await store.checkpoint()

    try:
        await drive(warm)
        start = time.process_time()
        await drive(n)
        return (time.process_time() - start) / n * 1e6
    finally:
        await store.close()


def run_here(args: argparse.Namespace) -> list[float]:
    from distributed_testing.cli.common import tune_gc
    from distributed_testing.process import aio

    tune_gc()  # as the coordinator's process does, and on its event loop (uvloop)
    out = []
    for _ in range(args.rounds):
        tmp = Path(tempfile.mkdtemp(prefix="dt-coordinator-cpu-"))
        try:
            out.append(aio.run(one_round(tmp, args.tasks, args.per_frame, 2000)))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--per-frame", type=int, default=6,
                    help="at most this many results a results frame (default 6: what a 10,000-task round gave)")
    ap.add_argument("--root", type=Path, help="another checkout to compare with, alternating")
    ap.add_argument("--json", action="store_true", help="print this checkout's rounds as JSON (for --root)")
    args = ap.parse_args()
    if args.json:
        print(json.dumps(run_here(args)))
        return 0
    roots = [ROOT] + ([args.root.resolve()] if args.root else [])
    figures: dict[Path, list[float]] = {r: [] for r in roots}
    for _ in range(args.rounds):
        for r in roots:
            cmd = [sys.executable, str(r / "benchmarks" / "coordinator_cpu.py"), "--json", "--rounds", "1",
                   "--tasks", str(args.tasks), "--per-frame", str(args.per_frame)]
            if not (r / "benchmarks" / "coordinator_cpu.py").exists():  # an older checkout: this script, its code
                cmd[1] = str(Path(__file__).resolve())
            env_path = str(r)
            got: Any = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=r,
                                                 env={**_env(), "PYTHONPATH": env_path}).stdout)
            figures[r] += got
    print(f"coordinator CPU per task (process time, no sockets; {args.tasks} tasks a round, "
          f"{args.per_frame} results a frame), {args.rounds} rounds alternating:")
    for r, xs in figures.items():
        print(f"  {r}: {' / '.join(f'{x:.1f}' for x in xs)} us (median {statistics.median(xs):.1f})")
    return 0


def _env() -> dict[str, str]:
    import os
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


if __name__ == "__main__":
    sys.exit(main())
