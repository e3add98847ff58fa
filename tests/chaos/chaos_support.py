"""The chaos suite's cluster of real processes and its bookkeeping.

``ChaosCluster`` runs ``run_coordinator.py`` and ``run_worker_example.py`` processes (each worker
with its own ``--db-path`` and a stable ``--worker-id``, so a restart finds its outbox), talks to
the coordinator over REST, and can SIGKILL and restart either side. ``WorkerWatch`` polls
``GET /api/v1/workers`` from a thread to time how long the coordinator takes to mark a worker
disconnected. The ``netns`` fixture puts a worker in its own network namespace (``testing.netns.NetNs``) whose link
the test takes down and up. ``Tally.check`` compares the coordinator's tasks and results table with
the execution log the ``record`` handler writes (see ``chaos_handlers.py``), prints the figures
and returns them for the assertions.

Liveness flags are left at their defaults on purpose: the suite proves the defaults.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from distributed_testing.config import CoordinatorConfig
from distributed_testing.testing import Procs, Rest, start_coordinator_process, wait_until
from distributed_testing.testing.netns import NetNs

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TERMINAL = {"succeeded", "failed", "timed_out", "cancelled", "error"}
DEFAULTS = CoordinatorConfig()
TTL_S = DEFAULTS.worker_ttl_s


# ------------------------------------------------------------------------------ the plugin


def plugin_env(tmp: Path) -> dict[str, str]:
    """Environment for the worker processes (inherited by their pool children and device probe):

    - ``chaos_handlers.record`` is the custom handler ``chaos_record`` (and ``print_wait``
      ``chaos_print_wait``), through a ``.dist-info`` that declares the entry points;
    - ``torch`` and ``openvino`` fail to import, so the accelerator probe reports them unavailable
      in 0.2 s instead of importing them for 2-3 s of CPU at every one of the suite's ~20 worker
      starts (``flags_support.fast_hardware`` does the same in-process). The tasks here need neither;
    - ``DT_SANDBOX=none``: the handler appends to one executions log that every worker shares (the
      instrument that counts executions), outside any task's scratch directory, which the default
      confinement makes read-only; the confinement has tests of its own
      (tests/integration/bundles/test_confinement.py).
    """
    site = tmp / "plugin"
    dist = site / "dt_chaos_handlers-0.1.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: dt-chaos-handlers\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[distributed_testing.custom_handlers]\nchaos_record = chaos_handlers:record\n"
                                            "chaos_print_wait = chaos_handlers:print_wait\n")
    for hidden in ("torch", "openvino"):
        (site / hidden).mkdir(exist_ok=True)
        (site / hidden / "__init__.py").write_text(f"raise ImportError('{hidden} is hidden from the chaos suite workers')\n")
    paths = [str(site), str(HERE), *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])]
    return {"PYTHONPATH": os.pathsep.join(paths), "DT_SANDBOX": "none"}


def record_task(task_id: str, log: Path, seconds: float, *, max_retries: int, tags: Sequence[str] = (),
                burn: bool = False) -> dict[str, Any]:
    params: dict[str, Any] = {"log": str(log), "seconds": seconds}
    if burn:
        params["burn"] = True
    doc: dict[str, Any] = {"task_id": task_id, "type": "custom", "max_retries": max_retries,
                           "config": {"name": "chaos_record", "parameters": params}}
    if tags:
        doc["requirements"] = {"tags": list(tags)}
    return doc


# ------------------------------------------------------------------------------ processes


@dataclass
class WorkerProc:
    worker_id: str
    args: list[str]
    env: dict[str, str]
    prefix: list[str]
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0


class ChaosCluster:
    """A coordinator process and worker processes under one test's ``tmp``; ``close`` stops all."""

    def __init__(self, tmp: Path, *, host: str = "127.0.0.1") -> None:
        self.tmp = tmp
        self.host = host
        self.procs = Procs(tmp, cwd=ROOT)
        self.db = tmp / "coordinator" / "coordinator.duckdb"
        self.port = 0
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.coordinator_starts = 0
        self.workers: dict[str, WorkerProc] = {}
        self.env = plugin_env(tmp)
        self.exec_log = tmp / "executions.jsonl"
        self.rest: Rest | None = None
        self._worker_key = ""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def api(self) -> Rest:
        assert self.rest is not None, "coordinator not started"
        return self.rest

    def start_coordinator(self) -> None:
        self.coordinator, self.port = start_coordinator_process(
            self.procs, self.db, port=self.port, host=self.host, log=self.tmp / "coordinator.log")
        self.coordinator_starts += 1
        if self.rest is None:
            self.rest = Rest(self.url, (self.db.parent / "admin.key").read_text().strip())
            self._worker_key = self.rest.create_key("worker", "chaos")

    def kill_coordinator(self) -> float:
        assert self.coordinator is not None
        self.coordinator.kill()
        killed_at = time.time()
        self.coordinator.wait()
        return killed_at

    def add_worker(self, worker_id: str, *, slots: int = 2, tags: Sequence[str] = (), extra: Sequence[str] = (),
                   prefix: Sequence[str] = (), url: str | None = None) -> WorkerProc:
        args = ["run_worker_example.py", "--coordinator", url or self.url, "--api-key", self._worker_key,
                "--worker-id", worker_id, "--name", worker_id, "--db-path", str(self.tmp / worker_id / "worker.duckdb"),
                "--max-concurrent-tasks", str(slots), "--reconnect-interval", "0.2", "--reconnect-attempts", "1000",
                "--test-root", str(self.tmp), "--recover", *extra]
        if tags:
            args += ["--tags", ",".join(tags)]
        (self.tmp / worker_id).mkdir(exist_ok=True)
        w = WorkerProc(worker_id, args, {**self.env, "DT_CHAOS_WORKER": worker_id}, list(prefix))
        self.workers[worker_id] = w
        self.start_worker(worker_id)
        return w

    def start_worker(self, worker_id: str) -> None:
        w = self.workers[worker_id]
        w.proc = self.procs.start(w.args, self.tmp / f"{worker_id}.log", env=w.env, prefix=w.prefix)
        w.starts += 1

    def kill_worker(self, worker_id: str) -> float:
        p = self.workers[worker_id].proc
        assert p is not None and p.poll() is None, f"{worker_id} is not running"
        p.kill()
        killed_at = time.time()
        p.wait()
        return killed_at

    def check_alive(self) -> None:
        """Fail if a worker process exited although the test did not kill it."""
        for w in self.workers.values():
            assert w.proc is None or w.proc.poll() is None, f"{w.worker_id} exited: {self.log_tail(w.worker_id)}"

    def wait_registered(self, worker_ids: Sequence[str], timeout: float = 90.0) -> None:
        def up() -> bool:
            self.check_alive()
            try:
                listed = self.api.workers()
            except OSError:
                return False
            return all(listed.get(wid, {}).get("state") == "ready" for wid in worker_ids)

        wait_until(up, timeout, f"workers {', '.join(worker_ids)} to register", interval=0.1)

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"

    def log_times(self, name: str, needle: str, since: float) -> list[float]:
        """Epoch times of the lines of ``name``'s log that contain ``needle``, from ``since`` on
        (the log's timestamps have millisecond resolution)."""
        out = []
        for line in (self.tmp / f"{name}.log").read_text(errors="replace").splitlines():
            if needle in line:
                try:
                    at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                except ValueError:
                    continue
                if at >= since - 0.001:
                    out.append(at)
        return out

    def registrations(self) -> Counter[str]:
        """How many sessions each worker registered, from the coordinator's log (every start)."""
        counts: Counter[str] = Counter()
        for line in (self.tmp / "coordinator.log").read_text(errors="replace").splitlines():
            if " registered: " in line and "worker " in line:
                counts[line.split("worker ", 1)[1].split(" ", 1)[0]] += 1
        return counts

    def wait_terminal(self, ids: Sequence[str], timeout: float) -> dict[str, dict[str, Any]]:
        latest: dict[str, dict[str, Any]] = {}

        def done() -> bool:
            try:
                latest.update(self.api.tasks())
            except OSError:
                return False
            return all(latest.get(t, {}).get("state") in TERMINAL for t in ids)

        try:
            wait_until(done, timeout, f"{len(ids)} tasks to finish", interval=0.25)
        except TimeoutError as exc:
            states = Counter(latest.get(t, {}).get("state", "unknown") for t in ids)
            raise AssertionError(f"{exc}; states now {dict(states)}") from exc
        return {t: latest[t] for t in ids}

    def close(self) -> None:
        """Workers first (SIGTERM: a drain; nothing runs by now), then the coordinator."""
        for w in self.workers.values():
            if w.proc is not None:
                self.procs.stop(w.proc)
        self.procs.close()


