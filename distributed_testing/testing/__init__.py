"""Helpers that tests and users share: an in-process cluster over real sockets.

``run_cluster()`` starts a real coordinator (aiohttp on 127.0.0.1, port 0) and real worker agents
that connect to it over WebSockets and run tasks in real child processes. Only the parts named
``Fake*`` here are doubles, and nothing in the product imports this package (``postgres``:
throwaway PostgreSQL databases and schemas, re-exported here).

::

    async with run_cluster(workers=2) as c:
        ids = await c.submit({"type": "custom", "config": {"name": "noop"}})
        task = await c.wait(ids[0])
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar, overload

import aiohttp
from aiohttp import web

from ..client import ApiClient, ApiError
from ..config import CoordinatorConfig, WorkerConfig
from ..coordinator.fast_http import FastSite
from ..coordinator.runtime import RUNTIME, Runtime
from ..coordinator.server import METRICS_PORT, create_app, make_runner
from ..coordinator.store.base import Store
from ..coordinator.store.memory import MemoryStore
from ..protocol import messages as m
from ..protocol.signing import SESSION_HEADER, Channel, derive_session_key
from ..security import tls
from ..worker import confine
from ..worker.agent import WorkerAgent
from ..worker.auth import Credentials
from ..worker.environment import EnvironmentProbe, with_environment
from ..worker.executors import default_executors
from ..worker.factory import benchmark_options, open_storage, with_benchmark_cache
from .postgres import PG_SERVER as PG_SERVER
from .postgres import create_pg_database as create_pg_database
from .postgres import drop_pg_database as drop_pg_database
from .postgres import pg_database as pg_database
from .postgres import pg_database_sync as pg_database_sync
from .postgres import pg_schema_url as pg_schema_url
from .postgres import run_sync as run_sync

M = TypeVar("M", bound=m.Message)

CPU_HARDWARE: dict[str, Any] = {"hostname": "test", "memory_gb": 8.0, "cpu": {"model": "test", "logical_cores": 2}}


async def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``predicate`` every 10 ms until true; TimeoutError naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


@dataclass(frozen=True)
class TlsFiles:
    """A private CA and a server certificate it signed, as PEM files (see :func:`make_tls_files`)."""

    ca: Path  # the CA certificate: what clients pass as --ca-file
    cert: Path  # the server's certificate chain, leaf first: --tls-cert
    key: Path  # the server's private key: --tls-key


def make_tls_files(directory: Path, hosts: Sequence[str] = ("127.0.0.1", "localhost")) -> TlsFiles:
    """A fresh CA and a certificate for ``hosts`` signed by it (``trustme``, a dev extra), written
    into ``directory``; every call makes a new CA, so two calls give two CAs that trust nothing
    of each other."""
    import trustme  # tests only: the product never imports this module

    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    leaf = ca.issue_cert(*hosts)
    files = TlsFiles(ca=directory / "ca.pem", cert=directory / "server.pem", key=directory / "server.key")
    ca.cert_pem.write_to_path(str(files.ca))
    files.cert.write_bytes(b"".join(pem.bytes() for pem in leaf.cert_chain_pems))
    leaf.private_key_pem.write_to_path(str(files.key))
    return files


@dataclass
class Cluster:
    base_url: str
    admin_key: str
    runtime: Runtime
    http: aiohttp.ClientSession
    agents: list[WorkerAgent] = field(default_factory=list)
    agent_tasks: list[asyncio.Task[None]] = field(default_factory=list)
    tmp: Path = Path(".")
    worker_keys: dict[str, str] = field(default_factory=dict)  # worker id -> its key, kept across restarts
    ca_file: Path | None = None  # trusted by the cluster's client and its workers (https clusters)
    metrics_port: int | None = None  # the open metrics port, when started with metrics_port=

    async def request(self, method: str, path: str, *, key: str | None = None, json: Any = None,
                      params: dict[str, str] | None = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {key or self.admin_key}"} if key != "" else {}
        async with self.http.request(method, self.base_url + path, json=json, params=params, headers=headers) as r:
            return r.status, await r.json(content_type=None)

    async def create_key(self, role: str, **extra: Any) -> str:
        status, body = await self.request("POST", "/api/v1/keys", json={"role": role, **extra})
        assert status == 201, body
        return str(body["key"])

    async def submit(self, doc: Any, key: str | None = None) -> list[str]:
        status, body = await self.request("POST", "/api/v1/tasks", json=doc, key=key)
        if status not in (200, 201):
            raise AssertionError(f"submit failed: HTTP {status}: {body}")
        return [t["task_id"] for t in body["tasks"]]

    async def wait(self, task_id: str, timeout: float = 30.0) -> dict[str, Any]:
        status, body = await self.request("GET", f"/api/v1/tasks/{task_id}", params={"wait": str(timeout)})
        assert status == 200, body
        return dict(body)

    async def add_worker(self, **overrides: Any) -> WorkerAgent:
        """A worker agent with its own worker key; one added again with the same ``worker_id`` (a
        restarted worker) gets the same key, as a worker id belongs to the key that registered it.
        ``probe_environment=True`` stamps results with the environment fingerprint as real workers do
        (off by default: the probe imports torch in a child process)."""
        idx = len(self.agents)
        worker_id = overrides.get("worker_id", f"w{idx}")
        key = self.worker_keys.get(worker_id) or await self.create_key("worker")
        config = WorkerConfig(coordinator_url=self.base_url, api_key=key, name=f"w{idx}", worker_id=f"w{idx}",
                              heartbeat_interval_s=1.0, reconnect_interval_s=0.1, test_root=self.tmp,
                              ca_file=self.ca_file)
        hardware = overrides.pop("hardware", None)
        # the environment probe imports torch in a child (seconds of CPU): on when a test asks
        probe = EnvironmentProbe() if overrides.pop("probe_environment", False) else None
        config = replace(config, **overrides)
        if config.accept_bundles and config.db_path is None:
            # a worker without --db-path keeps its bundles under the host's temporary folder by its
            # id (bundles-w0): tests running at once would share, and clear, each other's trees
            config = replace(config, db_path=self.tmp / f"state-{config.worker_id}" / "outbox.duckdb")
        if config.api_key:
            self.worker_keys.setdefault(config.worker_id, config.api_key)
        cache_dir = self.tmp / f"cache{idx}"
        executors = default_executors(config.max_concurrent_tasks, cache_dir=cache_dir,
                                      benchmark=benchmark_options(config),
                                      confinement=confine.for_worker(config, cache_dir))
        result_store, results = await open_storage(config)  # in memory unless the overrides give a db_path
        executors = with_benchmark_cache(executors, config, results)
        agent = WorkerAgent(config, executors if probe is None else with_environment(executors, probe),
                            result_store, hardware or CPU_HARDWARE, ["cpu"],
                            Credentials(self.base_url, api_key=config.api_key, token=config.token,
                                        ca_file=config.ca_file))
        self.agents.append(agent)
        self.agent_tasks.append(asyncio.create_task(agent.run(), name=f"agent-{config.worker_id}"))
        await wait_for(lambda: config.worker_id in self.runtime.sessions and agent.registered.is_set(),
                       what=f"worker {config.worker_id} to register")
        return agent


async def start_coordinator(config: CoordinatorConfig, store: Store | None) -> tuple[web.AppRunner, str]:
    """The app on the lean front at 127.0.0.1, any free port; https when the config has a
    certificate. Returns the runner and the base URL."""
    context = tls.server_context(config.tls_cert, config.tls_key) if config.tls_cert and config.tls_key else None
    runner = make_runner(create_app(config, store))
    await runner.setup()
    site = FastSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = int(runner.addresses[0][1])
    runner.app[RUNTIME].bind(config.scheme, "127.0.0.1", port)
    return runner, f"{config.scheme}://127.0.0.1:{port}"


def gang_port_window(size: int = 100) -> tuple[int, int]:
    """A random window of rendezvous ports below Linux's ephemeral range, so clusters that run at
    once on one host (tests in parallel) do not hand their gangs the same master port."""
    lo = random.randrange(20_000, 32_000 - size)
    return lo, lo + size - 1


@contextlib.asynccontextmanager
async def run_cluster(tmp: Path, workers: int = 1, *, store: Store | None = None, db_path: str | None = None,
                      worker_overrides: dict[str, Any] | None = None, ca_file: Path | None = None,
                      **coord: Any) -> AsyncIterator[Cluster]:
    """A coordinator plus ``workers`` in-process agents; everything is stopped on exit. With
    ``tls_cert``/``tls_key`` among ``coord`` it serves https, and ``ca_file`` is what the
    cluster's own client and its workers trust."""
    coord.setdefault("gang_ports", gang_port_window())
    config = CoordinatorConfig(host="127.0.0.1", port=0, db_path=db_path or str(tmp / "coordinator.duckdb"),
                               admin_key_file=tmp / "admin.key", heartbeat_interval_s=1.0, **coord)
    if store is None and db_path is None:
        store = MemoryStore()
    runner, url = await start_coordinator(config, store)
    context = tls.client_context(ca_file) if ca_file is not None else None
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context or True))
    cluster = Cluster(url, (tmp / "admin.key").read_text().strip(), runner.app[RUNTIME], http, tmp=tmp,
                      ca_file=ca_file, metrics_port=runner.app.get(METRICS_PORT))
    try:
        for _ in range(workers):
            await cluster.add_worker(**(worker_overrides or {}))
        yield cluster
    finally:
        for a in cluster.agents:
            a.stop()
        for t in cluster.agent_tasks:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                async with asyncio.timeout(10):
                    await t  # cancelled at the timeout
        await http.close()
        await runner.cleanup()


