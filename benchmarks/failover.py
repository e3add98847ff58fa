"""Failover as clients see it (issue 28): three coordinator processes on a private PostgreSQL
database, one ``--high-availability`` worker given every member, and a small round-robin TCP
proxy in front of the three (one address for the group, as a load balancer gives). Each round
disrupts the current leader (SIGKILL; SIGSTOP for ``--pause-s``; or a network cut for as long:
each member runs in a network namespace of its own, ``testing.netns.NetNs``, its PostgreSQL and
API traffic carried by relays in the root namespace, and its link goes down), then measures, from
the disruption:

- worker: until the worker's next task is assigned (a no-op this script submits, through its
  ``client.ApiClient`` given every member, right after the disruption);
- dt --wait: until ``dt submit --wait`` (every member given; started before, its 1 s task accepted
  and running when the leader goes) exits 0;
- plain HTTP via the proxy: until a plain ``GET /api/v1/workers`` through the proxy (``urllib``,
  2 s timeout, one every 0.1 s, no redirect followed) first answers 200.

A killed member is restarted on its port, a paused or cut one resumed or reconnected (it rejoins
as a standby), and the next round waits for three members and the worker. Prints p50 and max per
disruption and client. Cuts need ``ip netns`` (root); without it, kills and pauses only.

    PYTHONPATH=. .venv/bin/python benchmarks/failover.py [--rounds 5] [--pause-s 8] [--kinds kill,pause,cut]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from distributed_testing.client import ApiClient  # noqa: E402
from distributed_testing.testing import (  # noqa: E402
    Procs,
    RoundRobinProxy,
    free_port,
    hidden_accelerators,
    pg_database_sync,
    wait_until,
)
from distributed_testing.testing.netns import NetNs  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
KEEP = bool(os.environ.get("DT_BENCH_KEEP"))


class Group:
    """Members a, b and c; with ``namespaces`` each runs in its own, reached through relays on its
    namespace's root end (``url``: the relay to its API, which it advertises)."""

    def __init__(self, tmp: Path, dsn: str, namespaces: list[NetNs]) -> None:
        self.tmp, self.dsn = tmp, dsn
        self.procs = Procs(tmp, cwd=ROOT)
        self.ports = {name: free_port() for name in "abc"}
        self.proc: dict[str, subprocess.Popen[bytes]] = {}
        self.ns = dict(zip(self.ports, namespaces, strict=False))
        self.relays: dict[str, tuple[RoundRobinProxy, RoundRobinProxy]] = {}
        db = urllib.parse.urlsplit(dsn)
        for name, ns in self.ns.items():
            ns.route_default()
            self.relays[name] = (RoundRobinProxy([(db.hostname or "127.0.0.1", db.port or 5432)], host=ns.host_addr),
                                 RoundRobinProxy([(ns.ns_addr, self.ports[name])], host=ns.host_addr))

    def url(self, name: str) -> str:
        return self.relays[name][1].url if name in self.relays else f"http://127.0.0.1:{self.ports[name]}"

    def start(self, name: str) -> None:
        dsn, host, prefix = self.dsn, "127.0.0.1", list[str]()
        if name in self.ns:
            parts = urllib.parse.urlsplit(self.dsn)
            user = parts.netloc.rpartition("@")[0] + "@" if "@" in parts.netloc else ""
            relay = self.relays[name][0]
            dsn = urllib.parse.urlunsplit(parts._replace(netloc=f"{user}{relay.host}:{relay.port}"))
            host, prefix = self.ns[name].ns_addr, self.ns[name].prefix
        self.proc[name] = self.procs.start(
            ["run_coordinator.py", "--host", host, "--port", str(self.ports[name]), "--db-path", dsn,
             "--admin-key-file", str(self.tmp / "admin.key"), "--advertise-url", self.url(name)],
            self.tmp / f"{name}.log", prefix=prefix)

    def close(self) -> None:
        for name, p in self.proc.items():
            with contextlib.suppress(OSError):
                p.send_signal(signal.SIGCONT)
            if name in self.ns:
                self.ns[name].up()
        self.procs.close()
        for relays in self.relays.values():
            for relay in relays:
                relay.close()

    def role(self, name: str) -> str | None:
        try:
            with urllib.request.urlopen(self.url(name) + "/api/v1/health", timeout=2) as r:
                return str(json.loads(r.read())["role"])
        except (OSError, ValueError):
            return None

    def leader(self) -> str | None:
        return next((n for n in self.ports if self.role(n) == "leader"), None)

    def settled(self) -> bool:
        roles = sorted(str(self.role(n)) for n in self.ports)
        return roles == ["leader", "standby", "standby"]


