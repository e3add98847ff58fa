"""Fleet benchmark: thousands of real signed worker sessions against one coordinator process.

A coordinator (``run_coordinator.py``, DuckDB store, ``--log-level WARNING``) and ``--procs``
load-generator processes that together hold ``--workers`` WebSocket sessions. Each session speaks
the real protocol with the package's own code: the handshake, a ``Channel`` keyed from the
credential and the session id, a signed ``register``, then a signed ``heartbeat`` every interval
the coordinator gave it, a WebSocket ping every TTL (``ping_period``, as ``dt-worker`` does), and
a ``results`` frame answering every assignment at once (a no-op task). A session that ends
reconnects as ``dt-worker`` does: the first attempt after an established session waits a uniform
part of ``--reconnect-spread`` seconds (the worker's ``FIRST_RECONNECT_SPREAD_S``; 0: at once, as workers
did before it), failed attempts back off with the package's jittered ``Backoff`` from 1 s.
``--ping-period 1`` makes the sessions ping every heartbeat, as workers did before they pinged once
per TTL.

``--profile DIR`` records the coordinator with py-spy (raw collapsed stacks) while the fleet
registers, idles and runs the tasks; ``--native`` adds C frames (system calls, uvloop, OpenSSL).
``--root DIR`` starts the coordinator from another checkout (``run_coordinator.py`` and the
package of DIR), for before/after figures from one generator: e.g. a worktree of main.

Phases, each reported:

1. registration: time from the generators' start until every session is registered;
2. idle fleet (``--window`` s): the coordinator's CPU (psutil, % of one core) and RSS, and the
   heartbeat rate the generators actually achieved against the one asked for (a starved
   generator shows here: its figures are then not figures);
3. the API under that load: ``GET /api/v1/workers`` (a page of 100) and ``POST /api/v1/tasks``
   (one no-op task), ``--api-samples`` each, p50/p95 (one keep-alive connection);
4. dispatch: ``--tasks`` no-op tasks submitted in lists of 500, tasks/s until all are terminal,
   and the coordinator's CPU per task over that phase (its heartbeat load included);
5. restart: the coordinator is stopped (SIGTERM) and started again on the same database and port;
   time from the new process's start until every session is registered again.

Run: ``python benchmarks/fleet.py --workers 10000`` (``--procs 4`` by default).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import multiprocessing as mp
import os
import random
import resource
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from latency_stats import pct  # noqa: E402

from distributed_testing.coordinator.admission import connection_limits  # noqa: E402
from distributed_testing.protocol import messages as m  # noqa: E402
from distributed_testing.protocol.signing import SESSION_HEADER, Channel, derive_session_key  # noqa: E402
from distributed_testing.retry import Backoff  # noqa: E402
from distributed_testing.testing import Procs, Rest, start_coordinator_process, wait_until  # noqa: E402
from distributed_testing.worker.session import FIRST_RECONNECT_SPREAD_S, ping_period  # noqa: E402

WORKERS_PAGE = "/api/v1/workers?limit=100"


def raise_nofile() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit (each session is a descriptor on both sides)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# ------------------------------------------------------------------------------ one generator


class Counters:
    def __init__(self) -> None:
        self.registered = 0  # sessions registered now
        self.registrations = 0  # registrations ever
        self.heartbeats = 0
        self.results = 0
        self.failures = 0
        self.interval = 1.0  # the heartbeat interval the coordinator gave (the last registration's)


class Schedule(NamedTuple):
    """How the emulated workers behave: ``spread``, seconds their first reconnect after a lost
    session is spread over; ``ping_s``, seconds between pings (None: ``ping_period`` of the
    session's TTL, as dt-worker does)."""

    spread: float
    ping_s: float | None


async def _session(connector: aiohttp.TCPConnector, ws_url: str, key: str, wid: str, c: Counters,
                   stop: asyncio.Event, sched: Schedule) -> None:
    headers: dict[str, str] = {}

    async def on_end(_s: Any, _ctx: Any, params: aiohttp.TraceRequestEndParams) -> None:
        headers.update(params.response.headers)

    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(on_end)
    backoff = Backoff(base_s=1.0, factor=2.0, max_s=30.0)
    attempt = 0
    async with aiohttp.ClientSession(connector=connector, connector_owner=False, trace_configs=[trace]) as http:
        while not stop.is_set():
            registered = False
            try:
                headers.clear()
                async with http.ws_connect(ws_url, headers={"Authorization": f"Bearer {key}"}, autoping=True,
                                           timeout=aiohttp.ClientWSTimeout(ws_close=5)) as ws:
                    ch = Channel(derive_session_key(key, headers[SESSION_HEADER]))
                    reg = m.Register(worker_id=wid, name=wid, protocol_version=m.PROTOCOL_VERSION, hardware={},
                                     capabilities=["cpu"], tags=["fleet"], max_concurrent=1)
                    await ws.send_bytes(ch.seal(reg, time.time()))
                    first = await ws.receive(timeout=60)
                    if first.type != aiohttp.WSMsgType.BINARY:
                        raise ConnectionError(f"no registered answer: {first.type}")
                    reply = ch.open(first.data, time.time())
                    if not isinstance(reply, m.Registered):
                        raise ConnectionError(f"answer to register was {type(reply).__name__}")
                    registered = True
                    c.interval = reply.heartbeat_interval_s
                    attempt = 0
                    c.registered += 1
                    c.registrations += 1
                    ping_s = sched.ping_s or ping_period(reply.worker_ttl_s, False)
                    beat = asyncio.create_task(_heartbeats(ws, ch, reply.heartbeat_interval_s, ping_s, c))
                    try:
                        async for frame in ws:
                            if frame.type != aiohttp.WSMsgType.BINARY:
                                continue
                            msg = ch.open(frame.data, time.time())
                            if isinstance(msg, m.AssignTasks):
                                now = time.time()
                                res = [m.TaskResult(task_id=a.task_id, attempt=a.attempt, status="succeeded",
                                                    started_at=now, finished_at=now, worker_id=wid) for a in msg.tasks]
                                await ws.send_bytes(ch.seal(m.Results(res), now))
                                c.results += len(res)
                    finally:
                        beat.cancel()
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await beat
            except (aiohttp.ClientError, OSError, ConnectionError, TimeoutError, KeyError, ValueError):
                c.failures += 1
            finally:
                if registered:
                    c.registered -= 1
            if stop.is_set():
                return
            if registered:  # an established session ended: the worker's jittered first reconnect
                await asyncio.sleep(random.uniform(0.0, sched.spread))
                continue
            await asyncio.sleep(backoff.delay(attempt))
            attempt += 1


async def _heartbeats(ws: aiohttp.ClientWebSocketResponse, ch: Channel, interval: float, ping_s: float,
                      c: Counters) -> None:
    """A signed heartbeat every ``interval`` and a ping every ``ping_s`` (after a heartbeat)."""
    await asyncio.sleep(interval * (0.2 + 0.8 * (hash(id(ws)) % 1000) / 1000))  # spread the fleet's beats
    hb = m.Heartbeat(state="ready", running=[], cpu_percent=1.0, memory_percent=10.0, free_slots=1)
    next_ping = time.monotonic() + ping_s
    while not ws.closed:
        await ws.send_bytes(ch.seal(hb, time.time()))
        if time.monotonic() >= next_ping:
            await ws.ping()
            next_ping += ping_s
        c.heartbeats += 1
        await asyncio.sleep(interval)


async def _generator(index: int, ws_url: str, key: str, n: int, ramp_s: float, sched: Schedule, out: Any,
                     stop_evt: Any) -> None:
    c = Counters()
    stop = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(_session(connector, ws_url, key, f"fleet-{index}-{i}", c, stop, sched)))
        if ramp_s > 0 and i % 50 == 49:
            await asyncio.sleep(ramp_s * 50 / n)
    last_hb = 0
    while not stop_evt.is_set():
        await asyncio.sleep(0.5)
        out.put((index, time.time(), c.registered, c.registrations, c.heartbeats - last_hb, c.results, c.failures,
                 c.interval))
        last_hb = c.heartbeats
    stop.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await connector.close()


