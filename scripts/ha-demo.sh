#!/usr/bin/env bash
# High-availability demo: three coordinators on a fresh PostgreSQL database, two workers with
# --high-availability, 60 short tasks; the leader is SIGKILLed in the middle of the run, a standby
# takes over, and every task completes exactly once (read back from the database).
#
# Needs a PostgreSQL server where the demo may create (and afterwards drop) a database of its own:
# DT_DEMO_PG (default postgresql://postgres@127.0.0.1:5432). Logs stay in ./ha-demo-state.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=${PYTHON:-python3}; fi
export DT_DEMO_PG="${DT_DEMO_PG:-postgresql://postgres@127.0.0.1:5432}"
exec "$PY" - "$@" <<'EOF'
import json, os, shutil, signal, subprocess, sys, time, urllib.request
from pathlib import Path

import asyncpg

from distributed_testing.cli.http import ApiClient
from distributed_testing.testing import create_pg_database, drop_pg_database, free_port, run_sync

state = Path("ha-demo-state")
shutil.rmtree(state, ignore_errors=True)
state.mkdir()
dsn = run_sync(create_pg_database(os.environ["DT_DEMO_PG"], "dt_ha_demo"))
procs: list[subprocess.Popen[bytes]] = []


def start(args: list[str], log: str) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, *args], stdout=open(state / log, "wb"), stderr=subprocess.STDOUT)
    procs.append(p)
    return p


def health(url: str) -> dict:
    try:
        with urllib.request.urlopen(url + "/api/v1/health", timeout=2) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return {}


def tasks() -> dict[str, dict]:
    async def read():
        con = await asyncpg.connect(dsn)
        try:
            return await con.fetch("SELECT task_id, state, history::text AS h FROM tasks")
        finally:
            await con.close()
    return {r["task_id"]: {"state": r["state"], "history": json.loads(r["h"])} for r in run_sync(read())}


def until(what: str, ok, timeout: float = 60.0) -> None:
    end = time.time() + timeout
    while not ok():
        if time.time() > end:
            sys.exit(f"ha-demo: timed out waiting for {what}; logs in {state}/")
        time.sleep(0.1)


try:
    members = {}
    for name in ("a", "b", "c"):
        port = free_port()
        members[name] = (start(["run_coordinator.py", "--port", str(port), "--db-path", dsn,
                                "--admin-key-file", str(state / "admin.key")], f"coordinator-{name}.log"),
                         f"http://127.0.0.1:{port}")
        if name == "a":  # the first one leads; the others join as standbys
            until("coordinator a to lead", lambda: health(members["a"][1]).get("role") == "leader")
    urls = [u for _, u in members.values()]
    until("the standbys", lambda: all(health(u).get("role") in ("leader", "standby") for u in urls))
    for name, (_, url) in members.items():
        print(f"coordinator {name} at {url}: {health(url)['role']}")
    api = ApiClient(urls, (state / "admin.key").read_text().strip())
    worker_key = state / "worker.key"
    worker_key.write_text(api.post("/api/v1/keys", {"role": "worker", "name": "demo"})["key"])
    for w in ("w1", "w2"):
        start(["run_worker_example.py", "--coordinator", ",".join(urls), "--api-key-file", str(worker_key),
               "--worker-id", w, "--max-concurrent-tasks", "2", "--high-availability"], f"worker-{w}.log")
    until("two workers", lambda: len(api.get("/api/v1/workers")["workers"]) == 2)
    ids = [t["task_id"] for t in api.post("/api/v1/tasks", [
        {"task_id": f"demo-{i:03d}", "type": "custom", "max_retries": 3,
         "config": {"name": "sleep", "parameters": {"seconds": 0.25}}} for i in range(60)], repeatable=True)["tasks"]]
    print(f"submitted {len(ids)} tasks (0.25 s each) to two workers with two slots each")
    until("a third of the tasks", lambda: sum(t["state"] == "succeeded" for t in tasks().values()) >= 20)
    leader = next(n for n, (_, u) in members.items() if health(u).get("role") == "leader")
    proc, _ = members[leader]
    done = sum(t["state"] == "succeeded" for t in tasks().values())
    proc.send_signal(signal.SIGKILL)
    killed = time.time()
    proc.wait()
    print(f"SIGKILLed the leader, coordinator {leader}, with {done} of {len(ids)} tasks done")
    until("a new leader", lambda: any(health(u).get("role") == "leader" for n, (_, u) in members.items() if n != leader))
    new = next(n for n, (_, u) in members.items() if n != leader and health(u).get("role") == "leader")
    print(f"coordinator {new} leads after {time.time() - killed:.2f}s")
    until("every task to end", lambda: all(t["state"] in ("succeeded", "failed", "error", "timed_out", "cancelled")
                                           for t in tasks().values()))
    final = tasks()
    succeeded = sum(t["state"] == "succeeded" for t in final.values())
    twice = [tid for tid, t in final.items() if sum(h["to"] == "succeeded" for h in t["history"]) != 1]
    after = [h["at"] for t in final.values() for h in t["history"] if h["to"] == "assigned" and h["at"] > killed]
    print(f"{succeeded} of {len(ids)} tasks succeeded; tasks with other than one outcome: {twice or 'none'}")
    if after:
        print(f"kill -> next assignment by the new leader: {min(after) - killed:.2f}s")
    sys.exit(0 if succeeded == len(ids) and not twice else 1)
finally:
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
    run_sync(drop_pg_database(dsn))
EOF
