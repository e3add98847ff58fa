"""Dispatch benchmark: coordinator + N worker processes on loopback, no-op custom tasks.

Signing is always on and results are persisted (DuckDB store with its journal). Two phases:

* throughput: submit ``--tasks`` no-op tasks in lists of ``--chunk`` from ``--clients`` concurrent
  submitters; tasks/s from the first submit to the last terminal state;
* latency: ``--latency-samples`` tasks one at a time, once the cluster is idle again (the
  throughput phase's checkpoints done); submit → result visible to the client, three
  ways: ``POST /api/v1/tasks?wait=`` (one request that answers with the outcome), the same
  through Python's synchronous ``http.client`` on a keep-alive connection (a CI script's client,
  which spends less CPU per request than aiohttp's), and a plain ``POST`` followed by the
  long-poll ``GET /api/v1/tasks/{id}?wait=``; p50/p90/p99 of each.

Run: ``python benchmarks/dispatch.py --workers 2 --tasks 20000``
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import psutil
from latency_stats import summary_ms

from distributed_testing import aio

ROOT = Path(__file__).resolve().parent.parent


def _wait_file(path: Path, proc: subprocess.Popen[bytes], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{proc.args} did not come up (exit {proc.poll()})")
        time.sleep(0.02)
    return path.read_text().strip()


async def _count_done(http: aiohttp.ClientSession, base: str, h: dict[str, str]) -> int:
    async with http.get(f"{base}/healthz") as r:
        counts = (await r.json())["tasks_by_state"]
    return sum(counts.get(s, 0) for s in ("succeeded", "failed", "error", "timed_out", "cancelled"))


async def throughput(base: str, key: str, n: int, chunk: int, clients: int) -> float:
    h = {"Authorization": f"Bearer {key}"}
    docs = [[{"type": "custom", "config": {"name": "noop"}} for _ in range(chunk)] for _ in range(n // chunk)]
    async with aiohttp.ClientSession() as http:
        before = await _count_done(http, base, h)
        queue: asyncio.Queue[list[dict[str, object]]] = asyncio.Queue()
        for d in docs:
            queue.put_nowait(d)

        async def submitter() -> None:
            while not queue.empty():
                doc = queue.get_nowait()
                async with http.post(f"{base}/api/v1/tasks", json=doc, headers=h) as r:
                    assert r.status == 201, await r.text()

        t0 = time.perf_counter()
        await asyncio.gather(*(submitter() for _ in range(clients)))
        target = before + len(docs) * chunk
        while await _count_done(http, base, h) < target:
            await asyncio.sleep(0.02)
        return (len(docs) * chunk) / (time.perf_counter() - t0)


NOOP = {"type": "custom", "config": {"name": "noop"}}


async def submit_waiting(http: aiohttp.ClientSession, base: str, key: str) -> dict[str, Any]:
    """One no-op task through ``POST /api/v1/tasks?wait=``: its state and outcome."""
    async with http.post(f"{base}/api/v1/tasks?wait=10", json=NOOP, headers={"Authorization": f"Bearer {key}"}) as r:
        task: dict[str, Any] = (await r.json())["tasks"][0]
    return task


class SyncClient:
    """``POST /api/v1/tasks?wait=`` over one keep-alive ``http.client`` connection."""

    def __init__(self, base: str, key: str) -> None:
        u = urlsplit(base)
        self.conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port)
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        self.body = json.dumps(NOOP).encode()

    def submit_waiting(self) -> dict[str, Any]:
        self.conn.request("POST", "/api/v1/tasks?wait=10", body=self.body, headers=self.headers)
        task: dict[str, Any] = json.loads(self.conn.getresponse().read())["tasks"][0]
        return task


def sync_latency(base: str, key: str, samples: int) -> list[float]:
    client = SyncClient(base, key)
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        body = client.submit_waiting()
        out.append(time.perf_counter() - t0)
        assert body["state"] == "succeeded", body
    client.conn.close()
    return out


async def latency(base: str, key: str, samples: int, one_request: bool) -> list[float]:
    h = {"Authorization": f"Bearer {key}"}
    out: list[float] = []
    async with aiohttp.ClientSession() as http:
        for _ in range(samples):
            t0 = time.perf_counter()
            if one_request:
                body = await submit_waiting(http, base, key)
            else:
                async with http.post(f"{base}/api/v1/tasks", json=NOOP, headers=h) as r:
                    task_id = (await r.json())["tasks"][0]["task_id"]
                async with http.get(f"{base}/api/v1/tasks/{task_id}?wait=10&result=0", headers=h) as r:
                    body = await r.json()
            out.append(time.perf_counter() - t0)
            assert body["state"] == "succeeded", body
    return out


def cpu_seconds(procs: list[subprocess.Popen[bytes]]) -> dict[str, float]:
    """CPU seconds used so far by the coordinator, the workers and the workers' children."""
    out = {"coordinator": 0.0, "workers": 0.0, "worker children": 0.0}
    for i, p in enumerate(procs):
        try:
            proc = psutil.Process(p.pid)
            t = proc.cpu_times()
            out["coordinator" if i == 0 else "workers"] += t.user + t.system
            for child in proc.children(recursive=True):
                ct = child.cpu_times()
                out["worker children"] += ct.user + ct.system
        except psutil.NoSuchProcess:
            continue
    return out