@contextlib.asynccontextmanager
async def bundle_cluster(tmp: Path, workers: int = 1) -> AsyncIterator[tuple[Cluster, str]]:
    """A coordinator with ``workers`` one-slot ``--accept-bundles`` workers (``w1``, ``w2``, ...,
    their outboxes under ``tmp/state``) and a submitter key that may ship code: what a plugin
    run's test ships to."""
    async with run_cluster(tmp / "c", workers=0) as c:
        for i in range(1, workers + 1):
            await c.add_worker(worker_id=f"w{i}", accept_bundles=True, max_concurrent_tasks=1,
                               db_path=tmp / "state" / f"w{i}.duckdb")
        yield c, await c.create_key("submitter", allow_code=True)


@contextlib.asynccontextmanager
async def raw_worker(base_url: str, credential: str, worker_id: str, *, autoping: bool = True,
                     tags: Sequence[str] = (), max_concurrent: int = 1, accept_bundles: bool = False,
                     batches: bool = False,
                     reports: bool = False) -> AsyncIterator[tuple[aiohttp.ClientWebSocketResponse, m.Registered]]:
    """A hand-driven worker: real handshake and signed ``register``, then no application message
    and no ping at all, so the coordinator declares it dead after its TTL (``registered`` says
    when). With ``autoping`` a background reader discards everything the coordinator sends (and
    would answer pings, which the coordinator does not send); without it the test reads. With
    ``batches`` it says it reads ``batch`` frames (the coordinator then sends what it has queued at
    once as one); with ``reports`` that it streams ``reports`` (``registered`` then says whether
    the coordinator keeps them)."""
    session_ids: list[str] = []

    async def on_end(_s: Any, _ctx: Any, params: aiohttp.TraceRequestEndParams) -> None:
        session_ids.append(params.response.headers.get(SESSION_HEADER, ""))

    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(on_end)
    ws_url = base_url.replace("https://", "wss://").replace("http://", "ws://") + "/ws/worker"
    async with (
        aiohttp.ClientSession(trace_configs=[trace]) as http,
        http.ws_connect(ws_url, headers={"Authorization": f"Bearer {credential}"}, autoping=autoping) as ws,
    ):
        assert session_ids and session_ids[0], "no session id header at the handshake"
        ch = Channel(derive_session_key(credential, session_ids[0]))
        reg = m.Register(worker_id=worker_id, name=worker_id, protocol_version=m.PROTOCOL_VERSION, hardware={},
                         capabilities=["cpu"], tags=list(tags), max_concurrent=max_concurrent,
                         accept_bundles=accept_bundles, batches=batches, reports=reports)
        await ws.send_bytes(ch.seal(reg, time.time()))
        msg = await ws.receive(timeout=10)
        assert msg.type == aiohttp.WSMsgType.BINARY, msg
        reply = ch.open(msg.data, time.time())
        assert isinstance(reply, m.Registered) and reply.worker_id == worker_id
        ws._dt_channel = ch  # type: ignore[attr-defined]  # so a test can sign (or mis-sign) more frames
        if not autoping:
            yield ws, reply
            return
        drain = asyncio.create_task(_drain(ws))  # aiohttp answers pings only while someone reads
        try:
            yield ws, reply
        finally:
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drain


