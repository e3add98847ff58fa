"""Dashboard render times at fleet size: 2,000 workers and 100,000 tasks in the store.

Fills a DuckDB store directly (tasks with histories and outcomes over the last hour, workers with
hardware), starts ``run_coordinator.py --dashboard`` on it, signs in, and times, server side
(the HTTP answer, as a client on the same host sees it), the Overview, the first page of Tasks
and the Workers page: each page's HTML and the data request its script makes. With Playwright
and /usr/bin/chromium it also times each page in the browser until its table is drawn.

    python benchmarks/dashboard.py [--tasks 100000] [--workers 2000] [--repeat 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from distributed_testing.coordinator.core.rows import TaskRow, WorkerRow  # noqa: E402
from distributed_testing.coordinator.store.duckdb import DuckDBStore  # noqa: E402
from distributed_testing.testing import Procs, start_coordinator_process  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STATES = ["succeeded"] * 8 + ["failed", "pending"]


def task(i: int, now: float, n: int) -> TaskRow:
    state = STATES[i % len(STATES)]
    sub = now - 3600 + 3600 * i / n
    hist = [{"at": sub, "from": None, "to": "pending", "cause": "submitted", "attempt": 0}]
    outcome = None
    if state != "pending":
        w = f"w{i % 2000:04d}"
        hist += [{"at": sub + 0.5, "from": "pending", "to": "assigned", "cause": f"dispatched to {w}", "attempt": 1,
                  "worker_id": w},
                 {"at": sub + 2, "from": "assigned", "to": state, "cause": f"result from {w}", "attempt": 1,
                  "worker_id": w}]
        outcome = {"status": state, "attempt": 1, "worker_id": w, "error": "boom" if state == "failed" else None,
                   "duration_s": 1.5}
    return TaskRow(task_id=f"t{i:06d}", type="custom", state=state, attempt=0 if state == "pending" else 1,
                   priority=0, submitted_at=sub, updated_at=hist[-1]["at"], digest=f"d{i}",
                   spec={"type": "custom", "config": {"name": "noop"}, "requirements": {"tags": ["nowhere"]}},
                   history=hist, outcome=outcome, seq=i, submitted_by="bench")


async def fill(db: Path, tasks: int, workers: int) -> None:
    store = DuckDBStore(db)
    await store.open()
    now = time.time()
    for lo in range(0, tasks, 5000):
        await store.append([task(i, now, tasks) for i in range(lo, min(tasks, lo + 5000))])
    await store.append([WorkerRow(worker_id=f"w{i:04d}", name=f"node-{i:04d}",
                                  hardware={"cpu_model": "EPYC", "cpu_count": 64, "memory_gb": 512.0,
                                            "accelerators": [{"name": "H100"}] * 8},
                                  capabilities=["cpu", "cuda"], tags=["rack-a"], first_seen=now, last_seen=now,
                                  state="ready") for i in range(workers)])
    await store.close()


async def time_get(http: aiohttp.ClientSession, url: str, repeat: int) -> tuple[float, float, int]:
    times, size = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        async with http.get(url) as r:
            body = await r.read()
            assert r.status == 200, (url, r.status, body[:200])
        times.append((time.perf_counter() - t0) * 1000)
        size = len(body)
    times.sort()
    return statistics.median(times), times[max(0, int(len(times) * 0.95) - 1)], size


async def browser_times(base: str, key: str) -> dict[str, float]:
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        return {}
    if not Path("/usr/bin/chromium").exists():
        return {}
    out: dict[str, float] = {}
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path="/usr/bin/chromium", args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        page = await (await b.new_context()).new_page()
        await page.goto(base + "login")
        await page.fill("input[name=key]", key)
        await page.click("button[type=submit]")
        await page.wait_for_selector("#failures")
        for name, path, sel in [("overview", "", "#failures tbody tr"), ("tasks", "tasks", "#tasks tbody tr"),
                                ("workers", "workers", "#workers tbody tr")]:
            t0 = time.perf_counter()
            await page.goto(base + path)
            await page.wait_for_selector(sel)
            out[name] = (time.perf_counter() - t0) * 1000
        await b.close()
    return out


async def measure(base: str, key: str, repeat: int) -> None:
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        async with http.post(base + "login", data={"key": key}) as r:
            assert r.status == 200, r.status
        print(f"{'request':<34}{'median ms':>10}{'p95 ms':>9}{'bytes':>10}")
        for label, path in [("Overview page", ""), ("  data/overview", "data/overview"),
                            ("Tasks page", "tasks"), ("  data/tasks (first 50)", "data/tasks?limit=50&offset=0"),
                            ("  data/tasks?state=failed", "data/tasks?limit=50&state=failed"),
                            ("Workers page", "workers"), ("  data/workers (all 2,000)", "data/workers")]:
            med, p95, size = await time_get(http, base + path, repeat)
            print(f"{label:<34}{med:>10.1f}{p95:>9.1f}{size:>10,}")
    for name, ms in (await browser_times(base, key)).items():
        print(f"browser: {name:<25} {ms:>8.0f} ms until the table is drawn")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=20)
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        db = tmp / "state" / "coordinator.duckdb"
        db.parent.mkdir()
        t0 = time.perf_counter()
        asyncio.run(fill(db, ns.tasks, ns.workers))
        print(f"filled {ns.tasks:,} tasks and {ns.workers:,} workers in {time.perf_counter() - t0:.1f} s")
        procs = Procs(tmp, cwd=REPO)
        try:
            t0 = time.perf_counter()
            _, port = start_coordinator_process(procs, db, args=["--dashboard", "--log-level", "WARNING"], timeout=300)
            print(f"coordinator up in {time.perf_counter() - t0:.1f} s")
            key = (db.parent / "admin.key").read_text().strip()
            asyncio.run(measure(f"http://127.0.0.1:{port}/dashboard/", key, ns.repeat))
        finally:
            procs.close()
            subprocess.run(["true"])


if __name__ == "__main__":
    main()
