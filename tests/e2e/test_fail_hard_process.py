"""Real processes, real failures: a coordinator whose disk fills up stops (exit 3) and loses
nothing it acknowledged; operator mistakes (port in use, a database another coordinator or worker
holds) end a start with exit 2, one line on stderr and nothing created.

The full disk is a small tmpfs mounted for the test (root only; without it the test is skipped and
``tests/integration/cluster/test_fail_hard.py`` covers the same path with an injected failure).
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from distributed_testing.durable.journal import PREALLOCATE_BYTES
from distributed_testing.testing import Procs, Rest, hidden_accelerators, start_coordinator_process, wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)
NOOP = {"type": "custom", "config": {"name": "noop"}}



@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()}); test_fail_hard.py injects the failure")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte with one file; returns it."""
    filler = disk / "filler"
    chunk = b"\0" * (1 << 20)
    with open(filler, "wb", buffering=0) as f:
        for size in (1 << 20, 4096, 1):
            try:
                while True:
                    f.write(chunk[:size])
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    return filler




def start_worker(procs: Procs, url: str, key: str, *, db: Path, log: Path) -> subprocess.Popen[bytes]:
    return procs.start(["run_worker_example.py", "--coordinator", url, "--api-key", key, "--worker-id", "w1",
                        "--db-path", str(db), "--reconnect-interval", "0.2", "--reconnect-attempts", "100"],
                       log, env=hidden_accelerators(procs.tmp))


def test_a_full_disk_stops_the_coordinator_and_the_restart_loses_nothing_acknowledged(
        tmp_path: Path, small_disk: Path, procs: Procs) -> None:
    db = small_disk / "coordinator.duckdb"
    log = tmp_path / "coordinator.log"  # on the big disk: the coordinator must be able to say why it stopped
    coord, port = start_coordinator_process(procs, db, log=log)
    url = f"http://127.0.0.1:{port}"
    admin = Rest(url, (small_disk / "admin.key").read_text().strip())
    start_worker(procs, url, admin.create_key("worker"), db=tmp_path / "w1.duckdb", log=tmp_path / "worker.log")
    acknowledged = admin.submit([{**NOOP, "task_id": f"before-{i}"} for i in range(5)])
    for tid in acknowledged:
        assert admin.ok("GET", f"/api/v1/tasks/{tid}", params={"wait": 30})["state"] == "succeeded"
    results_before = {(r["task_id"], r["attempt"]) for r in admin.results()}
    assert len(results_before) == 5

    filler = fill(small_disk)
    # Small writes still land in the space the journal reserved ahead (PREALLOCATE_BYTES) ... unless
    # the checkpoint of the records before (due within a second) met the full disk first: the
    # coordinator then stops on that, and refuses this batch as it would the big one below.
    try:
        status, body = admin.request("POST", "/api/v1/tasks", json=[{**NOOP, "task_id": f"full-{i}"} for i in range(5)],
                                     timeout=30)
    except OSError:
        status, body = 0, {"error": "StoreError"}  # it had stopped already
    checkpoint_first = status not in (200, 201)
    if checkpoint_first:
        assert status in (0, 503) and body["error"] == "StoreError", (status, body)
    else:
        acknowledged += [t["task_id"] for t in body["tasks"]]
    # ... a submission bigger than that reserve meets the full disk.
    big = {**NOOP, "config": {"name": "noop", "parameters": {"blob": "x" * (PREALLOCATE_BYTES + (2 << 20))}}}
    for i in range(0 if checkpoint_first else 5):
        try:
            status, body = admin.request("POST", "/api/v1/tasks", json={**big, "task_id": f"big-{i}"}, timeout=30)
        except OSError:
            break  # the coordinator went away before answering
        if status in (200, 201):  # it fitted after all: it must survive the restart too
            acknowledged.append(f"big-{i}")
            continue
        assert status == 503 and body["error"] == "StoreError" and "No space left" in body["message"], (status, body)
        break
    assert coord.wait(60) == 3, log.read_text()[-3000:]
    text = log.read_text()
    assert "CRITICAL distributed_testing.coordinator.supervisor: fatal: " in text, text[-3000:]
    assert "No space left on device" in text, text[-3000:]
    assert "coordinator stopped after a fatal failure (exit status 3)" in text

    filler.unlink()  # the operator frees space and restarts it on the same files
    coord, port = start_coordinator_process(procs, db, log=log)
    admin = Rest(f"http://127.0.0.1:{port}", admin.key)
    tasks = admin.tasks()
    missing = [tid for tid in acknowledged if tid not in tasks]
    assert not missing, f"acknowledged but lost: {missing}"
    assert results_before <= {(r["task_id"], r["attempt"]) for r in admin.results()}
    # the worker reconnects on its own and runs the acknowledged tasks still waiting
    for tid in acknowledged:
        assert admin.ok("GET", f"/api/v1/tasks/{tid}", params={"wait": 60})["state"] == "succeeded", tid
    assert procs.stop(coord) == 0