def settle(procs: list[subprocess.Popen[bytes]], quiet_s: float = 1.0, timeout: float = 60) -> float:
    """Wait until the cluster is idle (background checkpoints of the throughput phase done).

    Returns the seconds waited. The latency phase measures one task at a time on an otherwise
    idle cluster; starting it while the coordinator still writes the throughput phase's 20,000
    results to DuckDB would measure that contention instead.
    """
    t0 = time.monotonic()
    quiet_since = None
    last = sum(cpu_seconds(procs).values())
    while time.monotonic() - t0 < timeout:
        time.sleep(0.25)
        now = sum(cpu_seconds(procs).values())
        busy = (now - last) / 0.25
        last = now
        if busy < 0.05:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= quiet_s:
                break
        else:
            quiet_since = None
    return time.monotonic() - t0


class Cluster:
    """A coordinator and ``workers`` worker processes started from the launchers in ``root``
    (this checkout by default), on loopback, with DuckDB stores in ``tmp``. ``worker_args``, when
    given, replaces the workers' ``--max-concurrent-tasks SLOTS --log-level WARNING`` (``[]``:
    the workers' defaults, as a new user starts them)."""

    def __init__(self, tmp: Path, *, workers: int, slots: int, db: str = "duckdb", worker_outbox: str = "duckdb",
                 root: Path = ROOT, worker_args: list[str] | None = None) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.worker_args = ["--max-concurrent-tasks", str(slots), "--log-level", "WARNING"] if worker_args is None \
            else worker_args
        try:
            self._start(tmp, workers, db, worker_outbox, root)
        except BaseException:
            self.stop()
            raise

    def _start(self, tmp: Path, workers: int, db: str, worker_outbox: str, root: Path) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        db_url = str(tmp / "c.duckdb") if db == "duckdb" else "memory://"
        c = subprocess.Popen([sys.executable, str(root / "run_coordinator.py"), "--port", "0", "--port-file", str(tmp / "port"),
                              "--db-path", db_url, "--admin-key-file", str(tmp / "admin.key"), "--log-level", "WARNING"],
                             env=env, stdout=open(tmp / "coordinator.log", "wb"), stderr=subprocess.STDOUT, cwd=root)
        self.procs.append(c)
        self.base = f"http://127.0.0.1:{_wait_file(tmp / 'port', c)}"
        self.admin = _wait_file(tmp / "admin.key", c)
        for i, key in enumerate(asyncio.run(self._make_keys(workers))):
            self.procs.append(subprocess.Popen(
                [sys.executable, str(root / "run_worker_example.py"), "--coordinator", self.base, "--api-key", key,
                 "--worker-id", f"bench-{i}", *self.worker_args,
                 *(["--db-path", str(tmp / f"w{i}.duckdb")] if worker_outbox == "duckdb" else [])],
                env=env, stdout=open(tmp / f"w{i}.log", "wb"), stderr=subprocess.STDOUT, cwd=root))
        asyncio.run(asyncio.wait_for(self._ready(workers), 120))

    async def _make_keys(self, n: int) -> list[str]:
        async with aiohttp.ClientSession() as http:
            keys = []
            for _ in range(n):
                async with http.post(f"{self.base}/api/v1/keys", json={"role": "worker"},
                                     headers={"Authorization": f"Bearer {self.admin}"}) as r:
                    keys.append((await r.json())["key"])
            return keys

    async def _ready(self, n: int) -> None:
        async with aiohttp.ClientSession() as http:
            while True:
                async with http.get(f"{self.base}/api/v1/workers", headers={"Authorization": f"Bearer {self.admin}"}) as r:
                    if sum(w["state"] == "ready" for w in (await r.json())["workers"]) >= n:
                        return
                await asyncio.sleep(0.1)

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--slots", type=int, default=64, help="--max-concurrent-tasks per worker")
    ap.add_argument("--tasks", type=int, default=20000)
    ap.add_argument("--chunk", type=int, default=500)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--latency-samples", type=int, default=500)
    ap.add_argument("--db", choices=["duckdb", "memory"], default="duckdb", help="coordinator store")
    ap.add_argument("--worker-outbox", choices=["duckdb", "memory"], default="duckdb", help="worker --db-path or none")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dt-dispatch-"))
    cluster: Cluster | None = None
    try:
        cluster = Cluster(tmp, workers=args.workers, slots=args.slots, db=args.db, worker_outbox=args.worker_outbox)
        procs, base, admin = cluster.procs, cluster.base, cluster.admin
        aio.run(throughput(base, admin, 2000, args.chunk, args.clients))  # warm-up
        cpu0, me0 = cpu_seconds(procs), time.process_time()
        tps = aio.run(throughput(base, admin, args.tasks, args.chunk, args.clients))
        cpu1, me1 = cpu_seconds(procs), time.process_time()
        settled = settle(procs)
        lat = {mode: aio.run(latency(base, admin, args.latency_samples, mode == "POST ?wait"))
               for mode in ("POST ?wait", "POST + GET ?wait")}
        lat["POST ?wait, http.client"] = sync_latency(base, admin, args.latency_samples)
        print(f"dispatch benchmark: {args.workers} worker processes x {args.slots} slots, store={args.db}, "
              f"worker outbox={args.worker_outbox}, signing on, event loop {aio.loop_choice()} (client too)")
        print(f"  throughput: {tps:,.0f} tasks/s over {args.tasks} no-op tasks (lists of {args.chunk}, {args.clients} clients)")
        per_task = {k: (cpu1[k] - cpu0[k]) / args.tasks * 1e6 for k in cpu0}
        per_task["benchmark client"] = (me1 - me0) / args.tasks * 1e6
        print("  CPU per task (us): " + ", ".join(f"{k} {v:.0f}" for k, v in per_task.items())
              + f"; total {sum(per_task.values()):.0f}")
        print(f"  cluster idle {settled:.1f} s after the throughput phase; latency measured after that")
        for mode, xs in lat.items():
            print(f"  latency submit->result, {mode} (n={len(xs)}): {summary_ms(xs)}")
        return 0
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
