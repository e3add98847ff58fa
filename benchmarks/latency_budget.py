"""Where each microsecond of a serial task goes: submit -> durable outcome, split into stages.

A coordinator (DuckDB store with its journal) and two workers with their default flags, started
as a new user would (``dispatch.Cluster`` with ``worker_args=[]``). After a warm-up, ``--samples``
no-op custom tasks one at a time, each one ``POST /api/v1/tasks?wait=30`` over one keep-alive
``http.client`` connection; the client stamps its send and its receipt of the answer with
``time.time()``. Afterwards each task's record (``GET /api/v1/tasks/{id}``: the ``history`` of
its transitions, stamped by the coordinator, and its ``result``: ``started_at``/``finished_at``
stamped by the worker around the executor's call, ``received_at`` by the coordinator) splits the
sample into stages. Every process runs on this host, so the coordinator's, the workers' and the
client's ``time.time()`` are one clock. Printed per stage: p50 and p90 in µs, and the sum of the
stage medians beside the total's median (a sum of medians is not the median of sums: close, not
equal).

In the same run and process, microbenchmarks that attribute time inside the stages: fdatasync of a
small append in the cluster's temporary directory (what the journal's commit waits for), a
``Channel.seal`` + ``Channel.open`` of an ``assign`` frame with one task and of a ``results``
frame, HTTP round trips on the same keep-alive connection that carry no task (the HTTP + client
floor: a refused empty submission on the coordinator's fast ``POST`` front, then ``GET``s through
aiohttp, authenticated and not), the state machine alone per task (``CoordinatorState`` submit + dispatch
and result, no sockets, workers registered as ``metrics_overhead.py`` does) and the worker's pool
child round trip (``pool_noop.measure``, mean only).

``--root DIR`` runs the cluster and the in-process microbenchmarks from another checkout (e.g. a
``git worktree`` of an older commit) for "before" figures; what that checkout does not have prints
``n/a``. Figures from a shared machine are indicative: compare runs made at the same time.

Run: ``PYTHONPATH=. python benchmarks/latency_budget.py --samples 1000``
(before: ``git worktree add /tmp/before <commit> && PYTHONPATH=. python benchmarks/latency_budget.py --root /tmp/before``)
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 30
NA = "n/a"

# (key, label, what is in it); each stage is the difference of two stamps, see ``stages``
STAGES = [
    ("client_to_accepted", "client sent → accepted",
     "client's request write, coordinator HTTP read + parse, auth, task validation (coordinator `pending` stamp)"),
    ("accepted_to_assigned", "accepted → assigned",
     "scheduling: `pending` → `assigned` stamps (0 when submit dispatches in the same call, with the same clock reading)"),
    ("assigned_to_started", "assigned → started on the worker",
     "records handed to the store, seal, WebSocket to the worker, open, worker state, task start, executor until it stamps `started_at`"),
    ("task_body", "task body (started → finished)",
     "worker `started_at` → `finished_at`: CustomExecutor.run, i.e. the pool child hand-off and back around a no-op"),
    ("finished_to_recorded", "finished → outcome recorded",
     "worker result → outbox, seal, WebSocket to the coordinator, open, state machine (`received_at`)"),
    ("recorded_to_client", "outcome recorded → client has it",
     "journal append + fdatasync of the task's records (a ?wait submission's own records wait to share it), "
     "wake the waiting request, answer, client read"),
]


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def dist(xs: list[float] | None, scale: float = 1e6) -> dict[str, Any]:
    """p50/p90/p99/mean of ``xs`` (seconds) in µs; ``None`` or empty: every figure n/a."""
    if not xs:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "mean": None}
    return {"n": len(xs), "p50": pct(xs, 50) * scale, "p90": pct(xs, 90) * scale, "p99": pct(xs, 99) * scale,
            "mean": statistics.mean(xs) * scale}


def fmt(v: float | None) -> str:
    if v is None:
        return NA
    return f"{v:.1f}" if abs(v) < 100 else f"{v:,.0f}"


# ----------------------------------------------------------------------------- the serial samples


def post_wait(client: Any) -> tuple[float, float, float, dict[str, Any]]:
    """One no-op task through ``POST ?wait=``: client send and receive instants (``time.time``),
    the ``perf_counter`` total, and the task as answered."""
    conn = client.conn
    t_send = time.time()
    p0 = time.perf_counter()
    conn.request("POST", f"/api/v1/tasks?wait={WAIT_S}", body=client.body, headers=client.headers)
    raw = conn.getresponse().read()
    p1 = time.perf_counter()
    t_recv = time.time()
    task: dict[str, Any] = json.loads(raw)["tasks"][0]
    return t_send, t_recv, p1 - p0, task


def get_json(conn: Any, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    conn.request("GET", path, headers=headers)
    r = conn.getresponse()
    raw = r.read()
    try:
        return r.status, json.loads(raw)
    except ValueError:
        return r.status, None


def first_at(history: list[dict[str, Any]], to: str) -> float | None:
    for h in history:
        if h.get("to") == to and isinstance(h.get("at"), (int, float)):
            return float(h["at"])
    return None


def stages(sample: dict[str, Any], record: dict[str, Any] | None) -> dict[str, float | None]:
    """One sample split at the stamps its record has (a missing stamp leaves its stages ``None``)."""
    rec = record or {}
    hist = rec.get("history") or []
    res = rec.get("result") or {}
    pending = first_at(hist, "pending")
    assigned = first_at(hist, "assigned")
    running = first_at(hist, "running")
    started, finished = res.get("started_at"), res.get("finished_at")
    recorded = res.get("received_at") or first_at(hist, rec.get("state", "succeeded"))

    def d(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else b - a

    return {"client_to_accepted": d(sample["t_send"], pending), "accepted_to_assigned": d(pending, assigned),
            "assigned_to_started": d(assigned, started), "task_body": d(started, finished),
            "finished_to_recorded": d(finished, recorded), "recorded_to_client": d(recorded, sample["t_recv"]),
            "assigned_to_running_recorded": d(assigned, running),
            "total_wall": sample["t_recv"] - sample["t_send"], "total_perf": sample["perf"]}


def serial(cluster: Any, samples: int, warmup: int) -> tuple[Any, list[dict[str, Any]]]:
    """Warm-up, then ``samples`` serial tasks, once the cluster is idle. Returns the client (its
    connection still on the coordinator's fast ``POST`` front) and the samples."""
    from dispatch import SyncClient, settle

    client = SyncClient(cluster.base, cluster.admin)
    for _ in range(warmup):
        post_wait(client)
    settle(cluster.procs, quiet_s=0.5, timeout=15)
    out = []
    for _ in range(samples):
        t_send, t_recv, perf, task = post_wait(client)
        assert task.get("state") == "succeeded", task
        out.append({"task_id": task["task_id"], "t_send": t_send, "t_recv": t_recv, "perf": perf})
    return client, out


def read_records(conn: Any, headers: dict[str, str], samples: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    records: list[dict[str, Any] | None] = []
    for s in samples:
        status, body = get_json(conn, f"/api/v1/tasks/{s['task_id']}", headers)
        records.append(body if status == 200 and isinstance(body, dict) else None)
    return records


# ------------------------------------------------------------------------------ microbenchmarks


def timed(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def micro_fdatasync(tmp: Path, n: int) -> list[float]:
    fd = os.open(tmp / "fsync-probe", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        line = b"x" * 200 + b"\n"  # about one journal record

        def one() -> None:
            os.write(fd, line)
            os.fdatasync(fd)
        return timed(one, n)
    finally:
        os.close(fd)


def micro_signing(n: int) -> dict[str, list[float]]:
    from distributed_testing.protocol import messages as m
    from distributed_testing.protocol.signing import Channel, derive_session_key

    key = derive_session_key("k" * 43, "session")
    tx, rx = Channel(key), Channel(key)
    task_id = hashlib.sha256(b"t").hexdigest()[:32]
    assign = m.AssignTasks(tasks=[m.TaskAssignment(task_id=task_id, attempt=1, type="custom",
                                                   config={"name": "noop", "parameters": {}})])
    now = time.time()
    results = m.Results(results=[m.TaskResult(task_id=task_id, attempt=1, status="succeeded", started_at=now,
                                              finished_at=now + 1e-4, output={}, worker_id="bench-0")])
    out: dict[str, list[float]] = {}
    for name, msg in (("assign", assign), ("results", results)):
        frames: list[bytes] = []
        out[f"seal {name}"] = timed(functools.partial(seal_into, tx, msg, frames), n)
        out[f"open {name}"] = timed(functools.partial(open_next, rx, iter(frames)), n)
    return out


def seal_into(tx: Any, msg: Any, frames: list[bytes]) -> None:
    frames.append(tx.seal(msg, time.time()))


def open_next(rx: Any, frames: Iterator[bytes]) -> None:
    rx.open(next(frames), time.time())


def micro_http(client: Any, n: int) -> dict[str, list[float] | None]:
    """Round trips that carry no task on the samples' connection. First a submission of an empty
    list (refused before any task exists) while the connection is still on the fast ``POST`` front;
    then ``GET``s, which hand the connection to aiohttp for good."""
    conn, headers = client.conn, client.headers
    out: dict[str, list[float] | None] = {}

    def refused() -> None:
        conn.request("POST", "/api/v1/tasks", body=b"[]", headers=headers)
        r = conn.getresponse()
        r.read()
        if r.status < 400:
            raise RuntimeError(f"an empty submission was answered {r.status}")

    for name, fn in (("POST /api/v1/tasks [] (refused)", refused),
                     ("GET /api/v1/cluster (authenticated)", lambda: get_ok(conn, "/api/v1/cluster", headers)),
                     ("GET /api/v1/health (no credential)", lambda: get_ok(conn, "/api/v1/health", {})),
                     ("GET /healthz (no credential, task counts)", lambda: get_ok(conn, "/healthz", {}))):
        try:
            fn()
            out[name] = timed(fn, n)
        except Exception as exc:  # an older coordinator without the route
            print(f"  (microbenchmark {name}: {type(exc).__name__}: {exc})", file=sys.stderr)
            out[name] = None
            if isinstance(exc, OSError | RuntimeError):
                conn.close()  # http.client reconnects on the next request
    return out


def get_ok(conn: Any, path: str, headers: dict[str, str]) -> None:
    conn.request("GET", path, headers=headers)
    r = conn.getresponse()
    r.read()
    if r.status != 200:
        raise RuntimeError(f"GET {path}: {r.status}")


def micro_state(n: int) -> dict[str, list[float]]:
    """The coordinator's state machine alone, one task at a time: submit (with its dispatch) and
    the worker's result, then retire (the runtime's step once the records are durable)."""
    from metrics_overhead import register

    from distributed_testing.config import CoordinatorConfig
    from distributed_testing.coordinator.core.state import Send
    from distributed_testing.coordinator.runtime import Runtime
    from distributed_testing.coordinator.store.memory import MemoryStore
    from distributed_testing.protocol import messages as m
    from distributed_testing.tasks.spec import parse_tasks

    rt = Runtime(CoordinatorConfig(db_path="memory://"), MemoryStore())
    register(rt, 2)
    state = rt.state
    retire = getattr(state, "retire", None)  # older checkouts keep finished tasks without it
    submit_s, result_s = [], []
    now = 1.0
    for i in range(n + n // 10):
        spec = parse_tasks([{"task_id": f"t{i}", "type": "custom", "config": {"name": "noop"}}])
        now += 1e-3
        t0 = time.perf_counter()
        _, cmds = state.submit(spec, now)
        t1 = time.perf_counter()
        sends = [(c.worker_id, c.msg) for c in cmds if isinstance(c, Send) and isinstance(c.msg, m.AssignTasks)]
        if not sends:
            raise RuntimeError("the state machine assigned nothing")
        worker, a = sends[0][0], sends[0][1].tasks[0]
        msg = m.Results(results=[m.TaskResult(task_id=a.task_id, attempt=a.attempt, status="succeeded",
                                              started_at=now, finished_at=now, output={}, worker_id=worker)])
        t2 = time.perf_counter()
        state.results(worker, msg, now)
        t3 = time.perf_counter()
        if retire is not None:
            retire([a.task_id])
        if i >= n // 10:  # the first tenth warms up
            submit_s.append(t1 - t0)
            result_s.append(t3 - t2)
    return {"state machine: submit + dispatch": submit_s, "state machine: result": result_s}


def micro_pool(n: int) -> float:
    """µs per no-op through CustomExecutor's pool, one after another (``pool_noop.measure``, mean)."""
    from pool_noop import measure

    return float(asyncio.run(measure(n, 2, None))["sequential_us_per_task"])


def attempt(name: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # what an older checkout does not have: n/a, not a crash
        print(f"  (microbenchmark {name}: {type(exc).__name__}: {exc})", file=sys.stderr)
        return None


# -------------------------------------------------------------------------------------- report


def describe_root(root: Path) -> str:
    try:
        rev = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h %s"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return f"{root} ({rev[:80]})" if rev else str(root)


def report(args: argparse.Namespace, root: Path, per_stage: dict[str, list[float]], totals: dict[str, list[float]],
           missing: int, micro: dict[str, Any]) -> dict[str, Any]:
    import distributed_testing

    rows = {k: dist(per_stage.get(k)) for k, _, _ in STAGES}
    print(f"latency budget: {args.samples} serial no-op custom tasks, POST /api/v1/tasks?wait={WAIT_S} over one "
          f"keep-alive http.client connection; coordinator (DuckDB store) + 2 workers with default flags")
    print(f"cluster from {describe_root(root)}; in-process microbenchmarks import {Path(distributed_testing.__file__).parent}")
    print("stamps: client time.time(), coordinator history/received_at, worker started_at/finished_at: one host, one clock")
    if missing:
        print(f"records without some stamp: {missing} of {args.samples} (their stages count where they can)")
    print()
    print("| stage | p50 µs | p90 µs | what is in it |")
    print("|---|---:|---:|---|")
    for key, label, what in STAGES:
        print(f"| {label} | {fmt(rows[key]['p50'])} | {fmt(rows[key]['p90'])} | {what} |")
    medians = [rows[k]["p50"] for k, _, _ in STAGES]
    sum_med = None if any(v is None for v in medians) else sum(medians)
    wall, perf = dist(totals["total_wall"]), dist(totals["total_perf"])
    print(f"| **sum of stage p50s** | {fmt(sum_med)} | | |")
    print(f"| **total (client time.time)** | {fmt(wall['p50'])} | {fmt(wall['p90'])} | p99 {fmt(wall['p99'])} µs |")
    print(f"| **total (client perf_counter)** | {fmt(perf['p50'])} | {fmt(perf['p90'])} | p99 {fmt(perf['p99'])} µs, "
          f"mean {fmt(perf['mean'])} µs (target: p50 ≤ 500, p99 ≤ 3,000) |")
    run = dist(per_stage.get("assigned_to_running_recorded"))
    print(f"\n`running` recorded (a `started` frame) in {run['n']} of {args.samples} tasks"
          + (f": assigned → running p50 {fmt(run['p50'])} µs (not a stage: overlaps the ones above)" if run["n"] else
             " (a worker announces only tasks still running after its started delay)"))
    print()
    print("| microbenchmark (same run) | p50 µs | p90 µs | n |")
    print("|---|---:|---:|---:|")
    micro_rows: dict[str, dict[str, Any]] = {}
    for name, xs in micro.items():
        if name == "pool child round trip (pool_noop.measure, mean)":
            micro_rows[name] = {"mean": xs}
            print(f"| {name} | {fmt(xs)} (mean) | {NA} | {args.micro} |")
            continue
        micro_rows[name] = dist(xs)
        r = micro_rows[name]
        print(f"| {name} | {fmt(r['p50'])} | {fmt(r['p90'])} | {r['n'] or NA} |")
    print("\nFigures from a shared machine are indicative; compare runs made at the same time (--root for before).")
    return {"samples": args.samples, "root": str(root), "package": str(Path(distributed_testing.__file__).parent),
            "stages_us": {k: rows[k] for k, _, _ in STAGES}, "sum_of_stage_p50_us": sum_med,
            "total_wall_us": wall, "total_perf_us": perf, "running_recorded": run["n"], "micro_us": micro_rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=500, help="serial tasks measured (default 500)")
    ap.add_argument("--warmup", type=int, default=50, help="serial tasks before them, not measured (default 50)")
    ap.add_argument("--micro", type=int, default=300, help="iterations of each microbenchmark (default 300)")
    ap.add_argument("--root", type=Path, default=ROOT,
                    help="the checkout whose coordinator, workers and package are measured (default: this one)")
    ap.add_argument("--json", type=Path, help="also write the figures to this file")
    args = ap.parse_args()
    root = args.root.resolve()
    if not (root / "run_coordinator.py").is_file():
        ap.error(f"--root {root}: no run_coordinator.py there")
    if args.samples < 1 or args.micro < 1:
        ap.error("--samples and --micro must be at least 1")
    if root != ROOT:
        sys.path.insert(0, str(root))  # the in-process microbenchmarks measure that checkout's code too
    from dispatch import Cluster  # imports the package: after the line above

    tmp = Path(tempfile.mkdtemp(prefix="dt-budget-"))
    cluster = None
    try:
        cluster = Cluster(tmp, workers=2, slots=1, root=root, worker_args=[])  # slots unused: worker defaults
        client, samples = serial(cluster, args.samples, args.warmup)
        micro: dict[str, Any] = {}
        micro.update(micro_http(client, args.micro))  # before the GETs below move the connection to aiohttp
        records = read_records(client.conn, client.headers, samples)
        client.conn.close()
        micro["fdatasync, 200-byte append (cluster's temp dir)"] = micro_fdatasync(tmp, args.micro)
        sig = attempt("signing", lambda: micro_signing(max(args.micro, 1000)))
        for name in ("seal assign", "open assign", "seal results", "open results"):
            micro[f"Channel.{name} frame (1 task)"] = sig[name] if sig else None
        st = attempt("state machine", lambda: micro_state(max(args.micro, 1000)))
        for name in ("state machine: submit + dispatch", "state machine: result"):
            micro[name + " (CoordinatorState, no I/O)"] = st[name] if st else None
        micro["pool child round trip (pool_noop.measure, mean)"] = attempt("pool", lambda: micro_pool(args.micro))
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    per_stage: dict[str, list[float]] = {}
    totals: dict[str, list[float]] = {"total_wall": [], "total_perf": []}
    missing = 0
    for s, rec in zip(samples, records, strict=True):
        parts = stages(s, rec)
        missing += any(parts[k] is None for k, _, _ in STAGES)
        for k, v in parts.items():
            if v is not None:
                (totals if k in totals else per_stage).setdefault(k, []).append(v)
    out = report(args, root, per_stage, totals, missing, micro)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
