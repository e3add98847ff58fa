"""The container tier's checks (``bash scripts/test.sh --containers`` runs this after building).

Brings the HA group of deploy/compose.yaml up with ``scripts/containers.sh up`` (as the operations
guide does), then, through the group's address (both coordinators' published ports):

1. submits benchmark, test and custom tasks (examples/tasks.json and 12 sleeps) and a bundle
   (``dt submit --bundle``: shipped code, so the workers' sandbox works in their containers);
2. stops the leader's container (``podman stop``) while they run and checks every task ends
   ``succeeded`` with exactly one outcome in its history and one result row in PostgreSQL;
3. starts a task of a few seconds, ``podman stop``s the worker running it, and checks the task
   finished there (one attempt, succeeded) and the worker exited 0: SIGTERM drained it;
4. runs every container's HEALTHCHECK and checks the workers logged their confinement;
5. checks deploy/seccomp_for_bwrap.py: under a profile that refuses what Docker's default refuses
   a container without CAP_SYS_ADMIN (namespace flags to clone, unshare, mount, umount2,
   pivot_root) the image's sandbox cannot be made, and under that profile as the script rewrites
   it, it can (with podman's /proc masks lifted, as compose.podman.yaml does);
6. checks the image's size against its budget (``IMAGE_BUDGET_MB``).

Exit 0 when all hold; the group is taken down either way (``--keep`` leaves it up). Logs of every
container go to build/containers/logs/ on a failure.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from distributed_testing.client import ApiClient

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "containers"
PROJECT = "dt"
ENV = {**os.environ, "CONTAINERS_CONF": str(BUILD / "containers.conf")}
DT = str(Path(sys.executable).with_name("dt"))
FINAL = ("succeeded", "failed", "error", "timed_out", "cancelled")
IMAGE_BUDGET_MB = 1400  # measured 1,333 MB (CPU torch 2.13 and its dependencies are 1.15 GB); docs/operations.md
# Docker's default seccomp rule for clone: allowed without any of the namespace flags
# (CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET) unless the container has CAP_SYS_ADMIN
CLONE_WITHOUT_NAMESPACES = {"names": ["clone"], "action": "SCMP_ACT_ALLOW",
                            "args": [{"index": 0, "value": 0x7E020000, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]}
SANDBOX_PROBE = "from distributed_testing.worker import sandbox; print(sandbox.available() or 'works')"


def log(msg: str) -> None:
    print(f"[tier {time.strftime('%T')}] {msg}", flush=True)


def sh(*argv: str, check: bool = True, env: dict[str, str] | None = None, **kw: Any) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, env=env or ENV, text=True, capture_output=True, **kw)
    if check and done.returncode != 0:
        raise SystemExit(f"tier: {' '.join(argv)} exited {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(what: str, ok: Any, timeout: float = 120.0) -> Any:
    end = time.monotonic() + timeout
    while True:
        value = ok()
        if value:
            return value
        if time.monotonic() > end:
            raise SystemExit(f"tier: timed out waiting for {what}")
        time.sleep(0.25)


def container(service: str) -> str:
    return f"{PROJECT}_{service}_1"


def health(port: int) -> dict[str, Any]:
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=2) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return {}


def psql(query: str) -> list[list[str]]:
    out = sh("podman", "exec", container("postgres"), "psql", "-U", "dt", "-d", "dt", "-At", "-F", "\t",
             "-c", query).stdout
    return [line.split("\t") for line in out.splitlines() if line]


def submit(env: dict[str, str], tasks: list[dict[str, Any]], *extra: str) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(tasks, f)
    try:
        sh(DT, "submit", *extra, f.name, env=env)
    finally:
        os.unlink(f.name)


def bundle_project(top: Path) -> Path:
    proj = top / "shipped"
    proj.mkdir()
    (proj / "data.txt").write_text("42")
    (proj / "test_shipped.py").write_text(
        "import os, pathlib\n\n"
        "def test_reads_its_data():\n    assert pathlib.Path('data.txt').read_text() == '42'\n\n"
        "def test_runs_sandboxed():\n"
        "    assert not pathlib.Path('/run/secrets').exists()  # the worker's key is not in its world\n"
        "    assert os.getuid() == 10001\n")
    return proj


def seccomp_check() -> None:
    """A profile refusing what Docker's refuses (from podman's default, the one on this machine)
    stops the sandbox; deploy/seccomp_for_bwrap.py's rewrite of it lets it work."""
    default = json.loads(Path("/usr/share/containers/seccomp.json").read_text())
    bwrap = ("clone", "unshare", "mount", "umount2", "pivot_root")
    rules = [{**r, "names": [n for n in r["names"] if n not in bwrap]} for r in default["syscalls"]]
    docker_like = {**default, "syscalls": [r for r in rules if r["names"]] + [CLONE_WITHOUT_NAMESPACES]}
    image = os.environ.get("DT_IMAGE", "localhost/distributed-testing:latest")
    with tempfile.TemporaryDirectory() as d:
        restricted, fixed = Path(d) / "docker-like.json", Path(d) / "fixed.json"
        restricted.write_text(json.dumps(docker_like))
        fixed.write_text(sh(sys.executable, str(ROOT / "deploy" / "seccomp_for_bwrap.py"), str(restricted)).stdout)
        said = {}
        for name, profile in (("docker-like", restricted), ("rewritten", fixed)):
            said[name] = sh("podman", "run", "--rm", "--security-opt", "unmask=/proc/*", "--security-opt",
                            f"seccomp={profile}", image, "python", "-c", SANDBOX_PROBE, check=False).stdout.strip()
    if said["docker-like"] == "works" or said["rewritten"] != "works":
        raise SystemExit(f"tier: seccomp_for_bwrap.py: a Docker-like profile gave {said['docker-like']!r}, "
                         f"its rewrite {said['rewritten']!r}")
    log(f"seccomp: a Docker-like profile refuses the sandbox ({said['docker-like'][-60:]}); its rewrite allows it")


