"""The real ``run_coordinator.py`` process: --host, --port, --port-file, --db-path (a DuckDB file,
memory:// or postgresql://), --admin-key-file, --log-level and DT_COORDINATOR_HOST / _PORT / _DB,
DT_ADMIN_KEY_FILE, DT_EVENT_LOOP."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from flags_support import ROOT, Procs, free_port

pytestmark = pytest.mark.timeout(120)
COORDINATOR = str(ROOT / "run_coordinator.py")
ENV_VARS = ["DT_COORDINATOR_HOST", "DT_COORDINATOR_PORT", "DT_COORDINATOR_DB", "DT_ADMIN_KEY_FILE"]


def loopback_alias_available(host: str) -> bool:
    try:
        with socket.socket() as s:
            s.bind((host, 0))
        return True
    except OSError:
        return False


needs_loopback_aliases = pytest.mark.skipif(
    not (loopback_alias_available("127.0.0.2") and loopback_alias_available("127.0.0.3")),
    reason="127.0.0.2/127.0.0.3 are not usable loopback addresses here")


def start(procs: Procs, args: Sequence[str], log: Path, port_file: Path,
          env: Mapping[str, str] | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """Start the coordinator and wait for it to write ``port_file``; returns (process, port)."""
    port_file.unlink(missing_ok=True)
    p = procs.start([COORDINATOR, *args, "--port-file", str(port_file)], log, env=env,
                    drop_env=[v for v in ENV_VARS if v not in (env or {})])
    deadline = time.monotonic() + 60
    while not port_file.exists():
        assert p.poll() is None, f"coordinator exited with {p.returncode}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no port file after 60 s:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)
    return p, int(port_file.read_text())


def call(url: str, key: str | None = None, body: Any = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def refuses(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
        return False
    except ConnectionRefusedError:
        return True


TASK = {"task_id": "persisted-1", "type": "custom", "config": {"name": "noop"}}


@needs_loopback_aliases
def test_host_port_zero_port_file_default_admin_key_and_log_level(tmp_path: Path, procs: Procs) -> None:
    db, log = tmp_path / "db" / "coordinator.duckdb", tmp_path / "coordinator.log"
    p, port = start(procs, ["--host", "127.0.0.2", "--port", "0", "--db-path", str(db), "--log-level", "WARNING"],
                    log, tmp_path / "port")
    assert port > 0  # --port 0 bound some free port and --port-file says which
    assert call(f"http://127.0.0.2:{port}/healthz")[0] == 200
    assert refuses("127.0.0.1", port), "--host 127.0.0.2 should not listen on 127.0.0.1"
    admin_key = db.parent / "admin.key"  # no --admin-key-file: beside the database
    assert admin_key.read_text().startswith("dtk_") and admin_key.stat().st_mode & 0o777 == 0o600
    assert Procs.stop(p) == 0
    text = log.read_text()
    assert " WARNING distributed_testing.coordinator.server: empty store: created admin key" in text
    assert " INFO " not in text and "coordinator listening" not in text


@needs_loopback_aliases
def test_variables_set_host_port_database_and_admin_key_file(tmp_path: Path, procs: Procs) -> None:
    port, log = free_port(), tmp_path / "coordinator.log"
    env = {"DT_COORDINATOR_HOST": "127.0.0.3", "DT_COORDINATOR_PORT": str(port),
           "DT_COORDINATOR_DB": str(tmp_path / "envdb" / "c.duckdb"), "DT_ADMIN_KEY_FILE": str(tmp_path / "keys" / "env.key")}
    p, bound = start(procs, [], log, tmp_path / "port", env=env)
    assert bound == port
    key = (tmp_path / "keys" / "env.key").read_text().strip()
    assert (tmp_path / "keys" / "env.key").stat().st_mode & 0o777 == 0o600
    assert call(f"http://127.0.0.3:{port}/api/v1/tasks", key, TASK)[0] == 201
    assert refuses("127.0.0.1", port)
    assert Procs.stop(p) == 0
    assert (tmp_path / "envdb" / "c.duckdb").exists()
    assert not (tmp_path / "state").exists(), "the default state/ directory was used despite DT_COORDINATOR_DB"
    assert f" INFO distributed_testing.cli.coordinator: coordinator listening on http://127.0.0.3:{port}" in log.read_text()


def test_flags_win_over_coordinator_variables(tmp_path: Path, procs: Procs) -> None:
    env = {"DT_COORDINATOR_HOST": "256.0.0.1", "DT_COORDINATOR_PORT": "1", "DT_COORDINATOR_DB": str(tmp_path / "env.duckdb"),
           "DT_ADMIN_KEY_FILE": str(tmp_path / "env.key")}
    p, port = start(procs, ["--host", "127.0.0.1", "--port", "0", "--db-path", str(tmp_path / "flag.duckdb"),
                            "--admin-key-file", str(tmp_path / "flag.key")], tmp_path / "c.log", tmp_path / "port", env=env)
    assert call(f"http://127.0.0.1:{port}/healthz")[0] == 200
    assert Procs.stop(p) == 0
    assert (tmp_path / "flag.duckdb").exists() and (tmp_path / "flag.key").exists()
    assert not (tmp_path / "env.duckdb").exists() and not (tmp_path / "env.key").exists()


def test_db_file_keeps_state_across_a_restart_and_admin_key_is_written_once(tmp_path: Path, procs: Procs) -> None:
    port = free_port()
    key_file = tmp_path / "secret" / "admin.key"
    args = ["--port", str(port), "--db-path", str(tmp_path / "state" / "c.duckdb"), "--admin-key-file", str(key_file)]
    p, bound = start(procs, args, tmp_path / "first.log", tmp_path / "port")
    assert bound == port
    assert key_file.stat().st_mode & 0o777 == 0o600
    key, first_stat = key_file.read_text().strip(), key_file.stat()
    assert call(f"http://127.0.0.1:{port}/api/v1/tasks", key, TASK)[0] == 201
    assert Procs.stop(p) == 0

    p, _ = start(procs, args, tmp_path / "second.log", tmp_path / "port")
    again = key_file.stat()
    assert key_file.read_text().strip() == key
    assert (again.st_ino, again.st_mtime_ns) == (first_stat.st_ino, first_stat.st_mtime_ns), "admin key rewritten"
    status, task = call(f"http://127.0.0.1:{port}/api/v1/tasks/persisted-1", key)
    assert status == 200 and task["state"] == "pending"
    assert "created admin key" not in (tmp_path / "second.log").read_text()


def test_memory_db_forgets_tasks_and_keys_on_restart(tmp_path: Path, procs: Procs) -> None:
    key_file = tmp_path / "admin.key"
    args = ["--port", "0", "--db-path", "memory://", "--admin-key-file", str(key_file)]
    p, port = start(procs, args, tmp_path / "first.log", tmp_path / "port")
    old_key = key_file.read_text().strip()
    assert call(f"http://127.0.0.1:{port}/api/v1/tasks", old_key, TASK)[0] == 201
    assert Procs.stop(p) == 0

    p, port = start(procs, args, tmp_path / "second.log", tmp_path / "port")
    new_key = key_file.read_text().strip()
    assert new_key != old_key  # an empty store bootstraps a fresh admin key
    assert call(f"http://127.0.0.1:{port}/api/v1/tasks/persisted-1", old_key)[0] == 401
    assert call(f"http://127.0.0.1:{port}/api/v1/tasks/persisted-1", new_key)[0] == 404
    assert not any(tmp_path.glob("**/*.duckdb")), "memory:// wrote a database file"


def test_postgresql_db_keeps_state_across_a_restart(tmp_path: Path, procs: Procs, pg_url: str) -> None:
    """``DT_COORDINATOR_DB=postgresql://...``: the state lives in the database, nothing on disk
    but the admin key and signing secret files named."""
    import asyncio

    import asyncpg

    key_file = tmp_path / "admin.key"
    args = ["--port", "0", "--admin-key-file", str(key_file), "--jwt-secret-file", str(tmp_path / "jwt.secret")]
    env = {"DT_COORDINATOR_DB": pg_url}
    p, port = start(procs, args, tmp_path / "first.log", tmp_path / "port", env=env)
    key = key_file.read_text().strip()
    assert call(f"http://127.0.0.1:{port}/api/v1/tasks", key, TASK)[0] == 201
    assert Procs.stop(p) == 0

    p, port = start(procs, args, tmp_path / "second.log", tmp_path / "port", env=env)
    assert key_file.read_text().strip() == key
    status, task = call(f"http://127.0.0.1:{port}/api/v1/tasks/persisted-1", key)
    assert status == 200 and task["state"] == "pending"
    assert not any(tmp_path.glob("**/*.duckdb")) and not (tmp_path / "state").exists()

    async def stored() -> list[Any]:
        con = await asyncpg.connect(pg_url)
        try:
            return [tuple(r) for r in await con.fetch("SELECT task_id, state FROM tasks")]
        finally:
            await con.close()

    assert asyncio.run(stored()) == [("persisted-1", "pending")]


@pytest.mark.parametrize("choice", ["asyncio", "uvloop", ""])
def test_event_loop_variable_picks_the_loop(tmp_path: Path, procs: Procs, choice: str) -> None:
    """DT_EVENT_LOOP=asyncio runs asyncio's own loop, =uvloop (and unset) uvloop, installed with the package."""
    log = tmp_path / "c.log"
    p, port = start(procs, ["--port", "0", "--db-path", "memory://", "--admin-key-file", str(tmp_path / "k"),
                            "--log-level", "INFO"], log, tmp_path / "port", env={"DT_EVENT_LOOP": choice})
    assert call(f"http://127.0.0.1:{port}/healthz")[0] == 200
    assert Procs.stop(p) == 0
    assert f" INFO distributed_testing.process.aio: event loop: {choice or 'uvloop'}" in log.read_text()


@pytest.mark.parametrize("launcher", ["run_coordinator.py", "run_worker_example.py"])
def test_an_unknown_event_loop_is_refused_at_start(tmp_path: Path, procs: Procs, launcher: str) -> None:
    log = tmp_path / "out.log"
    p = procs.start([str(ROOT / launcher), "--db-path", str(tmp_path / "x.duckdb")], log, env={"DT_EVENT_LOOP": "trio"})
    assert p.wait(60) == 2
    assert "DT_EVENT_LOOP='trio': expected one of auto, uvloop, asyncio" in log.read_text()