def generator_main(index: int, ws_url: str, key: str, n: int, ramp_s: float, sched: Schedule, out: Any,
                   stop_evt: Any) -> None:
    raise_nofile()
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    asyncio.run(_generator(index, ws_url, key, n, ramp_s, sched, out, stop_evt))


# ------------------------------------------------------------------------------ the run


class Fleet:
    """The generators' latest reports, folded."""

    def __init__(self, procs: int, out: Any) -> None:
        self.out = out
        self.latest: dict[int, tuple[Any, ...]] = {}
        self.hb_log: list[tuple[float, int]] = []  # (time, heartbeats in that report)

    def poll(self) -> None:
        while True:
            try:
                rep = self.out.get_nowait()
            except Exception:
                return
            self.latest[rep[0]] = rep
            self.hb_log.append((rep[1], rep[4]))

    def registered(self) -> int:
        self.poll()
        return sum(r[2] for r in self.latest.values())

    def registrations(self) -> int:
        self.poll()
        return sum(r[3] for r in self.latest.values())

    def heartbeats_between(self, t0: float, t1: float) -> int:
        self.poll()
        return sum(n for t, n in self.hb_log if t0 < t <= t1)


def api_latencies(base: str, key: str, samples: int) -> dict[str, str]:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    h = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    out: dict[str, list[float]] = {f"GET {WORKERS_PAGE}": [], "POST /api/v1/tasks": []}
    body = json.dumps({"type": "custom", "config": {"name": "noop"}, "requirements": {"tags": ["fleet"]}})
    for _ in range(samples):
        t = time.perf_counter()
        conn.request("GET", WORKERS_PAGE, headers=h)
        r = conn.getresponse()
        r.read()
        out[f"GET {WORKERS_PAGE}"].append(time.perf_counter() - t)
        assert r.status == 200, r.status
        t = time.perf_counter()
        conn.request("POST", "/api/v1/tasks", body=body, headers=h)
        r = conn.getresponse()
        r.read()
        out["POST /api/v1/tasks"].append(time.perf_counter() - t)
        assert r.status in (200, 201), r.status
    conn.close()
    return {k: f"p50 {pct(v, 50) * 1e3:.1f} ms  p95 {pct(v, 95) * 1e3:.1f} ms  p99 {pct(v, 99) * 1e3:.1f} ms"
            for k, v in out.items()}


