"""Secrets at rest, attacked as a local user would: the real ``run_coordinator.py`` process, its
state files read by user ``nobody`` (a forked child that dropped root) and by a holder of a copy
of the database, and admin JWTs forged with everything hex-shaped found there. Also the move of an
old database's secret into its file, rotation with --rotate-jwt-secret, and --jwt-secret-file /
DT_JWT_SECRET_FILE."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from security_support import can_impersonate, forge_admin_token, read_all, read_as_nobody, secret_candidates

from distributed_testing.coordinator.core.rows import MetaRow
from distributed_testing.coordinator.runtime import key_row
from distributed_testing.coordinator.store.duckdb import DuckDBStore
from distributed_testing.security import generate_key, issue_token, parse_key
from distributed_testing.security.roles import Role
from distributed_testing.testing import Procs, Rest, start_coordinator_process

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[3]
COORDINATOR = str(ROOT / "run_coordinator.py")
STATE_NAMES = {"c.duckdb", "c.duckdb.wal", "admin.key", "jwt.secret"}



@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every local user may enter (0755), as /srv or /var/lib are; pytest's own
    tmp_path is 0700 and would hide everything from the attacker whatever the file modes."""
    d = Path(tempfile.mkdtemp(prefix="dt-secrets-"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def forged_admin_works(base_url: str, candidates: set[bytes], admin_key_id: str) -> list[bytes]:
    """The candidate secrets whose forged admin JWT the coordinator accepts (lists the keys)."""
    return [s for s in candidates
            if Rest(base_url, forge_admin_token(s, admin_key_id)).request("GET", "/api/v1/keys")[0] == 200]


def state_files(state: Path) -> list[Path]:
    return [p for p in state.rglob("*") if p.is_file() and p.suffix not in (".log", ".port")]


@pytest.mark.skipif(not can_impersonate(), reason="reading as another local user needs root to drop to nobody")
@pytest.mark.parametrize("dir_made_by", ["coordinator", "operator"])
def test_a_local_user_cannot_forge_an_admin_token_from_the_state_files(
        procs: Procs, shared: Path, dir_made_by: str) -> None:
    state = shared / "state"
    if dir_made_by == "operator":
        state.mkdir(mode=0o755)  # an operator's mkdir with the usual umask: listable by everyone
    db = state / "c.duckdb"
    p, port = start_coordinator_process(procs, db, make_dir=False)
    url = f"http://127.0.0.1:{port}"
    admin = (state / "admin.key").read_text().strip()
    rest = Rest(url, admin)
    rest.submit({"type": "custom", "config": {"name": "noop"}})  # something in the journal and the database
    time.sleep(1.5)  # one checkpoint interval: the records reach the DuckDB file (and its WAL) too

    stolen = read_as_nobody(shared)
    assert forged_admin_works(url, secret_candidates(stolen), parse_key(admin)) == []
    assert not {Path(f).name for f in stolen} & STATE_NAMES, f"nobody read {sorted(stolen)}"
    assert not any(".journal" in f for f in stolen), f"nobody read {sorted(stolen)}"

    assert mode(state) == (0o700 if dir_made_by == "coordinator" else 0o755)
    for f in state_files(state):
        assert mode(f) == 0o600, f"{f} has mode {mode(f):04o}"
    for d in (p for p in state.rglob("*") if p.is_dir()):
        assert mode(d) == 0o700, f"{d} has mode {mode(d):04o}"
    assert procs.stop(p) == 0


def test_a_copy_of_the_database_holds_no_signing_secret(procs: Procs, tmp_path: Path) -> None:
    """Whoever gets the database and its journal (a backup, a shared volume) still cannot sign."""
    db = tmp_path / "state" / "c.duckdb"
    p, port = start_coordinator_process(procs, db, make_dir=False)
    admin = (db.parent / "admin.key").read_text().strip()
    assert procs.stop(p) == 0  # final checkpoint: everything is in the DuckDB file
    copy = {k: v for k, v in read_all(db.parent).items() if Path(k).name not in ("jwt.secret", "admin.key")}
    assert any(Path(k).name == "c.duckdb" for k in copy), sorted(copy)
    p, port = start_coordinator_process(procs, db, make_dir=False)
    assert forged_admin_works(f"http://127.0.0.1:{port}", secret_candidates(copy), parse_key(admin)) == []
    secret = bytes.fromhex((db.parent / "jwt.secret").read_text().strip())
    assert not any(secret.hex().encode() in data or secret in data for data in copy.values())


def make_old_database(db: Path, secret: bytes) -> tuple[str, str]:
    """A database as versions before the secret file left it: the secret in ``meta``. Returns an
    admin key and a JWT signed with that secret."""
    async def build() -> tuple[str, str]:
        store = DuckDBStore(db)
        await store.open()
        plaintext, rec = generate_key(Role.ADMIN, "old-admin", time.time())
        await store.append([key_row(rec), MetaRow("jwt_secret", secret.hex())])
        await store.close()
        token, _ = issue_token(secret, rec, time.time(), ttl_s=600)
        return plaintext, token

    return asyncio.run(build())


def test_an_old_databases_secret_moves_to_its_file_and_leaves_the_database(procs: Procs, tmp_path: Path) -> None:
    db = tmp_path / "state" / "c.duckdb"
    db.parent.mkdir()
    secret = os.urandom(32)
    admin, old_jwt = make_old_database(db, secret)
    p, port = start_coordinator_process(procs, db)
    assert (db.parent / "jwt.secret").read_text().strip() == secret.hex()
    assert mode(db.parent / "jwt.secret") == 0o600
    assert Rest(f"http://127.0.0.1:{port}", old_jwt).request("GET", "/api/v1/keys")[0] == 200  # tokens live on
    assert procs.stop(p) == 0
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT key FROM meta").fetchall() == []
    p, port = start_coordinator_process(procs, db)  # and the next start reads the file
    assert Rest(f"http://127.0.0.1:{port}", old_jwt).request("GET", "/api/v1/keys")[0] == 200
    assert Rest(f"http://127.0.0.1:{port}", admin).request("GET", "/api/v1/keys")[0] == 200


def rotate(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, COORDINATOR, "--rotate-jwt-secret", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def test_rotate_jwt_secret_refuses_old_tokens_and_keeps_api_keys(procs: Procs, tmp_path: Path) -> None:
    db = tmp_path / "state" / "c.duckdb"
    p, port = start_coordinator_process(procs, db, make_dir=False)
    admin = (db.parent / "admin.key").read_text().strip()
    status, body = Rest(f"http://127.0.0.1:{port}", admin).request("POST", "/api/v1/auth/token")
    assert status == 200, body
    old_jwt = body["token"]
    before = (db.parent / "jwt.secret").read_text()
    assert procs.stop(p) == 0

    done = rotate(["--db-path", str(db)])
    assert done.returncode == 0, done.stderr
    assert "rotated the token-signing secret" in done.stderr
    assert (db.parent / "jwt.secret").read_text() != before
    assert mode(db.parent / "jwt.secret") == 0o600

    p, port = start_coordinator_process(procs, db, make_dir=False)
    url = f"http://127.0.0.1:{port}"
    status, body = Rest(url, old_jwt).request("GET", "/api/v1/keys")
    assert status == 401 and "signature" in body["message"], body
    status, body = Rest(url, admin).request("POST", "/api/v1/auth/token")
    assert status == 200, body
    assert Rest(url, body["token"]).request("GET", "/api/v1/keys")[0] == 200


def test_rotate_jwt_secret_without_a_secret_file_is_refused() -> None:
    done = rotate(["--db-path", "memory://"])
    assert done.returncode == 2
    assert "--rotate-jwt-secret" in done.stderr and "Traceback" not in done.stderr


def test_jwt_secret_file_flag_and_variable_place_the_secret(procs: Procs, tmp_path: Path) -> None:
    db = tmp_path / "state" / "c.duckdb"
    by_var = tmp_path / "secrets" / "by-var"
    p, port = start_coordinator_process(procs, db, make_dir=False, env={"DT_JWT_SECRET_FILE": str(by_var)})
    assert mode(by_var) == 0o600 and mode(by_var.parent) == 0o700
    assert not (db.parent / "jwt.secret").exists()
    admin = (db.parent / "admin.key").read_text().strip()
    status, body = Rest(f"http://127.0.0.1:{port}", admin).request("POST", "/api/v1/auth/token")
    assert status == 200, body
    assert procs.stop(p) == 0

    by_flag = tmp_path / "by-flag"  # the flag wins over the variable: a new secret, the old token dies
    done = rotate(["--db-path", str(db), "--jwt-secret-file", str(by_flag)], env={"DT_JWT_SECRET_FILE": str(by_var)})
    assert done.returncode == 0 and by_flag.exists(), done.stderr
    p, port = start_coordinator_process(procs, db, make_dir=False, args=["--jwt-secret-file", str(by_flag)],
                                        env={"DT_JWT_SECRET_FILE": str(by_var)})
    assert Rest(f"http://127.0.0.1:{port}", body["token"]).request("GET", "/api/v1/keys")[0] == 401
    assert Rest(f"http://127.0.0.1:{port}", admin).request("GET", "/api/v1/keys")[0] == 200