# ------------------------------------------------------------------------------ detection


class WorkerWatch:
    """Polls ``GET /api/v1/workers`` every ``period`` s on a thread; keeps each worker's observed
    connected/disconnected transitions as ``(time.time(), connected)``."""

    def __init__(self, cluster: ChaosCluster, period: float = 0.05) -> None:
        self.cluster = cluster
        self.period = period
        self.transitions: dict[str, list[tuple[float, bool]]] = defaultdict(list)
        self.last: tuple[float, Any] = (0.0, None)  # (when, the last listing or error)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-worker-watch", daemon=True)

    def __enter__(self) -> WorkerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        rest = Rest(self.cluster.url, self.cluster.api.key, timeout=2.0)
        while not self._stop.wait(self.period):
            try:
                listed = rest.request("GET", "/api/v1/workers")[1]["workers"]
            except (OSError, KeyError, TypeError) as exc:
                self.last = (time.time(), exc)
                continue  # coordinator down or restarting
            now = time.time()
            self.last = (now, {w["worker_id"]: (w["state"], w["last_seen"]) for w in listed})
            for w in listed:
                connected = w["state"] != "disconnected"
                seen = self.transitions[w["worker_id"]]
                if not seen or seen[-1][1] != connected:
                    seen.append((now, connected))

    def connected(self, worker_id: str) -> bool:
        seen = self.transitions.get(worker_id) or [(0.0, False)]
        return seen[-1][1]

    def wait_disconnected(self, worker_id: str, since: float, timeout: float) -> float:
        """Seconds from ``since`` until the coordinator was seen marking ``worker_id`` disconnected."""
        def seen() -> float | None:
            return next((t for t, up in self.transitions.get(worker_id, []) if not up and t >= since), None)

        try:
            wait_until(lambda: seen() is not None, timeout, f"the coordinator to mark {worker_id} disconnected",
                       interval=0.02)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; last poll at {self.last[0] - since:+.2f}s: {self.last[1]}") from exc
        at = seen()
        assert at is not None
        return at - since

    def disconnects(self, worker_id: str) -> int:
        return sum(1 for _, up in self.transitions.get(worker_id, [])[1:] if not up)


