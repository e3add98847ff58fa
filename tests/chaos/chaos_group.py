"""A coordinator group on PostgreSQL for the chaos suite: several ``run_coordinator.py`` processes on
one database, workers that know all of them (``--high-availability``), and a REST client that
works with the group through the one client (any member answers: a standby forwards to the leader;
a dead, paused or leaderless member is skipped).

``HaCluster`` extends ``ChaosCluster`` (workers, execution log, ``Tally``) with members: each has
its own port, log and ``--advertise-url``; ``leader()`` asks ``GET /api/v1/cluster``;
``kill_member``/``start_member`` SIGKILL and restart one, ``pause_member``/``resume_member`` SIGSTOP
and SIGCONT one, ``cut_member``/``restore_member`` take its network link down and up (members in
network namespaces). Each kill, pause and cut is recorded in ``disruptions``; ``next_task_times`` reads,
from the tasks' histories, the time from each disruption to each worker's next assignment.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from chaos_support import ChaosCluster

from distributed_testing.client import ApiClient, ApiError
from distributed_testing.testing import (
    Rest,
    RoundRobinProxy,
    free_port,
    pg_database_sync,
    start_coordinator_process,
    wait_until,
)
from distributed_testing.testing.netns import NetNs


class GroupRest(Rest):
    """``Rest`` over several coordinator URLs through the one client (``distributed_testing.client.
    ApiClient``): any member answers (a standby forwards to the leader); a 503 without a leader, a
    refused or silent member moves to the next one, up to ``timeout_s`` in all. A GET, or a
    submission whose tasks all carry a ``task_id``, is asked again of another member when its
    answer was lost. The final answer comes back as ``(status, body)`` (``ApiClient.call``), and
    ``(0, {"error": message})`` when no member answered within ``timeout_s``."""

    def __init__(self, urls: Sequence[str], key: str, timeout_s: float = 60.0) -> None:
        super().__init__(urls[0], key)
        self.client = ApiClient(list(urls), key, timeout_s=10.0, failover_s=timeout_s)  # a loaded 2-core machine

    @property
    def urls(self) -> list[str]:
        return self.client.urls

    def request(self, method: str, path: str, json: Any = None, params: Any = None,
                timeout: float | None = None) -> tuple[int, Any]:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            return self.client.call(method, path + query, json, repeatable=_repeatable(method, path, json),
                                    timeout_s=timeout)
        except ApiError as exc:
            return exc.status, {"error": str(exc)}


def _repeatable(method: str, path: str, body: Any) -> bool:
    if method == "GET":
        return True
    tasks = body if isinstance(body, list) else [body]
    return method == "POST" and path == "/api/v1/tasks" and all(isinstance(t, dict) and t.get("task_id") for t in tasks)


class HaCluster(ChaosCluster):
    """``members`` coordinators on the PostgreSQL database ``db_url``.

    With ``namespaces`` (one ``NetNs`` per member) member ``i`` runs inside namespace ``i``, so
    ``cut_member`` can take its link down: it then reaches nothing and nothing reaches it. Relays
    in the root namespace (``RoundRobinProxy`` with one target) on that namespace's ``host_addr``
    carry its traffic: one to PostgreSQL (which listens on the root namespace's loopback), one to
    its API, which is the URL it advertises and workers and the other members use."""

    def __init__(self, tmp: Path, db_url: str, members: int = 3, namespaces: Sequence[NetNs] = ()) -> None:
        super().__init__(tmp)
        self.db_url = db_url
        self.ports = [free_port() for _ in range(members)]
        self.members: list[subprocess.Popen[bytes] | None] = [None] * members
        self.admin_key_file = tmp / "admin.key"
        self.kills: list[float] = []
        self.disruptions: list[tuple[str, float]] = []  # ("kill" | "pause" | "cut", when)
        self.paused: set[int] = set()
        self.namespaces = list(namespaces)
        assert not self.namespaces or len(self.namespaces) == members
        self.relays: list[RoundRobinProxy] = []
        db = urllib.parse.urlsplit(db_url)
        for i, ns in enumerate(self.namespaces):
            ns.route_default()
            self.relays += [RoundRobinProxy([(db.hostname or "127.0.0.1", db.port or 5432)], host=ns.host_addr),
                            RoundRobinProxy([(ns.ns_addr, self.ports[i])], host=ns.host_addr)]

    def member_url(self, i: int) -> str:
        if self.namespaces:
            return self.relays[2 * i + 1].url
        return f"http://127.0.0.1:{self.ports[i]}"

    @property
    def urls(self) -> list[str]:
        return [self.member_url(i) for i in range(len(self.ports))]

    def start_member(self, i: int) -> None:
        log = self.tmp / f"coordinator{i}.log"
        db_url, host, prefix = self.db_url, "127.0.0.1", list[str]()
        if self.namespaces:
            parts = urllib.parse.urlsplit(self.db_url)
            relay = self.relays[2 * i]
            netloc = parts.netloc.rpartition("@")[0] + "@" if "@" in parts.netloc else ""
            db_url = urllib.parse.urlunsplit(parts._replace(netloc=f"{netloc}{relay.host}:{relay.port}"))
            host, prefix = self.namespaces[i].ns_addr, self.namespaces[i].prefix
        self.members[i], _ = start_coordinator_process(
            self.procs, self.tmp / f"member{i}" / "c.db", port=self.ports[i], host=host, log=log, prefix=prefix,
            args=["--db-path", db_url, "--admin-key-file", str(self.admin_key_file),
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
            if p is None or p.poll() is not None or i in self.paused:
                continue
            try:
                status, body = Rest(self.member_url(i), self.api.key, 5).request("GET", "/api/v1/cluster")
            except OSError:
                continue
            if status == 200 and body.get("leader") in self.urls:
                j = self.urls.index(body["leader"])
                p2 = self.members[j]
                if p2 is not None and p2.poll() is None and j not in self.paused:
                    return j
        return None

    def wait_other_leader(self, i: int, timeout: float = 60.0) -> None:
        """Wait until a member other than ``i`` leads; past ``timeout``, fail with what each member
        last logged (a failover that did not come is diagnosed from these, not re-run)."""
        try:
            wait_until(lambda: self.leader() not in (None, i), timeout, "another member to lead")
        except TimeoutError as exc:
            tails = "\n".join(f"--- coordinator{j}.log{' (the one stopped)' if j == i else ''}:\n"
                               f"{self.log_tail(f'coordinator{j}', 2500)}" for j in range(len(self.ports)))
            raise TimeoutError(f"{exc}\n{tails}") from None

    def kill_member(self, i: int) -> float:
        p = self.members[i]
        assert p is not None and p.poll() is None, f"member {i} is not running"
        p.kill()
        at = time.time()
        p.wait()
        self.kills.append(at)
        self.disruptions.append(("kill", at))
        return at

    def pause_member(self, i: int) -> float:
        """SIGSTOP member ``i``: it keeps its sockets and its lease's database session, and says
        nothing; ``leader()`` skips it until ``resume_member``."""
        p = self.members[i]
        assert p is not None and p.poll() is None, f"member {i} is not running"
        p.send_signal(signal.SIGSTOP)
        at = time.time()
        self.paused.add(i)
        self.disruptions.append(("pause", at))
        return at

    def cut_member(self, i: int) -> float:
        """Take member ``i``'s link down (``namespaces`` only): it keeps running, cut off from the
        database, the workers and the other members, until ``restore_member``."""
        self.namespaces[i].down()
        at = time.time()
        self.paused.add(i)
        self.disruptions.append(("cut", at))
        return at

    def restore_member(self, i: int) -> None:
        self.namespaces[i].up()
        self.paused.discard(i)

    def resume_member(self, i: int) -> None:
        p = self.members[i]
        assert p is not None
        p.send_signal(signal.SIGCONT)
        self.paused.discard(i)

    def close(self) -> None:
        for i in list(self.paused):  # a stopped process cannot be stopped gracefully
            self.resume_member(i)
            if self.namespaces:
                self.restore_member(i)
        super().close()
        for relay in self.relays:
            relay.close()

    def add_ha_worker(self, worker_id: str, slots: int = 2) -> None:
        self.add_worker(worker_id, slots=slots, url=",".join(self.urls), extra=["--high-availability"])

    def next_task_times(self, tasks: dict[str, dict[str, Any]]) -> dict[str, list[float]]:
        """Per kind of disruption: for each disruption and each worker, seconds from it to that
        worker's first assignment after it (a worker given nothing after it counts nothing)."""
        per_worker: dict[str, list[float]] = {}
        for t in tasks.values():
            for h in t.get("history", []):
                if h["to"] == "assigned" and h.get("worker_id"):
                    per_worker.setdefault(h["worker_id"], []).append(h["at"])
        out: dict[str, list[float]] = {}
        for kind, at in self.disruptions:
            for times in per_worker.values():
                after = [a for a in times if a > at]
                if after:
                    out.setdefault(kind, []).append(min(after) - at)
        return out

    def registrations(self) -> Any:
        raise NotImplementedError("a group has one log per member")


@contextlib.contextmanager
def group_behind_proxy(tmp_path: Path, prefix: str,
                       namespaces: Sequence[NetNs] = ()) -> Iterator[tuple[HaCluster, RoundRobinProxy]]:
    """Three members on a database of their own with worker ``w1`` (4 slots) registered, behind a
    round-robin TCP proxy (one address, as a load balancer gives it); all closed afterwards."""
    with pg_database_sync(prefix=prefix) as db_url:
        cluster = HaCluster(tmp_path, db_url, members=3, namespaces=namespaces)
        try:
            cluster.start_group()
            cluster.add_ha_worker("w1", slots=4)
            cluster.wait_registered(["w1"])
            proxy = RoundRobinProxy([(u.hostname or "", u.port or 0) for u in map(urllib.parse.urlsplit, cluster.urls)])
            try:
                yield cluster, proxy
            finally:
                proxy.close()
        finally:
            cluster.close()