class Prober:
    """Plain GETs through the proxy every 0.1 s: (sent, answered, status or 0)."""

    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key
        self.seen: list[tuple[float, float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            sent = time.time()
            req = urllib.request.Request(self.url + "/api/v1/workers", headers={"Authorization": f"Bearer {self.key}"})
            try:
                with urllib.request.urlopen(req, timeout=2) as r:
                    status = r.status
            except urllib.error.HTTPError as exc:
                status = exc.code
            except OSError:
                status = 0
            self.seen.append((sent, time.time(), status))
            self._stop.wait(0.1)

    def recovered_after(self, t0: float) -> float | None:
        """Until the first 200 to a request sent after ``t0`` (one in flight then may have been
        answered before the disruption took effect)."""
        return next((t - t0 for sent, t, s in self.seen if sent >= t0 and s == 200), None)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def one_round(g: Group, api: ApiClient, key: str, proxy: RoundRobinProxy, kind: str, n: int,
              pause_s: float) -> dict[str, float | None]:
    settle = time.time()
    wait_until(g.settled, 240, "three members, one leading")
    if time.time() - settle > 30:  # an earlier leader took long to end its term and rejoin
        print(f"the group took {time.time() - settle:.0f} s to settle before {kind} round {n}", flush=True)
    wait_until(lambda: any(w["state"] == "ready" for w in api.get("/api/v1/workers")["workers"]), 60,
               "the worker to be connected")
    leader = g.leader()
    assert leader is not None
    prober = Prober(f"http://127.0.0.1:{proxy.port}", key)
    tag = f"{kind}-{n}-{int(time.time())}"
    doc = g.tmp / f"{tag}.json"  # dt's task runs across the disruption
    doc.write_text(json.dumps({"task_id": f"{tag}-dt", "type": "custom", "max_retries": 2,
                               "config": {"name": "sleep", "parameters": {"seconds": 1}}}))
    dt = subprocess.Popen([sys.executable, "-m", "distributed_testing.cli.dt", "--coordinator",
                           ",".join(g.url(m) for m in g.ports), "--api-key", key, "submit", str(doc), "--wait",
                           "--progress", "plain"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert dt.stdout is not None
    dt.stdout.readline()  # accepted (dt started long before: its start-up is not failover)
    t0 = time.time()
    if kind == "cut":
        g.ns[leader].down()
    else:
        g.proc[leader].send_signal(signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
    probe_id = api.post("/api/v1/tasks", {"task_id": f"{tag}-probe", "type": "custom", "config": {"name": "noop"}},
                        repeatable=True)["tasks"][0]["task_id"]
    dt.communicate(timeout=120)
    dt_s = time.time() - t0 if dt.returncode == 0 else None
    wait_until(lambda: prober.recovered_after(t0) is not None, 60, "a plain request through the proxy")
    prober.stop()
    wait_until(lambda: api.get(f"/api/v1/tasks/{probe_id}")["state"] == "succeeded", 60, "the probe task")
    assigned = [h["at"] for h in api.get(f"/api/v1/tasks/{probe_id}")["history"] if h["to"] == "assigned"]
    if kind == "kill":
        g.proc[leader].wait()
        g.start(leader)
    else:
        time.sleep(max(0.0, pause_s - (time.time() - t0)))
        if kind == "cut":
            g.ns[leader].up()
        else:
            g.proc[leader].send_signal(signal.SIGCONT)
    return {"worker": assigned[0] - t0 if assigned else None, "dt --wait": dt_s,
            "plain HTTP via proxy": prober.recovered_after(t0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="rounds per disruption (default 5)")
    ap.add_argument("--pause-s", type=float, default=8.0,
                    help="how long a paused or cut-off leader stays so (default 8)")
    ap.add_argument("--kinds", default="kill,pause,cut", help="disruptions, in turn each round (default kill,pause,cut)")
    ns = ap.parse_args()
    kinds = [k for k in ns.kinds.split(",") if k]
    why_not = NetNs.unavailable() if "cut" in kinds else None
    if why_not is not None:
        print(f"no cuts: {why_not}", flush=True)
        kinds.remove("cut")
    results: dict[tuple[str, str], list[float | None]] = {}
    keep = tempfile.mkdtemp(prefix="dt-failover-") if KEEP else None  # DT_BENCH_KEEP=1: keep the logs
    with (contextlib.nullcontext(keep) if keep else tempfile.TemporaryDirectory()) as d, \
            pg_database_sync(prefix="dt_bench_failover") as dsn, contextlib.ExitStack() as stack:
        print(f"logs in {d}", flush=True)
        namespaces = [stack.enter_context(NetNs()) for _ in range(3)] if "cut" in kinds else []
        g = Group(Path(d), dsn, namespaces)
        try:
            g.start("a")
            wait_until(lambda: g.role("a") == "leader", 60, "a to lead")
            g.start("b")
            g.start("c")
            key = (g.tmp / "admin.key").read_text().strip()
            api = ApiClient([g.url(m) for m in g.ports], key)
            worker_key = api.post("/api/v1/keys", {"role": "worker", "name": "bench"})["key"]
            (g.tmp / "w.key").write_text(worker_key)
            g.procs.start(["run_worker_example.py", "--coordinator", ",".join(g.url(m) for m in g.ports),
                           "--api-key-file", str(g.tmp / "w.key"), "--worker-id", "w1", "--high-availability"],
                          g.tmp / "w1.log", env=hidden_accelerators(g.tmp))
            proxy = RoundRobinProxy([(urllib.parse.urlsplit(g.url(m)).hostname or "", urllib.parse.urlsplit(g.url(m)).port
                                      or 80) for m in g.ports])
            print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
            for n in range(ns.rounds):
                for kind in kinds:
                    row = one_round(g, api, key, proxy, kind, n, ns.pause_s)
                    print(f"{kind} round {n}: " + ", ".join(f"{k} {v:.2f}s" if v is not None else f"{k} FAILED"
                                                           for k, v in row.items()), flush=True)
                    for client, v in row.items():
                        results.setdefault((kind, client), []).append(v)
        finally:
            print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
            g.close()
    print("\n| disruption | client | n | p50 | max | failed |\n|---|---|---|---|---|---|")
    for (kind, client), vs in results.items():
        ok: list[Any] = [v for v in vs if v is not None]
        print(f"| {kind} | {client} | {len(vs)} | {statistics.median(ok):.2f} s | {max(ok):.2f} s | "
              f"{len(vs) - len(ok)} |" if ok else f"| {kind} | {client} | {len(vs)} | - | - | {len(vs)} |")


if __name__ == "__main__":
    main()
