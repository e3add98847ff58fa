"""A coordinator group on PostgreSQL for the chaos suite: several ``run_coordinator.py`` processes on
one database, workers that know all of them (``--high-availability``), and a REST client that
follows the group (a standby answers 307 with the leader's address; a dead member is skipped).

``HaCluster`` extends ``ChaosCluster`` (workers, execution log, ``Tally``) with members: each has
its own port, log and ``--advertise-url``; ``leader()`` asks ``GET /api/v1/cluster``;
``kill_member``/``start_member`` SIGKILL and restart one. ``failover_times`` reads, from the tasks'
histories, the time from each kill to the next assignment anywhere in the group.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chaos_support import ChaosCluster

from distributed_testing.testing import Rest, free_port, start_coordinator_process, wait_until


class GroupRest(Rest):
    """``Rest`` over several coordinator URLs: a refused connection moves to the next member, a
    307 (a standby) or 503 is followed to the leader it names, up to ``timeout_s`` in all."""

    def __init__(self, urls: Sequence[str], key: str, timeout_s: float = 60.0) -> None:
        super().__init__(urls[0], key)
        self.urls = list(urls)
        self.budget_s = timeout_s

    def request(self, method: str, path: str, json: Any = None, params: Any = None,
                timeout: float | None = None) -> tuple[int, Any]:
        deadline = time.monotonic() + self.budget_s
        i = 0
        while True:
            base = self.urls[i % len(self.urls)]
            try:
                status, body = Rest(base, self.key, timeout or self.timeout).request(method, path, json, params)
            except OSError:
                status, body = 0, None
            if status in (307, 503) or status == 0:
                leader = body.get("leader") if isinstance(body, dict) else None
                if leader and leader not in self.urls:
                    self.urls.append(leader)
                if time.monotonic() > deadline:
                    return status, body
                if leader:
                    i = self.urls.index(leader)
                else:
                    i += 1
                    time.sleep(0.1)
                continue
            return status, body


class HaCluster(ChaosCluster):
    """``members`` coordinators on the PostgreSQL database ``db_url``."""

    def __init__(self, tmp: Path, db_url: str, members: int = 3) -> None:
        super().__init__(tmp)
        self.db_url = db_url
        self.ports = [free_port() for _ in range(members)]
        self.members: list[subprocess.Popen[bytes] | None] = [None] * members
        self.admin_key_file = tmp / "admin.key"
        self.kills: list[float] = []

    def member_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}"

    @property
    def urls(self) -> list[str]:
        return [self.member_url(i) for i in range(len(self.ports))]

    def start_member(self, i: int) -> None:
        log = self.tmp / f"coordinator{i}.log"
        self.members[i], _ = start_coordinator_process(
            self.procs, self.tmp / f"member{i}" / "c.db", port=self.ports[i], log=log,
            args=["--db-path", self.db_url, "--admin-key-file", str(self.admin_key_file),
                  "--advertise-url", self.member_url(i)])

    def start_group(self) -> None:
        for i in range(len(self.ports)):
            self.start_member(i)
        wait_until(self.admin_key_file.exists, 60, "the first leader to write the admin key")
        self.rest = GroupRest(self.urls, self.admin_key_file.read_text().strip())
        self._worker_key = self.rest.create_key("worker", "chaos")
        wait_until(lambda: self.leader() is not None, 60, "a leader")

    def leader(self) -> int | None:
        """The index of the member ``GET /api/v1/cluster`` names as leader (asked of every live one)."""
        for i, p in enumerate(self.members):
            if p is None or p.poll() is not None:
                continue
            try:
                status, body = Rest(self.member_url(i), self.api.key, 5).request("GET", "/api/v1/cluster")
            except OSError:
                continue
            if status == 200 and body.get("leader") in self.urls:
                j = self.urls.index(body["leader"])
                p2 = self.members[j]
                if p2 is not None and p2.poll() is None:
                    return j
        return None

    def kill_member(self, i: int) -> float:
        p = self.members[i]
        assert p is not None and p.poll() is None, f"member {i} is not running"
        p.kill()
        at = time.time()
        p.wait()
        self.kills.append(at)
        return at

    def add_ha_worker(self, worker_id: str, slots: int = 2) -> None:
        self.add_worker(worker_id, slots=slots, url=",".join(self.urls), extra=["--high-availability"])

    def failover_times(self, tasks: dict[str, dict[str, Any]]) -> list[float]:
        """For each kill, seconds from it to the first assignment after it (any task, any member)."""
        assigned = sorted(h["at"] for t in tasks.values() for h in t.get("history", []) if h["to"] == "assigned")
        out = []
        for k in self.kills:
            after = [a for a in assigned if a > k]
            if after:
                out.append(after[0] - k)
        return out

    def registrations(self) -> Any:
        raise NotImplementedError("a group has one log per member")