def _profile(where: Path | None, phase: str, pid: int, seconds: float, native: bool) -> Any:
    """``py-spy record`` of the coordinator for ``seconds`` (0: until SIGINT), or None;
    ``native``: with C frames (system calls, uvloop, OpenSSL)."""
    if where is None:
        return None
    import subprocess

    where.mkdir(parents=True, exist_ok=True)
    cmd = ["py-spy", "record", "-f", "raw", "-o", str(where / f"{phase}.txt"), "--pid", str(pid), "-r", "200",
           *(["--native"] if native else [])]
    return subprocess.Popen(cmd + (["--duration", str(int(seconds))] if seconds else []),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def dispatch(rest: Rest, n: int) -> tuple[float, int]:
    doc = [{"type": "custom", "config": {"name": "noop"}, "requirements": {"tags": ["fleet"]}} for _ in range(500)]
    before = _terminal(rest)
    t0 = time.perf_counter()
    for _ in range(max(1, n // 500)):
        rest.ok("POST", "/api/v1/tasks", json=doc)
    target = before + max(1, n // 500) * 500
    wait_until(lambda: _terminal(rest) >= target, 600, "the dispatched tasks to finish", interval=0.2)
    return (target - before) / (time.perf_counter() - t0), target - before


def _terminal(rest: Rest) -> int:
    counts = rest.ok("GET", "/healthz")["tasks_by_state"]
    return sum(counts.get(s, 0) for s in ("succeeded", "failed", "error", "timed_out", "cancelled"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=10000)
    ap.add_argument("--procs", type=int, default=4, help="load-generator processes")
    ap.add_argument("--window", type=float, default=20.0, help="seconds of idle fleet to measure CPU over")
    ap.add_argument("--api-samples", type=int, default=200)
    ap.add_argument("--tasks", type=int, default=5000)
    ap.add_argument("--ramp", type=float, default=5.0, help="seconds over which each generator opens its sessions")
    ap.add_argument("--root", type=Path, default=ROOT,
                    help="checkout the coordinator runs from (its run_coordinator.py and package; default: this one)")
    ap.add_argument("--reconnect-spread", type=float, default=FIRST_RECONNECT_SPREAD_S,
                    help="seconds the first reconnect after a lost session is spread over (default: the worker's, "
                         f"{FIRST_RECONNECT_SPREAD_S:g}; 0: at once)")
    ap.add_argument("--ping-period", type=float,
                    help="seconds between each session's pings (default: the worker's, one TTL; 1: every heartbeat, "
                         "as workers pinged before)")
    ap.add_argument("--profile", type=Path, help="py-spy record the coordinator during the idle window and dispatch "
                                                  "into this directory (needs py-spy on PATH)")
    ap.add_argument("--native", action="store_true",
                    help="with --profile: record C frames too (py-spy --native), e.g. the pongs' write system calls")
    args = ap.parse_args()
    root = args.root.resolve()
    if not (root / "run_coordinator.py").is_file():
        raise SystemExit(f"--root {root}: no run_coordinator.py there")
    nofile = raise_nofile()
    if nofile < args.workers + 1000:
        raise SystemExit(f"RLIMIT_NOFILE is {nofile}: too low for {args.workers} sessions (raise the hard limit)")
    tmp = Path(tempfile.mkdtemp(prefix="dt-fleet-"))
    procs = Procs(tmp, cwd=root)
    db = tmp / "state" / "c.duckdb"
    coord_args = ["--log-level", "WARNING"]
    derived = connection_limits(0, 0, nofile).max_worker_sessions
    if derived < args.workers:  # the cap a default start derives from RLIMIT_NOFILE is below the fleet
        coord_args += ["--max-worker-sessions", str(args.workers + 100)]
        print(f"RLIMIT_NOFILE {nofile} derives a cap of {derived} worker sessions: coordinator started with "
              f"--max-worker-sessions {args.workers + 100}", flush=True)
    env = {"PYTHONPATH": str(root)}
    try:
        coord, port = start_coordinator_process(procs, db, args=coord_args, env=env)
        print(f"coordinator from {root} (pid {coord.pid})", flush=True)
        base = f"http://127.0.0.1:{port}"
        admin = (db.parent / "admin.key").read_text().strip()
        rest = Rest(base, admin)
        wkey = rest.create_key("worker", "fleet")
        ctx = mp.get_context("spawn")
        out, stop_evt = ctx.Queue(), ctx.Event()
        per = [args.workers // args.procs + (1 if i < args.workers % args.procs else 0) for i in range(args.procs)]
        gens = [ctx.Process(target=generator_main, args=(i, base.replace("http", "ws") + "/ws/worker", wkey, n,
                                                         args.ramp, Schedule(args.reconnect_spread, args.ping_period), out, stop_evt), daemon=True)
                for i, n in enumerate(per)]
        fleet = Fleet(args.procs, out)
        spy = _profile(args.profile, "register", coord.pid, 0, args.native)
        t0 = time.perf_counter()
        for g in gens:
            g.start()
        wait_until(lambda: fleet.registered() >= args.workers, 600, "every session to register", interval=0.2)
        reg_s = time.perf_counter() - t0
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait()
        print(f"{args.workers} sessions from {args.procs} generator processes registered in {reg_s:.1f} s", flush=True)
        time.sleep(3.0)  # let the first heartbeats settle

        cp = psutil.Process(coord.pid)
        c0, w0 = cp.cpu_times(), time.time()
        spy = _profile(args.profile, "idle", coord.pid, args.window, args.native)
        time.sleep(args.window)
        c1, w1 = cp.cpu_times(), time.time()
        cpu = 100.0 * ((c1.user + c1.system) - (c0.user + c0.system)) / (w1 - w0)
        rss_mb = cp.memory_info().rss / 2**20
        hb = fleet.heartbeats_between(w0 + 0.5, w1)
        interval = max(r[7] for r in fleet.latest.values())
        asked = args.workers * (w1 - w0 - 0.5) / interval
        print(f"idle fleet over {args.window:.0f} s: coordinator CPU {cpu:.1f} % of a core, RSS {rss_mb:.0f} MB; "
              f"heartbeats achieved {hb / (w1 - w0 - 0.5):,.0f}/s of {asked / (w1 - w0 - 0.5):,.0f}/s asked "
              f"({100 * hb / asked:.0f} %)", flush=True)

        for name, summary in api_latencies(base, admin, args.api_samples).items():
            print(f"  {name}: {summary}", flush=True)
        if spy is not None:
            spy.wait()
        spy = _profile(args.profile, "dispatch", coord.pid, 0, args.native)
        d0 = cp.cpu_times()
        tps, n = dispatch(rest, args.tasks)
        d1 = cp.cpu_times()
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait()
        per_task = ((d1.user + d1.system) - (d0.user + d0.system)) / n
        print(f"dispatch: {n} no-op tasks over the fleet at {tps:,.0f} tasks/s "
              f"(coordinator CPU {per_task * 1e6:.0f} us per task, heartbeats included)", flush=True)

        before = fleet.registrations()
        procs.stop(coord)
        wait_until(lambda: fleet.registered() == 0, 120, "every session to notice the stop", interval=0.1)
        t1 = time.perf_counter()
        coord, _ = start_coordinator_process(procs, db, port=port, args=coord_args, env=env)
        wait_until(lambda: fleet.registered() >= args.workers, 600, "every session to register again", interval=0.1)
        back_s = time.perf_counter() - t1
        print(f"restart: all {args.workers} sessions registered again {back_s:.1f} s after the new coordinator "
              f"started ({fleet.registrations() - before} registrations)", flush=True)
        stop_evt.set()
        for g in gens:
            g.join(30)
    finally:
        for g in locals().get("gens", []):
            if g.is_alive():
                os.kill(g.pid, signal.SIGKILL)
        procs.close()


if __name__ == "__main__":
    main()
