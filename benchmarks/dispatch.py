"""Dispatch benchmark: coordinator + N worker processes on loopback, no-op custom tasks.

Signing is always on and results are persisted (by default the DuckDB store with its journal;
``--store`` picks another, or several to compare in one run). Two phases:

* throughput: submit ``--tasks`` no-op tasks in lists of ``--chunk`` from ``--clients`` concurrent
  submitters; tasks/s from the first submit to the last terminal state;
* latency: ``--latency-samples`` tasks one at a time, once the cluster is idle again (the
  throughput phase's checkpoints done); submit → result visible to the client, three
  ways: ``POST /api/v1/tasks?wait=`` (one request that answers with the outcome), the same
  through Python's synchronous ``http.client`` on a keep-alive connection (a CI script's client,
  which spends less CPU per request than aiohttp's), and a plain ``POST`` followed by the
  long-poll ``GET /api/v1/tasks/{id}?wait=``; p50/p90/p99 of each.

Run: ``python benchmarks/dispatch.py --workers 2 --tasks 20000``

``--store duckdb,postgresql`` compares stores the way ``vs_ray.py`` does, fairly on a machine
whose speed drifts (a shared CI box): one cluster per store, all up at once, and ``--rounds``
throughput rounds of ``--tasks / --rounds`` tasks, then as many blocks of serial ``POST ?wait``
tasks, alternating between the clusters; it reports for each store the tasks/s over all its
rounds, the median round, the submit->result p50 and p90, the coordinator's (and for
PostgreSQL the database backends') CPU per task, and the ratios to the first store. ``postgresql`` alone means a temporary database on the local server
(``distributed_testing.testing.PG_SERVER``), dropped afterwards; a full ``postgresql://`` URL is
used as it is (its tables are created if missing and left behind).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import psutil
from latency_stats import summary_ms

from distributed_testing.process import aio

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


def pg_backend_cpu(url: str, last: dict[int, float]) -> float:
    """CPU seconds used so far by the server processes serving ``url``'s database (its backends;
    not the server's shared WAL writer and checkpointer). ``last`` keeps each backend's latest
    reading, so one that ended in between still counts."""
    import asyncpg

    async def pids() -> list[int]:
        con = await asyncpg.connect(url)
        try:
            return [r[0] for r in await con.fetch(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")]
        finally:
            await con.close()

    for pid in set(asyncio.run(pids())) | set(last):
        try:
            t = psutil.Process(pid).cpu_times()
            last[pid] = t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return sum(last.values())


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
        """``db``: ``duckdb`` (a file in ``tmp``), ``memory`` or a ``postgresql://`` URL."""
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
        db_url = {"duckdb": str(tmp / "c.duckdb"), "memory": "memory://"}.get(db, db)
        c = subprocess.Popen([sys.executable, str(root / "run_coordinator.py"), "--port", "0", "--port-file", str(tmp / "port"),
                              "--db-path", db_url, "--admin-key-file", str(tmp / "admin.key"),
                              "--jwt-secret-file", str(tmp / "jwt.secret"), "--log-level", "WARNING"],
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


def run_one(args: argparse.Namespace, store: str) -> None:
    """The whole benchmark on one coordinator store; prints its report."""
    tmp = Path(tempfile.mkdtemp(prefix="dt-dispatch-"))
    cluster: Cluster | None = None
    try:
        cluster = Cluster(tmp, workers=args.workers, slots=args.slots, db=store, worker_outbox=args.worker_outbox)
        procs, base, admin = cluster.procs, cluster.base, cluster.admin
        pg = store if store.startswith(("postgresql://", "postgres://")) else None
        backends: dict[int, float] = {}
        aio.run(throughput(base, admin, 2000, args.chunk, args.clients))  # warm-up
        cpu0, me0 = cpu_seconds(procs), time.process_time()
        if pg:
            cpu0["database backends"] = pg_backend_cpu(pg, backends)
        tps = aio.run(throughput(base, admin, args.tasks, args.chunk, args.clients))
        cpu1, me1 = cpu_seconds(procs), time.process_time()
        if pg:
            cpu1["database backends"] = pg_backend_cpu(pg, backends)
        settled = settle(procs)
        lat = {mode: aio.run(latency(base, admin, args.latency_samples, mode == "POST ?wait"))
               for mode in ("POST ?wait", "POST + GET ?wait")}
        lat["POST ?wait, http.client"] = sync_latency(base, admin, args.latency_samples)
        name = store if "://" not in store else store.split("://", 1)[0]
        print(f"dispatch benchmark: {args.workers} worker processes x {args.slots} slots, store={name}, "
              f"worker outbox={args.worker_outbox}, signing on, event loop {aio.loop_choice()} (client too)")
        print(f"  throughput: {tps:,.0f} tasks/s over {args.tasks} no-op tasks (lists of {args.chunk}, {args.clients} clients)")
        per_task = {k: (cpu1[k] - cpu0[k]) / args.tasks * 1e6 for k in cpu0}
        per_task["benchmark client"] = (me1 - me0) / args.tasks * 1e6
        print("  CPU per task (us): " + ", ".join(f"{k} {v:.0f}" for k, v in per_task.items())
              + f"; total {sum(per_task.values()):.0f}")
        print(f"  cluster idle {settled:.1f} s after the throughput phase; latency measured after that")
        for mode, xs in lat.items():
            print(f"  latency submit->result, {mode} (n={len(xs)}): {summary_ms(xs)}")
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def store_url(store: str) -> Iterator[str]:
    """``store`` as ``Cluster`` takes it; ``postgresql`` becomes a temporary database, dropped after."""
    if store != "postgresql":
        yield store
        return
    from distributed_testing.testing import create_pg_database, drop_pg_database

    url = asyncio.run(create_pg_database(prefix="dt_bench"))
    try:
        yield url
    finally:
        asyncio.run(drop_pg_database(url))


def run_store(args: argparse.Namespace, store: str) -> None:
    with store_url(store) as url:
        run_one(args, url)


def compare(args: argparse.Namespace) -> None:
    """All stores up at once, rounds alternating between them (see the module doc)."""
    with contextlib.ExitStack() as stack:
        runs = []
        for store in args.stores:
            tmp = Path(tempfile.mkdtemp(prefix="dt-dispatch-"))
            stack.callback(shutil.rmtree, tmp, ignore_errors=True)
            url = stack.enter_context(store_url(store))
            cluster = Cluster(tmp, workers=args.workers, slots=args.slots, db=url, worker_outbox=args.worker_outbox)
            stack.callback(cluster.stop)
            runs.append({"store": store.split("://", 1)[0], "url": url, "cluster": cluster, "rounds": [],
                         "lat": [], "cpu": 0.0, "db_cpu": 0.0, "backends": {}})
        per_round = args.tasks // args.rounds
        for r in runs:
            aio.run(throughput(r["cluster"].base, r["cluster"].admin, 2000, args.chunk, args.clients))  # warm-up
        for _ in range(args.rounds):
            for r in runs:
                c = r["cluster"]
                pg = r["url"] if r["url"].startswith(("postgresql://", "postgres://")) else None
                cpu0 = cpu_seconds(c.procs)["coordinator"]
                db0 = pg_backend_cpu(pg, r["backends"]) if pg else 0.0
                r["rounds"].append(aio.run(throughput(c.base, c.admin, per_round, args.chunk, args.clients)))
                r["cpu"] += cpu_seconds(c.procs)["coordinator"] - cpu0
                r["db_cpu"] += (pg_backend_cpu(pg, r["backends"]) - db0) if pg else 0.0
        settle([p for r in runs for p in r["cluster"].procs])
        block = max(1, args.latency_samples // args.rounds)
        for _ in range(args.rounds):
            for r in runs:
                r["lat"] += aio.run(latency(r["cluster"].base, r["cluster"].admin, block, True))
        print(f"dispatch benchmark, stores compared: {args.workers} worker processes x {args.slots} slots each, "
              f"{args.rounds} alternating rounds of {per_round} no-op tasks (lists of {args.chunk}, {args.clients} "
              f"clients), then {args.rounds} blocks of {block} serial POST ?wait tasks; event loop {aio.loop_choice()}")
        first = None
        for r in runs:
            tps = per_round * len(r["rounds"]) / sum(per_round / x for x in r["rounds"])  # tasks over total time
            p50 = statistics.median(r["lat"]) * 1e3
            first = first or (tps, p50)
            n = per_round * args.rounds
            db = f", database backends {r['db_cpu'] / n * 1e6:.0f}" if r["db_cpu"] else ""
            print(f"  {r['store']:>10}: {tps:,.0f} tasks/s ({tps / first[0]:.0%}; rounds "
                  f"{', '.join(f'{x:,.0f}' for x in r['rounds'])}), submit->result {summary_ms(r['lat'])} "
                  f"(p50 {p50 / first[1]:.2f}x); CPU per task (us): coordinator {r['cpu'] / n * 1e6:.0f}{db}")


def parse_stores(text: str) -> list[str]:
    stores = [s.strip() for s in text.split(",") if s.strip()]
    for s in stores:
        if s not in ("duckdb", "memory", "postgresql") and not s.startswith(("postgresql://", "postgres://")):
            raise argparse.ArgumentTypeError(f"unknown store {s!r}: use duckdb, memory, postgresql or a postgresql:// URL")
    if not stores:
        raise argparse.ArgumentTypeError("no store given")
    return stores


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--slots", type=int, default=64, help="--max-concurrent-tasks per worker")
    ap.add_argument("--tasks", type=int, default=20000)
    ap.add_argument("--chunk", type=int, default=500)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--latency-samples", type=int, default=500)
    ap.add_argument("--store", "--db", dest="stores", type=parse_stores, default=["duckdb"],
                    help="coordinator store(s), comma-separated: duckdb (default), memory, postgresql (a temporary "
                         "database on the local server) or a postgresql:// URL; several are compared (see above)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds when comparing stores (default 5)")
    ap.add_argument("--worker-outbox", choices=["duckdb", "memory"], default="duckdb", help="worker --db-path or none")
    args = ap.parse_args()
    if args.rounds < 1 or args.tasks // args.rounds < args.chunk:
        ap.error("--rounds must be at least 1, and --tasks / --rounds at least --chunk")
    if len(args.stores) > 1:
        compare(args)
    else:
        run_store(args, args.stores[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
