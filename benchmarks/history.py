"""History benchmark: the coordinator's memory and restart time as finished tasks pile up.

One coordinator process on a DuckDB file and two worker processes (``run_worker_example.py``,
DuckDB outboxes), on loopback. For each size in ``--tasks`` (cumulative: ``--tasks 20000 200000``
first brings the history to 20,000 tasks, measures, then to 200,000 and measures again), it
submits no-op custom tasks (the built-in ``noop`` handler) in lists of ``--chunk`` from
``--clients`` concurrent submitters, each list with ``?wait`` (answered once all of it finished),
so the active work stays at most ``chunk x clients`` tasks whatever the history, until the store
holds that many finished tasks, then reports:

* the coordinator's RSS (psutil) before the first submission, and once the tasks are done and the
  cluster is idle;
* the restart time with that history: the coordinator is stopped (SIGTERM: its final checkpoint)
  and started again on the same file and port, timed from the process start to ``GET /healthz``
  answering ``ok``; then its RSS once both workers are back and the cluster is idle;
* p50 of a few reads that must not grow with the history: ``GET /api/v1/tasks?limit=100``,
  ``GET /api/v1/tasks?state=succeeded&limit=100&offset=1000``, ``GET /api/v1/overview``, and
  ``GET /api/v1/tasks/{id}`` of the first task submitted (long gone from memory, read from the store).

``--root`` runs another checkout's launchers (e.g. a ``git worktree`` of the commit before, for a
before/after figure); its own package is imported (``PYTHONPATH`` is set to it).

Run: ``python benchmarks/history.py --tasks 20000 200000``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parent.parent
NOOP = {"type": "custom", "config": {"name": "noop"}}
DONE = ("succeeded", "failed", "error", "timed_out", "cancelled")


def _wait_file(path: Path, proc: subprocess.Popen[bytes], timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text().strip():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{proc.args} did not come up (exit {proc.poll()})")
        time.sleep(0.005)
    return path.read_text().strip()


class Cluster:
    def __init__(self, tmp: Path, root: Path, slots: int) -> None:
        self.tmp, self.root, self.slots = tmp, root, slots
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(root)}
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.port = 0
        self.base = ""
        self.admin = ""

    def start_coordinator(self) -> float:
        """Start the coordinator (on the port it had, after the first start); seconds from the
        process start to ``GET /healthz`` answering ok."""
        port_file = self.tmp / "port"
        port_file.unlink(missing_ok=True)
        t0 = time.perf_counter()
        self.coordinator = subprocess.Popen(
            [sys.executable, str(self.root / "run_coordinator.py"), "--port", str(self.port), "--port-file",
             str(port_file), "--db-path", str(self.tmp / "c.duckdb"), "--admin-key-file", str(self.tmp / "admin.key"),
             "--log-level", "INFO"],
            env=self.env, stdout=open(self.tmp / "coordinator.log", "ab"), stderr=subprocess.STDOUT, cwd=self.root)
        self.port = int(_wait_file(port_file, self.coordinator))
        self.base = f"http://127.0.0.1:{self.port}"
        asyncio.run(self._healthy())
        took = time.perf_counter() - t0
        self.admin = _wait_file(self.tmp / "admin.key", self.coordinator)
        return took

    async def _healthy(self) -> None:
        async with aiohttp.ClientSession() as http:
            while True:
                try:
                    async with http.get(f"{self.base}/healthz") as r:
                        if r.status == 200 and (await r.json())["status"] == "ok":
                            return
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.005)

    def stop_coordinator(self) -> None:
        assert self.coordinator is not None
        self.coordinator.terminate()
        self.coordinator.wait(120)

    def start_workers(self, n: int) -> None:
        keys = asyncio.run(self._make_keys(n))
        for i, key in enumerate(keys):
            self.workers.append(subprocess.Popen(
                [sys.executable, str(self.root / "run_worker_example.py"), "--coordinator", self.base,
                 "--api-key", key, "--worker-id", f"hist-{i}", "--max-concurrent-tasks", str(self.slots),
                 "--log-level", "WARNING", "--db-path", str(self.tmp / f"w{i}.duckdb")],
                env=self.env, stdout=open(self.tmp / f"w{i}.log", "wb"), stderr=subprocess.STDOUT, cwd=self.root))

    async def _make_keys(self, n: int) -> list[str]:
        async with aiohttp.ClientSession() as http:
            keys = []
            for _ in range(n):
                async with http.post(f"{self.base}/api/v1/keys", json={"role": "worker"}, headers=self.h) as r:
                    keys.append((await r.json())["key"])
            return keys

    @property
    def h(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin}"}

    async def ready(self, n: int) -> None:
        async with aiohttp.ClientSession() as http:
            while True:
                async with http.get(f"{self.base}/api/v1/workers", headers=self.h) as r:
                    if sum(w["state"] == "ready" for w in (await r.json())["workers"]) >= n:
                        return
                await asyncio.sleep(0.1)

    def rss_mb(self) -> float:
        assert self.coordinator is not None
        return float(psutil.Process(self.coordinator.pid).memory_info().rss) / 2**20

    def idle(self, quiet_s: float = 1.0, timeout: float = 120) -> None:
        """Until every process of the cluster used under 5 % of a CPU for ``quiet_s`` (the
        coordinator's checkpoints and the workers' outbox checkpoints done)."""
        procs = [psutil.Process(p.pid) for p in [self.coordinator, *self.workers] if p is not None]

        def cpu() -> float:
            return sum(sum(p.cpu_times()[:2]) for p in procs)

        t0, last, quiet_since = time.monotonic(), cpu(), None
        while time.monotonic() - t0 < timeout:
            time.sleep(0.25)
            now = cpu()
            if (now - last) / 0.25 < 0.05:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since >= quiet_s:
                    return
            else:
                quiet_since = None
            last = now

    def stop(self) -> None:
        for p in [*self.workers, self.coordinator]:
            if p is not None and p.poll() is None:
                p.terminate()
        for p in [*self.workers, self.coordinator]:
            if p is not None:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()


async def done_count(http: aiohttp.ClientSession, base: str) -> int:
    async with http.get(f"{base}/healthz") as r:
        counts = (await r.json())["tasks_by_state"]
    return sum(counts.get(s, 0) for s in DONE)


async def fill(c: Cluster, target: int, chunk: int, clients: int) -> tuple[float, str | None]:
    """Submit no-op tasks until ``target`` are finished; (tasks/s, the first task id submitted)."""
    async with aiohttp.ClientSession() as http:
        n = target - await done_count(http, c.base)
        lists = [min(chunk, n - i) for i in range(0, n, chunk)]
        first: list[str] = []

        async def submitter() -> None:
            while lists:
                size = lists.pop()
                async with http.post(f"{c.base}/api/v1/tasks?wait=300", json=[NOOP] * size, headers=c.h) as r:
                    body = await r.json()
                    assert r.status == 201, body
                    assert all(t["state"] == "succeeded" for t in body["tasks"]), body
                    if not first:
                        first.append(body["tasks"][0]["task_id"])

        t0 = time.perf_counter()
        await asyncio.gather(*(submitter() for _ in range(clients)))
        while await done_count(http, c.base) < target:
            await asyncio.sleep(0.1)
        return n / (time.perf_counter() - t0), (first[0] if first else None)


async def reads(c: Cluster, old_task: str, samples: int) -> dict[str, float]:
    """p50 in ms of each read (after one warm-up request)."""
    paths = {"tasks page": "/api/v1/tasks?limit=100",
             "succeeded page at offset 1000": "/api/v1/tasks?state=succeeded&limit=100&offset=1000",
             "overview": "/api/v1/overview", "an old task by id": f"/api/v1/tasks/{old_task}"}
    out = {}
    async with aiohttp.ClientSession() as http:
        for name, path in paths.items():
            times = []
            for i in range(samples + 1):
                t0 = time.perf_counter()
                async with http.get(c.base + path, headers=c.h) as r:
                    assert r.status == 200, await r.text()
                    await r.read()
                if i:
                    times.append(time.perf_counter() - t0)
            out[name] = statistics.median(times) * 1000
    return out


def run(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    c = Cluster(tmp, args.root, args.slots)
    rows: list[dict[str, Any]] = []
    try:
        c.start_coordinator()
        c.start_workers(2)
        asyncio.run(c.ready(2))
        c.idle()
        before = c.rss_mb()
        first: str | None = None
        for target in args.tasks:
            rate, first_now = asyncio.run(fill(c, target, args.chunk, args.clients))
            first = first or first_now
            c.idle()
            after = c.rss_mb()
            assert first is not None
            read_ms = asyncio.run(reads(c, first, args.read_samples))
            c.stop_coordinator()
            restart = c.start_coordinator()
            asyncio.run(c.ready(2))
            c.idle()
            rows.append({"tasks": target, "rss_before": before, "rss_after": after, "tasks_per_s": rate,
                         "restart_s": restart, "rss_restarted": c.rss_mb(), "reads": read_ms})
            r = rows[-1]
            print(f"  {target:>8,} tasks: RSS {before:.0f} -> {after:.0f} MiB ({rate:,.0f} tasks/s); restart "
                  f"{restart:.2f} s, RSS after it {r['rss_restarted']:.0f} MiB; reads p50 "
                  + ", ".join(f"{k} {v:.1f} ms" for k, v in read_ms.items()), flush=True)
    finally:
        c.stop()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, nargs="+", default=[20_000, 200_000],
                    help="history sizes to measure at, ascending (cumulative)")
    ap.add_argument("--chunk", type=int, default=500, help="tasks per POST")
    ap.add_argument("--clients", type=int, default=2, help="concurrent submitters")
    ap.add_argument("--slots", type=int, default=64, help="--max-concurrent-tasks per worker")
    ap.add_argument("--read-samples", type=int, default=20)
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose launchers and package run")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, databases)")
    args = ap.parse_args()
    if args.tasks != sorted(args.tasks) or args.tasks[0] < 1:
        ap.error("--tasks: positive sizes in ascending order")
    args.root = args.root.resolve()
    tmp = Path(tempfile.mkdtemp(prefix="dt-history-"))
    print(f"history benchmark: coordinator on DuckDB + 2 workers x {args.slots} slots, root {args.root}, tmp {tmp}")
    try:
        run(args, tmp)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
