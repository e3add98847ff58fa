"""What a standby's forwarding costs (coordinator/forward.py): serial ``POST /api/v1/tasks``
submissions of one no-op task over one keep-alive ``http.client`` connection, to the leader
directly and through a standby, alternating in blocks within one run (the machine's load then
weighs on both alike). Two real coordinator processes on a private PostgreSQL database; no worker
(the tasks stay queued: this times the request path, not execution).

    PYTHONPATH=. .venv/bin/python benchmarks/forwarding.py [--n 2000] [--block 100] [--baseline-tree DIR]

``--baseline-tree DIR``: a third member, a standby run from another checkout of this repository
(``DIR/run_coordinator.py``, e.g. ``git worktree add DIR <commit>``), joins the group, and a third
path goes through it: the same leader, forwarding before and after a change in one run.

Prints p50, p90 and p99 per path and the added cost at each, and the CPU time each coordinator
process spent per request of each path (``/proc/PID/stat``: independent of how loaded the machine is).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from distributed_testing.testing import Procs, pg_database_sync, wait_until  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
pids: dict[str, int] = {}


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(procs: Procs, tmp: Path, dsn: str, name: str, tree: Path = ROOT) -> str:
    port_file = tmp / f"{name}.port"
    env = {"PYTHONPATH": str(tree)}
    pids[name] = procs.start([str(tree / "run_coordinator.py"), "--host", "127.0.0.1", "--port", "0", "--db-path", dsn,
                              "--port-file", str(port_file), "--admin-key-file", str(tmp / "admin.key")],
                             tmp / f"{name}.log", env=env).pid
    wait_until(port_file.exists, 60, f"{name} to listen")
    return f"http://127.0.0.1:{int(port_file.read_text())}"


def role(url: str) -> str | None:
    try:
        return str(get(url, "/api/v1/health")["role"])
    except OSError:
        return None


def get(url: str, path: str) -> dict[str, object]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    try:
        conn.request("GET", path)
        return dict(json.loads(conn.getresponse().read()))
    finally:
        conn.close()


def timed_block(conn: http.client.HTTPConnection, key: str, n: int, tag: str, start_i: int) -> list[float]:
    out = []
    for i in range(n):
        body = json.dumps({"type": "custom", "config": {"name": "noop"}, "task_id": f"{tag}-{start_i + i}"}).encode()
        t0 = time.perf_counter()
        conn.request("POST", "/api/v1/tasks", body=body,
                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        out.append(time.perf_counter() - t0)
        if resp.status not in (200, 201):
            raise SystemExit(f"{tag}: HTTP {resp.status}")
    return out


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="submissions per path (default 2000)")
    ap.add_argument("--block", type=int, default=100, help="submissions per alternating block (default 100)")
    ap.add_argument("--baseline-tree", type=Path, help="a checkout whose standby is a third path (see above)")
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory() as d, pg_database_sync(prefix="dt_bench_forward") as dsn:
        tmp = Path(d)
        procs = Procs(tmp, cwd=ROOT)
        try:
            leader = start(procs, tmp, dsn, "a")
            wait_until(lambda: role(leader) == "leader", 60, "a to lead")
            standby = start(procs, tmp, dsn, "b")
            wait_until(lambda: role(standby) == "standby", 60, "b to stand by")
            paths = [("leader", leader), ("standby", standby)]
            if ns.baseline_tree is not None:
                baseline = start(procs, tmp, dsn, "c", ns.baseline_tree.resolve())
                wait_until(lambda: role(baseline) == "standby", 60, "c to stand by")
                paths.append(("baseline standby", baseline))
            key = (tmp / "admin.key").read_text().strip()
            conns = {name: http.client.HTTPConnection(urllib.parse.urlsplit(u).hostname or "127.0.0.1", urllib.parse.urlsplit(u).port,
                                                      timeout=30) for name, u in paths}
            for name, conn in conns.items():  # warm-up: connections, the forwarder's pool, caches
                timed_block(conn, key, 50, f"warm-{name.replace(' ', '-')}", 0)
            times: dict[str, list[float]] = {name: [] for name in conns}
            cpu = {(path, member): 0.0 for path in conns for member in pids}
            for i in range(0, ns.n, ns.block):
                for name, conn in conns.items():
                    before = {member: cpu_s(pid) for member, pid in pids.items()}
                    times[name] += timed_block(conn, key, min(ns.block, ns.n - i), name.replace(" ", "-"), i)
                    for member, pid in pids.items():
                        cpu[(name, member)] += cpu_s(pid) - before[member]
        finally:
            procs.close()
    members = {"a": "leader", "b": "standby", "c": "baseline standby"}
    for name, xs in times.items():
        print(f"{name:16s} n={len(xs)} p50={pct(xs, .5):.3f} ms p90={pct(xs, .9):.3f} ms p99={pct(xs, .99):.3f} ms "
              f"mean={statistics.fmean(xs) * 1000:.3f} ms")
    for (path, member), used in cpu.items():
        print(f"CPU of the {members[member]} per request via the {path}: {used / len(times[path]) * 1e6:.0f} µs")
    for name in times:
        if name != "leader":
            print(f"added by the {name} at " + ", ".join(
                f"p{int(q * 100)}: {pct(times[name], q) - pct(times['leader'], q):.3f} ms" for q in (.5, .9, .99)))


if __name__ == "__main__":
    main()