def run_coordinator(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "run_coordinator.py", "--log-level", "WARNING", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def assert_one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_a_port_in_use_ends_the_start_with_one_line_and_creates_nothing(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        state = tmp_path / "state"
        done = run_coordinator(["--port", str(port), "--db-path", str(state / "c.duckdb")])
    assert done.returncode == 2
    line = assert_one_line(done.stderr)
    assert line.startswith("dt-coordinator: cannot listen on 127.0.0.1:") and "in use" in line, line
    assert not state.exists(), list(state.rglob("*"))  # no database, journal or admin.key


@pytest.mark.parametrize("host", ["999.1.1.1", "192.0.2.1"])  # does not resolve; not this machine's
def test_a_host_it_cannot_listen_on_with_port_0_creates_nothing(tmp_path: Path, host: str) -> None:
    """Port 0 can always be had, but not on any --host: the start is refused before the store opens."""
    state = tmp_path / "state"
    done = run_coordinator(["--host", host, "--port", "0", "--db-path", str(state / "c.duckdb")])
    assert done.returncode == 2
    line = assert_one_line(done.stderr)
    assert line.startswith("dt-coordinator: ") and host in line, line
    assert not state.exists(), list(state.rglob("*"))


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A read-only file system (root can write anywhere else): a tmpfs mounted ``ro``."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mnt)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here ({done.stderr.strip()})")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("where", ["--db-path", "--admin-key-file"])
def test_an_unwritable_state_directory_ends_the_start_with_one_line_and_creates_nothing(
        tmp_path: Path, read_only_dir: Path, where: str) -> None:
    db = read_only_dir / "state" / "c.duckdb" if where == "--db-path" else tmp_path / "state" / "c.duckdb"
    key = read_only_dir / "admin.key" if where == "--admin-key-file" else tmp_path / "admin.key"
    done = run_coordinator(["--port", "0", "--db-path", str(db), "--admin-key-file", str(key)])
    assert done.returncode == 2
    line = assert_one_line(done.stderr)
    assert line.startswith(f"dt-coordinator: {where} ") and "cannot write in" in line, line
    assert not db.parent.exists() and not key.exists()


def test_a_second_coordinator_on_the_same_database_is_refused(tmp_path: Path, procs: Procs) -> None:
    db = tmp_path / "c.duckdb"
    first, _ = start_coordinator_process(procs, db)
    done = run_coordinator(["--port", "0", "--db-path", str(db)])
    assert done.returncode == 2
    line = assert_one_line(done.stderr)
    assert str(db) in line and f"locked by another process (PID {first.pid})" in line, line
    assert first.poll() is None  # the running one is untouched


def test_a_second_worker_on_the_same_db_path_is_refused(tmp_path: Path, procs: Procs) -> None:
    db = tmp_path / "c.duckdb"
    _, port = start_coordinator_process(procs, db)
    url = f"http://127.0.0.1:{port}"
    admin = Rest(url, (tmp_path / "admin.key").read_text().strip())
    key = admin.create_key("worker")
    wdb = tmp_path / "w.duckdb"
    first = start_worker(procs, url, key, db=wdb, log=tmp_path / "worker.log")
    wait_until(lambda: "w1" in admin.workers(), 60, "the first worker to register")
    done = subprocess.run([sys.executable, "run_worker_example.py", "--log-level", "WARNING", "--coordinator", url,
                           "--api-key", key, "--worker-id", "w2", "--db-path", str(wdb)], cwd=ROOT,
                          env={**os.environ, **hidden_accelerators(tmp_path)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    line = assert_one_line(done.stderr)
    assert line.startswith(f"dt-worker: --db-path {wdb}: it is locked by another process (PID {first.pid})"), line
    assert "w2" not in admin.workers()
    # --reset-state would delete the running worker's outbox from under it: refused as well
    done = subprocess.run([sys.executable, "run_worker_example.py", "--log-level", "WARNING", "--coordinator", url,
                           "--api-key", key, "--worker-id", "w2", "--db-path", str(wdb), "--reset-state"], cwd=ROOT,
                          env={**os.environ, **hidden_accelerators(tmp_path)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    line = assert_one_line(done.stderr)
    assert line.startswith(f"dt-worker: --reset-state: --db-path {wdb}: it is locked by another process"), line
    assert wdb.exists() and first.poll() is None