async def _drain(ws: aiohttp.ClientWebSocketResponse) -> None:
    while not ws.closed:
        if (await ws.receive()).type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
            return


@overload
async def next_message(ws: aiohttp.ClientWebSocketResponse, kind: type[M]) -> M: ...
@overload
async def next_message(ws: aiohttp.ClientWebSocketResponse, kind: None = None) -> m.Message: ...
async def next_message(ws: aiohttp.ClientWebSocketResponse, kind: type[M] | None = None) -> m.Message:
    """The next signed message from the coordinator on a ``raw_worker(autoping=False)`` socket, or
    with ``kind`` the next of that type (others are read and dropped); answers WebSocket pings
    meanwhile. Each frame must arrive within 10 s."""
    ch: Channel = ws._dt_channel  # type: ignore[attr-defined]  # set by raw_worker
    while True:
        frame = await ws.receive(timeout=10)
        if frame.type == aiohttp.WSMsgType.PING:
            await ws.pong(frame.data)
            continue
        assert frame.type == aiohttp.WSMsgType.BINARY, frame
        msg = ch.open(frame.data, time.time())
        if kind is None or isinstance(msg, kind):
            return msg


def free_port() -> int:
    """A port free now, for a server the test starts (another process may take it meanwhile: for
    an address where nothing must listen, :func:`refusing_port`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_HELD: list[socket.socket] = []


def refusing_port() -> int:
    """A loopback port where nothing listens for the rest of this process: it stays bound (never
    listening), so every connection to it is refused and no parallel test's server can take it, as
    a freed port once was mid-test."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _HELD.append(s)
    return int(s.getsockname()[1])