# ------------------------------------------------------------------------------ netns


@pytest.fixture
def netns() -> Iterator[NetNs]:
    why = NetNs.unavailable()
    if why is not None:
        pytest.skip(why)
    with NetNs() as ns:
        yield ns


# ------------------------------------------------------------------------------ outcomes


@dataclass
class Tally:
    """What one scenario did, measured: printed by ``check`` and asserted by the test."""

    scenario: str
    submitted: int = 0
    completed: int = 0  # tasks whose outcome is "succeeded"
    lost: list[str] = field(default_factory=list)  # tasks without a succeeded outcome
    duplicate_outcomes: list[str] = field(default_factory=list)
    unbacked_outcomes: list[str] = field(default_factory=list)  # outcome without a matching execution and result row
    executions: int = 0  # lines in the execution log
    re_executed: int = 0  # tasks that ran more than once (at-least-once: allowed)
    superseded_results: int = 0  # result rows of attempts that did not become the outcome
    detections: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)  # as ``check`` read them, history included

    @property
    def max_detection(self) -> float | None:
        return max(self.detections) if self.detections else None

    def summary(self) -> str:
        det = "n/a" if self.max_detection is None else f"{self.max_detection:.3f}s"
        lines = [f"[chaos:{self.scenario}] submitted={self.submitted} completed={self.completed} "
                 f"lost={len(self.lost)} duplicate_outcomes={len(self.duplicate_outcomes)} "
                 f"max_detection={det}",
                 f"[chaos:{self.scenario}] executions={self.executions} re_executed_tasks={self.re_executed} "
                 f"superseded_results={self.superseded_results} unbacked_outcomes={len(self.unbacked_outcomes)}"
                 + (f" detections={[round(d, 3) for d in self.detections]}" if self.detections else "")]
        if self.extra:
            lines.append(f"[chaos:{self.scenario}] " + " ".join(f"{k}={v}" for k, v in self.extra.items()))
        for label, ids in (("lost", self.lost), ("duplicate", self.duplicate_outcomes),
                           ("unbacked", self.unbacked_outcomes)):
            if ids:
                lines.append(f"[chaos:{self.scenario}] {label}: {ids[:10]}{' ...' if len(ids) > 10 else ''}")
        return "\n".join(lines)

    def check(self, cluster: ChaosCluster, ids: Sequence[str], first: dict[str, dict[str, Any]]) -> Tally:
        """Fill the figures from the coordinator (tasks with history, results table) and the
        execution log. ``first``: the tasks as seen when they had all finished; a task whose
        outcome changed since then counts as a duplicate outcome. Prints the summary; the tasks
        read stay in ``tasks``."""
        api = cluster.api
        self.submitted = len(ids)
        with ThreadPoolExecutor(4) as pool:  # one request per task (the history): thousands, a few at once
            read = pool.map(lambda t: api.ok("GET", f"/api/v1/tasks/{t}", params={"result": "0"}), ids)
            self.tasks = tasks = dict(zip(ids, read, strict=True))
        wanted = set(ids)
        rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in api.results():
            if r["task_id"] in wanted:
                rows[r["task_id"]].append(r)
        runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
        if cluster.exec_log.exists():
            for line in cluster.exec_log.read_text().splitlines():
                run = json.loads(line)
                if run["task_id"] in wanted:
                    runs[run["task_id"]].append(run)
        self.executions = sum(len(v) for v in runs.values())
        self.re_executed = sum(1 for v in runs.values() if len(v) > 1)
        for tid in ids:
            t, out = tasks[tid], tasks[tid]["outcome"]
            if t["state"] != "succeeded":
                self.lost.append(f"{tid}:{t['state']}:{(out or {}).get('error')}")
                continue
            self.completed += 1
            terminal_moves = sum(1 for h in t["history"] if h["to"] in TERMINAL)
            per_attempt = Counter(r["attempt"] for r in rows[tid])
            if (terminal_moves != 1 or per_attempt[out["attempt"]] != 1
                    or (first.get(tid) or {}).get("outcome") != out):
                self.duplicate_outcomes.append(tid)
            self.superseded_results += sum(n for a, n in per_attempt.items() if a != out["attempt"])
            row_ok = any(r["attempt"] == out["attempt"] and r["worker_id"] == out["worker_id"]
                         and r["status"] == "succeeded" for r in rows[tid])
            ran_ok = any(r["attempt"] == out["attempt"] and r["worker"] == out["worker_id"] for r in runs[tid])
            if not (row_ok and ran_ok):
                self.unbacked_outcomes.append(tid)
        print("\n" + self.summary(), flush=True)
        return self

    def assert_clean(self) -> None:
        msg = self.summary()
        assert self.completed == self.submitted and not self.lost, msg
        assert not self.duplicate_outcomes, msg
        assert not self.unbacked_outcomes, msg


def quiesce(cluster: ChaosCluster, worker_ids: Sequence[str], settle_s: float = 2.0) -> None:
    """Wait until every worker is registered again (its outbox re-sent at registration), then a
    little longer for late resends to land."""
    cluster.wait_registered(worker_ids)
    time.sleep(settle_s)

