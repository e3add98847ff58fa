"""Helpers and fixtures for the flag tests (conftest.py re-exports the fixtures): workers built
from real command lines, hand-driven worker sessions, a coordinator on a background thread for
the blocking ``dt`` CLI, a severable TCP proxy, and child processes.

Workers here go through the same path as ``dt-worker``: ``build_parser().parse_args(argv)`` ->
``config_from_args`` -> ``factory.build_agent``. Only the accelerator probe (a child process that
imports torch and openvino, many seconds) is replaced by "no accelerators", and the environment
probe's child finds no torch; CPU detection is real.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from distributed_testing.cli import worker as worker_cli
from distributed_testing.config import WorkerConfig
from distributed_testing.testing import (  # noqa: F401 (re-exported)
    Cluster,
    Procs,
    free_port,
    pump,
    python_without_accelerators,
    raw_worker,
    refusing_port,
    run_cluster,
    wait_for,
)
from distributed_testing.worker import factory, hardware
from distributed_testing.worker.agent import WorkerAgent
from distributed_testing.worker.environment import EnvironmentProbe
from distributed_testing.worker.factory import build_agent

ROOT = Path(__file__).resolve().parents[3]  # the repository
T = TypeVar("T")


@pytest.fixture
def fast_hardware(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Real CPU detection, no accelerator probe child (it imports torch: seconds per worker), and
    the environment probe's child run with torch hidden: results say their fingerprint is
    unavailable (no test here reads it) instead of each worker importing torch for ~2 s of CPU."""
    monkeypatch.setattr(hardware, "probe_devices_in_child", lambda *a, **k: {})
    python = str(python_without_accelerators(tmp_path))
    monkeypatch.setattr(factory, "EnvironmentProbe", lambda: EnvironmentProbe(python=python))


def worker_config(argv: Sequence[str], env: Mapping[str, str] | None = None) -> WorkerConfig:
    """What ``dt-worker ARGV`` with environment ``env`` runs with."""
    return worker_cli.config_from_args(worker_cli.build_parser().parse_args(list(argv)), env or {})


StartWorker = Callable[..., Awaitable[WorkerAgent]]


@pytest.fixture
def start_cli_worker(fast_hardware: None) -> StartWorker:
    """``await start_cli_worker(cluster, argv, env=None, wait=True)``: a worker built exactly as
    ``dt-worker`` builds it, run in this loop and stopped with the cluster."""

    async def start(c: Cluster, argv: Sequence[str], env: Mapping[str, str] | None = None,
                    wait: bool = True) -> WorkerAgent:
        config = worker_config(argv, env)
        agent = await build_agent(config)
        c.agents.append(agent)
        c.agent_tasks.append(asyncio.create_task(agent.run(), name=f"cli-agent-{config.worker_id}"))
        if wait:
            await wait_for(lambda: agent.registered.is_set() and config.worker_id in c.runtime.sessions,
                           timeout=20, what=f"worker {config.worker_id} to register")
        return agent

    return start


async def workers_by_id(c: Cluster) -> dict[str, dict[str, Any]]:
    status, body = await c.request("GET", "/api/v1/workers")
    assert status == 200, body
    return {w["worker_id"]: w for w in body["workers"]}


# --------------------------------------------------------------------- coordinator on a thread


class ThreadCluster:
    """``run_cluster`` on its own event loop in a background thread, so blocking code (the ``dt``
    CLI uses urllib) can call it from the test's thread."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.loop = asyncio.new_event_loop()
        self.cluster: Cluster | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="dt-test-coordinator", daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        except BaseException as exc:  # surfaced to the test thread in start()
            self._error = exc
            self._ready.set()
        finally:
            self.loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with run_cluster(self.tmp, workers=0) as c:
            self.cluster = c
            self._ready.set()
            await self._stop.wait()

    def start(self) -> ThreadCluster:
        self.thread.start()
        assert self._ready.wait(30), "coordinator thread did not start"
        if self._error is not None:
            raise self._error
        return self

    def call(self, coro: Awaitable[T], timeout: float = 30.0) -> T:
        """Run ``coro`` on the cluster's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    @property
    def c(self) -> Cluster:
        assert self.cluster is not None
        return self.cluster

    def close(self) -> None:
        if self._stop is not None and self.thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(30)
        assert not self.thread.is_alive(), "coordinator thread did not stop"


@pytest.fixture
def thread_cluster(tmp_path: Path) -> Iterator[ThreadCluster]:
    tc = ThreadCluster(tmp_path).start()
    try:
        yield tc
    finally:
        tc.close()


# ------------------------------------------------------------------------------- processes


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    ps = Procs(tmp_path)
    try:
        yield ps
    finally:
        ps.close()


DT_VARS = ("DT_COORDINATOR_URL", "DT_API_KEY", "DT_WORKER_NAME", "DT_DB_PATH", "DT_COORDINATOR_HOST",
           "DT_COORDINATOR_PORT", "DT_COORDINATOR_DB", "DT_ADMIN_KEY_FILE", "DT_CA_FILE", "DT_JWT_SECRET_FILE",
           "DT_MAX_SESSION_AGE", "DT_TLS_CERT", "DT_TLS_KEY")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No DT_* variable leaks in from the developer's shell."""
    for var in DT_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


# ------------------------------------------------------------------------------ a TCP proxy


class Proxy:
    """A loopback TCP proxy in front of ``target`` whose connections the test can sever (abort,
    no WebSocket close frame: what a network failure looks like to both ends)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._transports: list[asyncio.WriteTransport] = []
        self.connections = 0
        self.refusing = False  # while set, new connections are accepted and dropped at once
        self.refused = 0

    async def __aenter__(self) -> Proxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.sever()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refusing:
            self.refused += 1
            writer.transport.abort()
            return
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._transports += [writer.transport, up_writer.transport]  # type: ignore[list-item]
        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer), return_exceptions=True)

    def sever(self) -> None:
        for t in self._transports:
            t.abort()
        self._transports.clear()
