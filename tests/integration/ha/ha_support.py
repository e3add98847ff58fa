"""A coordinator group of real processes on a private PostgreSQL database, with real workers.

``HaGroup(tmp, dsn)`` starts ``run_coordinator.py`` members (each on its own port, all on ``dsn``,
one shared ``--admin-key-file``) and ``run_worker_example.py`` workers, reads each member's
``GET /api/v1/health``, and stops everything at ``close``. Workers hide torch and openvino (the
accelerator probe then answers in moments instead of importing them at every start)."""

from __future__ import annotations

import json
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distributed_testing.testing import Procs, Rest, hidden_accelerators, run_sync, wait_until

ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Member:
    name: str
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def health(self) -> dict[str, Any] | None:
        """``GET /api/v1/health``, or None while it does not answer."""
        try:
            with urllib.request.urlopen(self.url + "/api/v1/health", timeout=5) as r:
                return dict(json.loads(r.read()))
        except (OSError, ValueError):
            return None

    def role(self) -> str | None:
        h = self.health()
        return None if h is None else str(h["role"])

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class HaGroup:
    def __init__(self, tmp: Path, dsn: str) -> None:
        self.tmp = tmp
        self.dsn = dsn
        self.procs = Procs(tmp, cwd=ROOT)
        self.members: dict[str, Member] = {}
        self.admin_file = tmp / "admin.key"
        self.env = hidden_accelerators(tmp)

    def start_member(self, name: str, *extra: str, env: dict[str, str] | None = None) -> Member:
        port_file = self.tmp / f"{name}.port"
        log = self.tmp / f"{name}.log"
        p = self.procs.start(["run_coordinator.py", "--host", "127.0.0.1", "--port", "0", "--db-path", self.dsn,
                              "--port-file", str(port_file), "--admin-key-file", str(self.admin_file), *extra], log,
                             env=env)

        def listening() -> bool:
            if p.poll() is not None:
                raise AssertionError(f"member {name} exited with {p.returncode}: {log.read_text()[-3000:]}")
            return port_file.exists()

        wait_until(listening, 30, f"member {name} to listen")
        member = Member(name, p, f"http://127.0.0.1:{int(port_file.read_text())}", log)
        self.members[name] = member
        return member

    def wait_role(self, member: Member, role: str, timeout: float = 30.0) -> dict[str, Any]:
        wait_until(lambda: member.role() == role, timeout, f"{member.name} to be {role}")
        health = member.health()
        assert health is not None
        return health

    def admin(self, member: Member) -> Rest:
        wait_until(self.admin_file.exists, 30, "the first leader to write the admin key")
        return Rest(member.url, self.admin_file.read_text().strip())

    def start_worker(self, worker_id: str, urls: list[str], key: str, *extra: str) -> subprocess.Popen[bytes]:
        key_file = self.tmp / f"{worker_id}.key"
        key_file.write_text(key)
        return self.procs.start(["run_worker_example.py", "--coordinator", ",".join(urls), "--api-key-file",
                                 str(key_file), "--worker-id", worker_id, "--name", worker_id, "--test-root",
                                 str(self.tmp), *extra], self.tmp / f"{worker_id}.log", env=self.env)

    @staticmethod
    def kill(member: Member) -> float:
        member.proc.send_signal(signal.SIGKILL)
        at = time.time()
        member.proc.wait()
        return at

    def close(self) -> None:
        for m in self.members.values():
            if m.proc.poll() is None:
                m.proc.send_signal(signal.SIGCONT)  # a paused one must be able to stop
        self.procs.close()


def request(url: str, method: str = "GET", key: str | None = None, body: Any = None, *,
            context: ssl.SSLContext | None = None, timeout: float = 10) -> tuple[int, dict[str, str], Any]:
    """(status, headers, JSON body) without following redirects; https verified with ``context``."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={**({"Authorization": f"Bearer {key}"} if key else {}),
                                          **({"Content-Type": "application/json"} if data else {})})
    try:
        with urllib.request.build_opener(NoRedirect, urllib.request.HTTPSHandler(context=context)).open(
                req, timeout=timeout) as r:
            return r.status, dict(r.headers), json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read() or b"null")



def db_tasks(dsn: str) -> dict[str, dict[str, Any]]:
    """Every task row as the database holds it (``state``, ``history``, ``outcome``): the truth a
    takeover starts from, whatever a member keeps in memory."""
    async def read() -> list[Any]:
        import asyncpg

        conn = await asyncpg.connect(dsn)
        try:
            return list(await conn.fetch("SELECT task_id, state, history::text AS h, outcome::text AS o FROM tasks"))
        finally:
            await conn.close()

    return {r["task_id"]: {"state": r["state"], "history": json.loads(r["h"]), "outcome": json.loads(r["o"] or "null")}
            for r in run_sync(read())}
