"""A PostgreSQL server of the test's own, for tests that stop and restart the database itself.

The shared server on 127.0.0.1:5432 belongs to every test and to the machine; a test that restarts
PostgreSQL under load needs its own: ``initdb`` into a fresh directory, ``pg_ctl`` on a free
loopback port, trust authentication, stopped and deleted at the end. PostgreSQL refuses to run as
root, so when the tests run as root the server runs as the ``postgres`` user (``runuser``) from a
directory under ``/tmp`` that user owns (pytest's own temporary directories are 0700 to root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from distributed_testing.testing import free_port


def _bindir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` are: ``pg_config --bindir``, else ``initdb`` on PATH."""
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True, timeout=10)
        d = Path(out.stdout.strip())
        if (d / "initdb").exists():
            return d
    except (OSError, subprocess.SubprocessError):
        pass
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


def why_unavailable() -> str | None:
    """None when a private server can be started here, else why not (for ``pytest.skip``)."""
    if _bindir() is None:
        return "PostgreSQL's initdb/pg_ctl are not installed"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: PostgreSQL refuses to run as root"
    return None


class PrivatePostgres:
    """One private server: ``start``, ``stop(mode)``, ``restart``; ``url(db)`` to connect."""

    def __init__(self, root: Path, port: int) -> None:
        bindir = _bindir()
        assert bindir is not None, why_unavailable()
        self.bindir = bindir
        self.root = root
        self.data = root / "data"
        self.port = port
        self.log = root / "server.log"

    def _run(self, *argv: str, timeout: float = 60.0) -> None:
        cmd = [str(self.bindir / argv[0]), *argv[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, timeout=timeout, capture_output=True, cwd=self.root)

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync")

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """``fast`` (clean), or ``immediate`` (as a crash: recovery from the WAL at the next start)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    def create_database(self, name: str) -> str:
        subprocess.run([str(self.bindir / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                        "-v", "ON_ERROR_STOP=1", "-c", f'CREATE DATABASE "{name}"'],
                       check=True, timeout=30, capture_output=True)
        return self.url(name)


@contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """A started private server, stopped (immediately) and deleted afterwards."""
    root = Path(tempfile.mkdtemp(prefix="dt-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    server = PrivatePostgres(root, free_port())
    try:
        server.init()
        server.start()
        yield server
    finally:
        try:
            server.stop("immediate")
        except (OSError, subprocess.SubprocessError):
            pass
        shutil.rmtree(root, ignore_errors=True)