async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    """Copy ``src`` to ``dst`` until EOF, then abort ``dst`` (one direction of a TCP relay)."""
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    finally:
        dst.transport.abort()


class RoundRobinProxy:
    """A TCP proxy on ``host`` (a free port: ``port``) handing each new connection to the next of
    ``targets`` (``(host, port)``; one target makes it a relay), on its own event loop in a thread.
    A refused or slow (1 s) connect moves to the next target, as a load balancer's health check
    soon would; a target that accepts and then says nothing (a paused process) is not detected,
    as with a real one. ``close`` stops it and drops every connection."""

    def __init__(self, targets: Sequence[tuple[str, int]], host: str = "127.0.0.1") -> None:
        self.targets = list(targets)
        self.host = host
        self._next = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        ready = concurrent.futures.Future[int]()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        self.port = ready.result(10)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _run(self, ready: concurrent.futures.Future[int]) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, self.host, 0))
        except BaseException as exc:
            ready.set_exception(exc)
            return
        ready.set_result(int(self._server.sockets[0].getsockname()[1]))
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in self.targets:
            host, port = self.targets[self._next % len(self.targets)]
            self._next += 1
            try:
                async with asyncio.timeout(1.0):
                    up_r, up_w = await asyncio.open_connection(host, port)
                break
            except (OSError, TimeoutError):
                continue
        else:
            writer.transport.abort()
            return
        await asyncio.gather(pump(reader, up_w), pump(up_r, writer), return_exceptions=True)

    def close(self) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()  # the pumps: every connection is dropped

        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
            self._loop.call_soon_threadsafe(self._loop.stop)