def main() -> int:
    ports = {"DT_PUBLISH_A": free_port(), "DT_PUBLISH_B": free_port(), "DT_PUBLISH_DASHBOARD": free_port()}
    env = {**ENV, **{k: str(v) for k, v in ports.items()}, "DT_CLI": DT}
    if "DT_POSTGRES_IMAGE" not in os.environ:
        env["DT_POSTGRES_IMAGE"] = "localhost/dt-postgres-standin:15"
    ok = False
    t0 = time.monotonic()
    try:
        sh("bash", "scripts/containers.sh", "down", env=env, check=False)
        up = sh("bash", "scripts/containers.sh", "up", env=env, cwd=ROOT)
        log(f"group up in {time.monotonic() - t0:.1f}s: " + up.stdout.strip().replace("\n", "; "))
        a, b = ports["DT_PUBLISH_A"], ports["DT_PUBLISH_B"]
        group = f"http://127.0.0.1:{a},http://127.0.0.1:{b}"
        admin = sh("podman", "exec", container("coordinator-a"), "cat", "/var/lib/dt/state/admin.key").stdout.strip()
        api = ApiClient(group.split(","), admin)
        until("two workers", lambda: sum(w["state"] == "ready" for w in api.get("/api/v1/workers")["workers"]) == 2)
        user = {**env, "DT_COORDINATOR_URL": group, "DT_API_KEY": admin}
        code_key = sh(DT, "keys", "create", "--role", "submitter", "--allow-code", "--name", "tier", env=user).stdout.strip()

        # 1. benchmark, test, custom and bundle tasks through the group's address
        examples = json.loads((ROOT / "examples" / "tasks.json").read_text())
        sleeps = [{"task_id": f"sleep-{i:02d}", "type": "custom", "max_retries": 2,
                   "config": {"name": "sleep", "parameters": {"seconds": 1.5}}} for i in range(12)]
        submit(user, examples + sleeps)
        with tempfile.TemporaryDirectory() as top:
            proj = bundle_project(Path(top))
            submit({**user, "DT_API_KEY": code_key},
                   [{"task_id": "bundle-test", "type": "test", "config": {"test_file": "test_shipped.py"}}],
                   "--bundle", str(proj), "--no-env")
        ids = [t["task_id"] for t in examples + sleeps] + ["bundle-test"]
        log(f"submitted {len(ids)} tasks: {', '.join(t['type'] for t in examples)}, 12 sleeps, a bundle")

        # 2. stop the leader's container while they run
        def states() -> dict[str, dict[str, Any]]:
            return {t: api.get(f"/api/v1/tasks/{t}") for t in ids}
        until("tasks to run", lambda: sum(s["state"] in ("running", "succeeded") for s in states().values()) >= 4)
        leader = until("a leader", lambda: next((n for n, p in (("coordinator-a", a), ("coordinator-b", b))
                                                 if health(p).get("role") == "leader"), None))
        done = sum(s["state"] == "succeeded" for s in states().values())
        t_stop = time.monotonic()
        sh("podman", "stop", container(leader))
        log(f"stopped the leader's container {container(leader)} with {done} of {len(ids)} tasks done "
            f"({time.monotonic() - t_stop:.1f}s)")
        final = until("every task to end", lambda: (lambda s: s if all(v["state"] in FINAL for v in s.values())
                                                     else None)(states()), timeout=240)
        bad = {t: (s["state"], (s.get("outcome") or {}).get("error")) for t, s in final.items() if s["state"] != "succeeded"}
        twice = [t for t, s in final.items() if sum(h["to"] == "succeeded" for h in s["history"]) != 1]
        rows = {r[0]: int(r[1]) for r in psql("SELECT task_id, count(*) FROM results GROUP BY task_id")}
        reran = {t: rows.get(t, 0) for t in ids if rows.get(t, 0) != 1}
        if bad or twice or reran:
            raise SystemExit(f"tier: not every task finished exactly once: failed {bad}, outcomes != 1 {twice}, "
                             f"result rows != 1 {reran}")
        log(f"all {len(ids)} tasks succeeded once each across the leader's stop")
        sh("podman", "start", container(leader))

        # 3. `podman stop` of a worker lets its running task finish
        submit(user, [{"task_id": "drain-me", "type": "custom", "config": {"name": "sleep", "parameters": {"seconds": 4}}}])
        running = until("drain-me to run", lambda: (lambda s: s if s["state"] == "running" else None)(
            api.get("/api/v1/tasks/drain-me")))
        worker = running["worker_id"]
        sh("podman", "stop", container(worker))
        code = sh("podman", "inspect", "--format", "{{.State.ExitCode}}", container(worker)).stdout.strip()
        task = until("drain-me to end", lambda: (lambda s: s if s["state"] in FINAL else None)(
            api.get("/api/v1/tasks/drain-me")))
        if task["state"] != "succeeded" or task["attempt"] != 1 or task["worker_id"] != worker or code != "0":
            raise SystemExit(f"tier: podman stop of {worker} did not let drain-me finish: {task['state']}, attempt "
                             f"{task['attempt']} on {task['worker_id']}, exit code {code}")
        log(f"podman stop {container(worker)}: drain-me finished there (attempt 1), exit code 0")
        sh("podman", "start", container(worker))

        # 4. health checks and the workers' word on their confinement
        for service in ("coordinator-a", "coordinator-b", "dashboard", "worker-1", "worker-2"):
            until(f"{service} healthy", lambda s=service: sh("podman", "healthcheck", "run", container(s),
                                                             check=False).returncode == 0, timeout=60)
        for w in ("worker-1", "worker-2"):
            logs = sh("podman", "logs", container(w)).stderr + sh("podman", "logs", container(w)).stdout
            if "confinement:" not in logs:
                raise SystemExit(f"tier: {w} did not log its confinement")
        log("health checks pass; both workers logged their confinement")

        # 5. the seccomp profile script, for real: a Docker-like profile refuses the sandbox, its rewrite allows it
        seccomp_check()
        # 6. the size budget
        size = int(sh("podman", "image", "inspect", "--format", "{{.Size}}", os.environ.get(
            "DT_IMAGE", "localhost/distributed-testing:latest")).stdout.strip()) / 1e6
        if size > IMAGE_BUDGET_MB:
            raise SystemExit(f"tier: the image is {size:.0f} MB, over its budget of {IMAGE_BUDGET_MB} MB")
        log(f"image size {size:.0f} MB (budget {IMAGE_BUDGET_MB} MB)")
        ok = True
        return 0
    finally:
        if not ok:
            logs = BUILD / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            for service in ("postgres", "coordinator-a", "coordinator-b", "dashboard", "worker-1", "worker-2"):
                out = sh("podman", "logs", container(service), check=False)
                (logs / f"{service}.log").write_text(out.stdout + out.stderr)
            log(f"container logs in {logs}/")
        if "--keep" not in sys.argv:
            sh("bash", "scripts/containers.sh", "down", env=env, check=False, cwd=ROOT)
        log(f"tier checks took {time.monotonic() - t0:.1f}s")


if __name__ == "__main__":
    sys.exit(main())