class Procs:
    """Child processes of one test; every one is stopped (TERM, then KILL) at teardown."""

    def __init__(self, tmp: Path, cwd: Path | None = None) -> None:
        self.tmp = tmp
        self.cwd = cwd or tmp
        self.running: list[subprocess.Popen[bytes]] = []

    def start(self, args: Sequence[str], log: Path, env: Mapping[str, str] | None = None,
              drop_env: Sequence[str] = (), prefix: Sequence[str] = ()) -> subprocess.Popen[bytes]:
        """``python ARGS`` with output appended to ``log``; ``prefix`` goes before the interpreter
        and must exec it (``ip netns exec NS``), so the process stays the one signals reach."""
        full = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        for k in drop_env:
            full.pop(k, None)
        with open(log, "ab") as out:
            p = subprocess.Popen([*prefix, sys.executable, *args], cwd=self.cwd, stdout=out, stderr=subprocess.STDOUT,
                                 env=full)
        self.running.append(p)
        return p

    @staticmethod
    def stop(p: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return int(p.returncode)

    def close(self) -> None:
        for p in reversed(self.running):
            self.stop(p)


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition",
               interval: float = 0.05) -> None:
    """Blocking twin of :func:`wait_for`, for tests that drive processes from a plain thread."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class Rest:
    """A small blocking client for the coordinator's REST API, through the one coordinator client
    (``client.ApiClient`` with this one URL: its connect and first-byte bounds, nothing retried:
    ``failover_s=0``).

    ``request`` returns ``(status, decoded JSON body)`` whatever the status (an error's body that
    is not JSON as its text) and raises only for transport errors (``OSError``: refused, reset,
    timed out), so a test can poll a coordinator that is restarting.
    """

    def __init__(self, base_url: str, key: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.key = key
        self.timeout = timeout
        self.client = ApiClient(self.base_url, key, timeout_s=timeout, failover_s=0.0)

    def request(self, method: str, path: str, json: Any = None, params: Mapping[str, Any] | None = None,
                timeout: float | None = None) -> tuple[int, Any]:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            return self.client.call(method, path + query, json, timeout_s=timeout)
        except ApiError as exc:  # no answer: refused, reset or timed out
            raise ConnectionError(str(exc)) from exc

    def ok(self, method: str, path: str, json: Any = None, params: Mapping[str, Any] | None = None) -> Any:
        """``request`` that asserts a 2xx status and returns the body."""
        status, body = self.request(method, path, json=json, params=params)
        assert 200 <= status < 300, f"{method} {path}: HTTP {status}: {body}"
        return body

    def submit(self, doc: Any) -> list[str]:
        return [t["task_id"] for t in self.ok("POST", "/api/v1/tasks", json=doc)["tasks"]]

    def create_key(self, role: str, name: str | None = None) -> str:
        return str(self.ok("POST", "/api/v1/keys", json={"role": role, **({"name": name} if name else {})})["key"])

    def workers(self) -> dict[str, dict[str, Any]]:
        return {w["worker_id"]: w for w in self.ok("GET", "/api/v1/workers")["workers"]}

    def tasks(self) -> dict[str, dict[str, Any]]:
        return {t["task_id"]: t for t in self.ok("GET", "/api/v1/tasks", params={"limit": 10000})["tasks"]}

    def results(self, **filters: Any) -> list[dict[str, Any]]:
        return list(self.ok("GET", "/api/v1/results", params={"limit": 1_000_000, **filters})["results"])


def start_coordinator_process(procs: Procs, db_path: Path, *, port: int = 0, host: str = "127.0.0.1",
                              args: Sequence[str] = (), log: Path | None = None,
                              timeout: float = 60.0, make_dir: bool = True,
                              env: Mapping[str, str] | None = None,
                              prefix: Sequence[str] = ()) -> tuple[subprocess.Popen[bytes], int]:
    """``run_coordinator.py`` (``procs.cwd`` must hold it) on ``host:port`` (0: any free port) with
    ``--port-file``; returns the process and its port once it listens. The admin key is written
    beside ``db_path`` on the first start. ``make_dir=False`` leaves creating the database's
    directory to the coordinator (the port file and the default log then go to ``procs.tmp``).
    ``env`` adds variables to the process's environment; ``prefix`` goes before the interpreter
    (``ip netns exec NAME``)."""
    if make_dir:
        db_path.parent.mkdir(parents=True, exist_ok=True)
    aside = db_path.parent if make_dir else procs.tmp
    port_file = aside / f"{db_path.stem}.port"
    port_file.unlink(missing_ok=True)
    where = log or aside / "coordinator.log"
    p = procs.start(["run_coordinator.py", "--host", host, "--port", str(port), "--db-path", str(db_path),
                     "--port-file", str(port_file), *args], where, env=env, prefix=prefix)

    def listening() -> bool:
        if p.poll() is not None:
            raise AssertionError(f"coordinator exited with {p.returncode}: {where.read_text()[-3000:]}")
        return port_file.exists()

    wait_until(listening, timeout, "the coordinator to listen")
    return p, int(port_file.read_text())


Respond = Callable[[web.Request], Awaitable[web.StreamResponse]]  # a fake coordinator's answer


@contextlib.asynccontextmanager
async def fake_coordinator(respond: Respond, *, ssl_context: Any = None,
                           host: str = "127.0.0.1") -> AsyncIterator[tuple[str, list[web.Request]]]:
    """A server (https with ``ssl_context``) whose every route, the worker endpoint included,
    answers with ``respond``; yields its URL and the requests seen (their headers stay readable).
    A standby double, or a foreign listener that only records what reaches it."""
    seen: list[web.Request] = []

    async def endpoint(request: web.Request) -> web.StreamResponse:
        seen.append(request)
        return await respond(request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", endpoint)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, 0, ssl_context=ssl_context)
    await site.start()
    try:
        yield f"{'https' if ssl_context is not None else 'http'}://{host}:{runner.addresses[0][1]}", seen
    finally:
        await runner.cleanup()


def standby_answer(leader: str | None, *, redirect: bool = False) -> Respond:
    """A standby's answer naming ``leader``: 503 ``not_leader`` (a 307 to the same path there with
    ``redirect``), for ``fake_coordinator``."""
    async def respond(request: web.Request) -> web.StreamResponse:
        body = {"error": "not_leader", "leader": leader, "message": "standby"}
        if redirect and leader is not None and request.path != "/ws/worker":
            return web.json_response(body, status=307, headers={"Location": leader + request.path_qs})
        return web.json_response(body, status=503, headers={"Retry-After": "1"})
    return respond


async def record_only(_request: web.Request) -> web.StreamResponse:
    """A foreign listener's answer: 200 and nothing (what matters is what reached it)."""
    return web.json_response({})


def hidden_accelerators(tmp: Path) -> dict[str, str]:
    """Environment for worker processes in which ``torch`` and ``openvino`` fail to import, so the
    worker's accelerator probe answers in moments instead of importing them (for tests whose
    tasks need neither); the caller's ``PYTHONPATH`` stays after the hiding directory."""
    hide = tmp / "hide"
    for name in ("torch", "openvino"):
        (hide / name).mkdir(parents=True, exist_ok=True)
        (hide / name / "__init__.py").write_text(f"raise ImportError('{name} is hidden from these workers')\n")
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(hide), os.environ.get("PYTHONPATH")) if p)}


def python_without_accelerators(tmp: Path) -> Path:
    """An executable that runs this interpreter with ``hidden_accelerators``' path first: for the
    environment probe of a worker built in this process (``EnvironmentProbe(python=...)``), whose
    child then reports the fingerprint unavailable at once instead of importing torch (~2 s of CPU)."""
    script = tmp / "python-without-accelerators"
    hide = hidden_accelerators(tmp)["PYTHONPATH"]
    script.write_text(f'#!/bin/sh\nPYTHONPATH={shlex.quote(hide)} exec {shlex.quote(sys.executable)} "$@"\n')
    script.chmod(0o755)
    return script
