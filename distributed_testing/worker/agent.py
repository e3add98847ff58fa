"""The worker agent: connect, register, run assigned tasks in child processes, report results.

One reader coroutine receives every frame and dispatches by message type (``_HANDLERS``); one
writer drains an ordered queue, signing each frame as it is sent. Heartbeats come from this event
loop, never from task code (tasks run in children), so a task at 100 % CPU cannot make the worker
look dead. Results are written to the outbox before they are sent and stay there until the
coordinator acknowledges them; after a reconnect the unacknowledged ones are sent again and
still-running tasks are re-announced in ``register``.

The bookkeeping (what runs, what is provisional, what waits to be sent or acknowledged) is the
pure ``core.state.WorkerState``; this module feeds it events and executes its instructions
(``_apply``, dispatched by ``_INSTRUCTIONS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp

from ..client import canonical
from ..config import WorkerConfig, ws_url
from ..errors import ExecutionError, ProtocolError
from ..process.netif import InterfaceError, interface_address, interface_of
from ..protocol import messages as m
from ..protocol.signing import SESSION_HEADER, Channel, derive_session_key
from ..retry import Backoff, RetriesExhausted, retry_async
from ..security import tls
from .auth import Credentials
from .bundles import ShippedCode
from .coordinators import Candidates
from .core.state import (
    ArmHold,
    Attempt,
    DisarmHold,
    FlushSoon,
    Forget,
    Instruction,
    Keep,
    Kill,
    RecordFinished,
    RecordStarted,
    ResendKept,
    Send,
    Start,
    Warn,
    WorkerState,
)
from .executors.base import ExecOutcome, Executor, TaskContext, advertised_handlers
from .limits import Limits, ResourceMonitor, Sample, Sampler, memory_for_tasks_mb, swap_percent
from .outbox import Outbox
from .session import (
    CLUSTER_TIMEOUT_S,
    FIRST_RECONNECT_SPREAD_S,
    HA_FIRST_PAUSE_S,
    MAX_FRAME_BYTES,
    OPEN_TIMEOUT_S,
    RETRY_ON,
    HandshakeProbe,
    NotTheLeader,
    SessionRejected,
    bound_unacknowledged,
    ping_period,
    refusal_json,
)

log = logging.getLogger(__name__)
# A task still running after this long is announced with ``started``; shorter ones are announced
# only by their result, which saves a message and a durable write per short task.
STARTED_DELAY_S = 0.025
# With resource limits, resources are sampled this often (heartbeats still go out every
# heartbeat_interval_s, and at once when the state changes).
SAMPLE_PERIOD_S = 1.0
# A drain waits at least this long for its results' acks, even when the tasks used the whole
# drain timeout.
FLUSH_MIN_S = 5.0
# Results finished while the previous ``results`` message still waits for its ack are held and
# sent together when the ack arrives, for at most this long. An idle worker sends at once; a
# busy one sends one message per coordinator round trip, carrying everything finished meanwhile,
# so message, signing, dispatch and fsync costs are shared by many tasks. Measured with
# benchmarks/dispatch.py (2 workers x 32 slots): 1.8 tasks per message without the hold, 11
# with it, and 1,945 -> 2,861 tasks/s.
RESULT_HOLD_S = 0.005
class WorkerAgent:
    def __init__(self, config: WorkerConfig, executors: dict[str, Executor], outbox: Outbox,
                 hardware: dict[str, Any], capabilities: list[str], credentials: Credentials,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.executors = executors
        self.outbox = outbox
        self.hardware = hardware
        self.capabilities = capabilities
        self.credentials = credentials
        self.clock = clock
        self.state = WorkerState(batch_types=frozenset(t for t, ex in executors.items() if hasattr(ex, "run_batch")),
                                 slots=config.max_concurrent_tasks)
        self._runs: dict[int, asyncio.Task[None]] = {}  # by run id (state.Start)
        self.registered = asyncio.Event()
        self.draining = False
        self.sessions = 0  # sessions established (registered) since start
        self._sendq: asyncio.Queue[m.Message] = asyncio.Queue()
        self._hold: asyncio.TimerHandle | None = None  # ends a result hold (RESULT_HOLD_S)
        self._channel: Channel | None = None
        self._http: aiohttp.ClientSession | None = None  # for the WebSocket only, one per run()
        self._handshake = HandshakeProbe()
        self._pong = asyncio.Event()  # set by the reader at each pong (see _keepalive)
        # The liveness contract of the current session, from ``registered``: (interval, TTL).
        self.liveness: tuple[float, float] = (config.heartbeat_interval_s or 1.0, 3.0)
        self._stop = asyncio.Event()
        self.monitor = ResourceMonitor(Limits(
            max_cpu_percent=config.max_cpu_percent, max_memory_percent=config.max_memory_percent,
            max_gpu_percent=config.max_gpu_percent, memory_buffer=config.memory_buffer,
            cooldown_s=config.limit_cooldown_s, count_swap=config.enable_swap))
        self._sampler = Sampler(gpu=config.max_gpu_percent is not None)
        self._beat_now = asyncio.Event()  # set: send a heartbeat now (state changed)
        self._acked = asyncio.Event()  # set whenever an ack arrives
        self._drain_reason: str | None = None
        self._drain_task: asyncio.Task[list[m.TaskRef]] | None = None  # the one drain, once begun
        # The NIC training ranks bind: --interface, else the one carrying this session's
        # coordinator connection (set at each connect); reported in ``register``.
        self.interface: str | None = config.interface
        # the coordinators this worker may connect to, and the one of the current attempt
        self.candidates = Candidates(config.urls)
        self.rng = random.Random()  # the first reconnect's jitter (first_reconnect_delay)
        self.shipped = ShippedCode.at_start(config, credentials.ssl)  # --accept-bundles, --sandbox

    @property
    def running(self) -> dict[str, Attempt]:
        """The attempts running here, by task id (the state's; read-only for the shell)."""
        return self.state.running

    # --------------------------------------------------------------- lifecycle

    async def run(self) -> None:
        """Connect and serve until ``stop()``; reconnect with backoff on connection loss, up to
        ``reconnect_attempts`` consecutive failures."""
        for ex in self.executors.values():
            await ex.start()
        await self._recovery_report()
        backoff = Backoff(base_s=self.config.reconnect_interval_s, factor=2.0, max_s=max(30.0, self.config.reconnect_interval_s))
        try:
            async with self._client_session() as self._http:
                served = False
                while not self._stop.is_set():
                    if served:  # an established session ended: spread the fleet's first reconnect
                        await self._backoff_sleep(self.first_reconnect_delay())
                        if self._stop.is_set():
                            break
                    served = True  # both loops below return only once a session was served
                    if self.config.high_availability:
                        await self._connect_ha()
                        continue
                    try:
                        await retry_async(self._connect_once, backoff=backoff, attempts=self.config.reconnect_attempts,
                                          retry_on=RETRY_ON, what="connection to coordinator", sleep=self._backoff_sleep)
                    except RetriesExhausted:
                        log.error("giving up after %d reconnect attempts", self.config.reconnect_attempts)
                        raise
        finally:
            self._http = None
            await self._shutdown_tasks()

    async def _connect_ha(self) -> None:
        """``--high-availability``: attempts until a session was served (returns when it ended).
        A failed attempt goes on to the next coordinator at once; only after a full round of
        every known one does it pause, ``HA_FIRST_PAUSE_S`` doubling up to ``--reconnect-interval``.
        It never gives up: a coordinator group comes back."""
        pause = Backoff(base_s=min(HA_FIRST_PAUSE_S, self.config.reconnect_interval_s), factor=2.0,
                        max_s=self.config.reconnect_interval_s)
        rounds = 0
        while not self._stop.is_set():
            try:
                await self._connect_once()
                return
            except RETRY_ON as exc:
                if not self.candidates.round_complete(time.monotonic()):
                    log.warning("coordinator %s: %s; trying the next one", self.candidates.current, exc)
                    continue
                delay = pause.delay(rounds)
                rounds += 1
                log.warning("none of %d coordinator(s) took this worker (last: %s: %s); next round in %.2fs",
                            len(self.candidates.urls), self.candidates.current, exc, delay)
                self.candidates.new_round()
                await self._backoff_sleep(delay)

    def first_reconnect_delay(self) -> float:
        """The wait before the first attempt after an established session ended: uniform in
        0..min(``FIRST_RECONNECT_SPREAD_S``, ``--reconnect-interval``). Without it every worker of
        a restarted coordinator reconnects in the same millisecond; failed attempts after it back
        off as before (``--reconnect-interval``, doubling, with jitter)."""
        return self.rng.uniform(0.0, min(FIRST_RECONNECT_SPREAD_S, self.config.reconnect_interval_s))

    def _client_session(self) -> aiohttp.ClientSession:
        """The HTTP client the coordinator WebSocket is opened with. It connects directly, as the
        worker's token requests do: no proxy variables, and no ``~/.netrc`` (with ``trust_env``,
        a matching netrc entry makes aiohttp refuse our Authorization header). Every connection
        carries one WebSocket session and is closed with it, so nothing is pooled
        (``force_close``), and the coordinator's name is resolved at every connect (no DNS cache),
        so a coordinator that moved is found at the next reconnect. No total timeout: the
        handshake has its own (``OPEN_TIMEOUT_S``) and a session lasts as long as it lasts."""
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True, use_dns_cache=False, ssl=self.credentials.ssl or True),
            timeout=aiohttp.ClientTimeout(total=None), trace_configs=[self._handshake.config])

    async def _backoff_sleep(self, delay: float) -> None:
        """The reconnect backoff's wait; ``stop()`` ends it at once (a worker told to stop while
        the coordinator is unreachable used to sit out a backoff of up to 36 s first)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), delay)

    def stop(self) -> None:
        """Stop at once: running tasks are killed without a result (the coordinator requeues
        them after its grace period). ``drain()`` is the graceful way."""
        self._stop.set()

    async def drain(self, reason: str, timeout_s: float | None = None) -> list[m.TaskRef]:
        """Graceful stop. Take no new work (heartbeats say ``draining``, sent at once), let the
        running tasks finish for up to ``timeout_s`` (default ``drain_timeout_s``), then kill the
        rest and hand them back (``Goodbye.handed_back``: the coordinator requeues them without
        counting a retry), wait for every result's ack until the deadline (at least
        ``FLUSH_MIN_S``), say goodbye and stop. Returns the handed-back tasks. Cancelling it (then
        ``stop()``) stops at once.

        SIGTERM (the CLI) and the coordinator's ``drain`` message both come here. One drain runs
        at a time: a call while one is under way waits for that one, with its deadline."""
        if self._drain_task is None:
            timeout = self.config.drain_timeout_s if timeout_s is None else timeout_s
            self._drain_task = asyncio.create_task(self._drain(reason, timeout), name="worker-drain")
        else:
            log.info("already draining (%s); not starting another drain for: %s", self._drain_reason, reason)
        return await self._drain_task

    async def _drain(self, reason: str, timeout_s: float) -> list[m.TaskRef]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self.draining, self._drain_reason = True, reason
        self._beat_now.set()
        log.info("draining (%s): %d task(s) running, up to %gs to finish", reason, len(self.running), timeout_s)
        while (busy := {t for t in self._runs.values() if not t.done()}) and (left := deadline - loop.time()) > 0:
            await asyncio.wait(busy, timeout=left)  # and again for tasks assigned meanwhile
        handed = await self._hand_back(reason, timeout_s)
        await self._await_acks(max(deadline - loop.time(), FLUSH_MIN_S))
        if self.registered.is_set():
            self._send(m.Goodbye(f"worker stopped: {reason}"))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._sendq.join(), FLUSH_MIN_S)
        log.info("drain complete; unregistered from the coordinator")
        self.stop()
        return handed

    async def _hand_back(self, reason: str, timeout_s: float) -> list[m.TaskRef]:
        """Kill the tasks still running and tell the coordinator they were not finished."""
        refs, kills = self.state.hand_back()
        if not refs:
            return []
        tasks = [self._runs[k.run] for k in kills if k.run in self._runs]
        self._apply(kills)  # no cancel_reason: no result is reported for them
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(outcome, Exception):
                log.error("a handed-back task failed while stopping: %r", outcome)
        self._apply(self.state.handed_back(refs))  # stopped on purpose: not a crash
        log.warning("handing back %d task(s) still running after the %gs drain timeout: %s", len(refs),
                    timeout_s, ", ".join(f"{r.task_id} (attempt {r.attempt})" for r in refs))
        if self.registered.is_set():
            self._send(m.Goodbye(f"drain timeout after {timeout_s:g}s ({reason})", handed_back=refs))
        else:
            log.warning("not connected: the coordinator requeues them when its grace period ends")
        return refs

    async def _await_acks(self, budget_s: float) -> None:
        loop = asyncio.get_running_loop()
        until = loop.time() + budget_s
        # results sent before their confirm are not in the outbox yet, but are waited for all the same
        while (unacked := [*await self.outbox.unacked(), *self.state.unlogged.values()]):
            if (left := until - loop.time()) <= 0:
                log.warning("%d result(s) not acknowledged before the drain deadline; %s", len(unacked),
                            "they stay in the outbox" if self.config.db_path else "they are lost (no --db-path)")
                return
            self._acked.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._acked.wait(), left)

    async def _recovery_report(self) -> None:
        """At start: what an earlier run left behind. With ``recover`` the tasks that were
        running when it died are reported as retryable errors (sent after registration)."""
        interrupted = await self.outbox.take_interrupted()
        names = ", ".join(f"{r.task_id} (attempt {r.attempt})" for r in interrupted)
        if not self.config.recover:
            if interrupted:
                log.warning("%d task(s) were running when this worker last died: %s; not reported "
                            "(start with --recover to report them)", len(interrupted), names)
            return
        unacked = await self.outbox.unacked()
        now = self.clock()
        for r in interrupted:
            await self.outbox.add(m.TaskResult(
                task_id=r.task_id, attempt=r.attempt, status="error", started_at=r.started_at, finished_at=now,
                output={"retryable": True}, error="interrupted by a worker crash", worker_id=self.config.worker_id))
        log.warning("recovery: %d unacknowledged result(s) to re-send; %d task(s) interrupted by a worker crash%s",
                    len(unacked), len(interrupted), f" (reported as errors): {names}" if interrupted else "")

    async def _connect_once(self) -> None:
        if self._stop.is_set():
            return  # stopped during the backoff: no further attempt
        assert self._http is not None, "only run() connects"
        cred = await self.credentials.current()
        url = self.candidates.next(time.monotonic())
        try:
            await self._session(url, cred)
        except NotTheLeader:
            self.candidates.failed(url, time.monotonic(), alive=True)
            raise
        except RETRY_ON:
            self.candidates.failed(url, time.monotonic())
            raise
        self.candidates.lost(url, time.monotonic())  # an established session ended

    async def _session(self, url: str, cred: str) -> None:
        """One session with the coordinator at ``url``: returns when an established session ended;
        raises when none was established (a failed attempt)."""
        ws = await self._open(url, cred)
        async with ws:
            session_id = self._handshake.headers.get(SESSION_HEADER) if self._handshake.headers is not None else None
            if not session_id:
                raise ProtocolError("coordinator did not send a session id header")
            self._channel = Channel(derive_session_key(cred, session_id))
            self._sendq = asyncio.Queue()
            sessions_before = self.sessions
            try:
                await self._serve(ws)
            except (OSError, aiohttp.ClientError, ProtocolError) as exc:
                if self.sessions == sessions_before:
                    raise  # never registered: counts as a failed attempt
                # an established session that dropped: reconnect with a fresh attempt count
                log.warning("session with coordinator %s lost: %s; reconnecting", url, exc)

    async def _open(self, url: str, cred: str) -> aiohttp.ClientWebSocketResponse:
        """The WebSocket handshake with the coordinator at ``url``. A standby's 503 naming the
        leader sends the next attempt there (``NotTheLeader``)."""
        assert self._http is not None
        self._handshake.reset()
        try:
            async with asyncio.timeout(OPEN_TIMEOUT_S):
                # No compression (compress=0, the default); keepalive pings are ours (_keepalive).
                return await self._http.ws_connect(ws_url(url), headers={"Authorization": f"Bearer {cred}"},
                                                   max_msg_size=MAX_FRAME_BYTES, autoping=False)
        except aiohttp.ClientConnectorCertificateError as exc:  # a configuration problem: retrying cannot help
            raise SessionRejected(tls.describe_tls_error(exc, url) or str(exc)) from exc
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status in (401, 403):
                raise SessionRejected(f"coordinator refused credentials: HTTP {exc.status} "
                                      f"{self._handshake.body.decode(errors='replace')}".rstrip()) from exc
            if exc.status == 503 and (answer := refusal_json(self._handshake.body)).get("error") == "not_leader":
                leader = answer.get("leader")
                if isinstance(leader, str) and canonical(leader) != url:
                    await self._follow(url, leader, cred)
                raise NotTheLeader(f"{url} is a standby; leader: {leader or 'none yet'}") from exc
            raise

    async def _follow(self, url: str, leader: str, cred: str) -> None:
        """A standby at ``url`` named ``leader``: the next attempt goes there if it is a member
        (asking ``url``'s cluster view once for a URL not yet known); the worker key never goes
        anywhere else, nor from https to http (client.Members)."""
        if canonical(leader) not in self.candidates.urls and self.candidates.refusal(url, leader, membership=False) is None:
            view = await self._cluster_view(url, cred)
            if view is not None:
                self.candidates.learn(view, url)
        refused = self.candidates.refusal(url, leader)
        if refused is not None:
            log.warning("%s", refused)
        elif not self.candidates.redirect(leader, time.monotonic()):
            log.info("standby %s names %s, which failed just now: trying the other members first", url, leader)

    async def _serve(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._send(self._register_msg(self._rendezvous_address(ws)))
        writer = asyncio.create_task(self._writer(ws), name="worker-writer")
        beats = asyncio.create_task(self._heartbeats(), name="worker-heartbeats")
        renew = asyncio.create_task(self._renew_tokens(), name="worker-token-renewal")
        stopper = asyncio.create_task(self._stop.wait(), name="worker-stop-wait")
        learn = asyncio.create_task(self._learn_group(), name="worker-learn-group")
        keepalive = asyncio.create_task(self._keepalive(ws), name="worker-keepalive")
        reader = asyncio.create_task(self._reader(ws), name="worker-reader")
        ending = (reader, writer, keepalive)
        try:
            done, _ = await asyncio.wait({*ending, stopper}, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not stopper and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        finally:
            self.registered.clear()
            self._apply(self.state.session_ended())
            tasks = (beats, renew, learn, stopper, *ending)
            for t in tasks:
                t.cancel()
            for t, outcome in zip(tasks, await asyncio.gather(*tasks, return_exceptions=True), strict=True):
                if isinstance(outcome, Exception) and t not in ending:  # those re-raised above
                    log.error("%s stopped: %s", t.get_name(), outcome)

    async def _learn_group(self) -> None:
        """``--high-availability``: once registered, add every member ``GET /api/v1/cluster``
        lists to the candidates (a failure is logged: the configured ones remain)."""
        await self.registered.wait()
        if not self.config.high_availability:
            return
        url = self.candidates.current
        view = await self._cluster_view(url, await self.credentials.current())
        new = self.candidates.learn(view, url) if view is not None else []
        if new:
            log.info("learned coordinator(s) %s from %s; known: %s", ", ".join(new), url, ", ".join(self.candidates.urls))

    async def _cluster_view(self, url: str, cred: str) -> dict[str, Any] | None:
        """``GET /api/v1/cluster`` of the member at ``url`` (None, logged, when it has none)."""
        try:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self.credentials.ssl or True),
                                             timeout=aiohttp.ClientTimeout(total=CLUSTER_TIMEOUT_S)) as http:
                async with http.get(f"{url}/api/v1/cluster", headers={"Authorization": f"Bearer {cred}"}) as resp:
                    view = await resp.json(content_type=None) if resp.status == 200 else None
                    if view is None:
                        log.warning("GET %s/api/v1/cluster: HTTP %d", url, resp.status)
                    return view if isinstance(view, dict) else None
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            log.warning("GET %s/api/v1/cluster failed: %s", url, exc)
            return None

    def _register_msg(self, address: str = "") -> m.Register:
        return m.Register(worker_id=self.config.worker_id, name=self.config.name, protocol_version=m.PROTOCOL_VERSION,
                          hardware=self.hardware, capabilities=self.capabilities, tags=list(self.config.tags),
                          max_concurrent=self.config.max_concurrent_tasks,
                          memory_gb=float(self.hardware.get("memory_gb", 0.0)),
                          running=self.state.running_refs(),
                          address=address, interface=self.interface, finished=self.outbox.unacked_refs(),
                          abandoned=list(self.state.abandoned), model_modules=list(self.config.allow_model_modules),
                          accept_bundles=self.shipped.accepting,
                          heartbeat_interval_s=self.config.heartbeat_interval_s or 0.0,
                          handlers=advertised_handlers(self.executors), pipeline_depth=self.config.pipeline_depth)

    def _rendezvous_address(self, ws: aiohttp.ClientWebSocketResponse) -> str:
        """Where other workers reach this one for a multi-node rendezvous: ``--interface``'s address,
        else this connection's local address; in that case the NIC holding that address becomes
        ``self.interface`` (what gloo/NCCL bind, so they never pick another NIC by hostname)."""
        if self.config.interface:
            try:
                return interface_address(self.config.interface)
            except InterfaceError as exc:  # checked at start; the NIC went away since
                log.error("--interface %s: %s; reporting no rendezvous address", self.config.interface, exc)
                return ""
        local = ws.get_extra_info("sockname")
        address = str(local[0]).split("%")[0] if local else ""
        self.interface = interface_of(address) if address else None
        if address and self.interface is None:
            log.warning("no local interface holds %s (the coordinator connection's address): training ranks "
                        "will not be bound to a NIC; set --interface", address)
        return address

    # ----------------------------------------------------------------- reading

    async def _reader(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        assert self._channel is not None
        violations = 0
        while (frame := await self._next_frame(ws)) is not None:
            try:
                msg = self._channel.open(frame, self.clock())
            except ProtocolError as exc:
                violations += 1
                log.warning("rejected frame from coordinator (%s): %s", exc.code, exc)
                self._send(m.ErrorMsg(exc.code, str(exc)))
                if violations >= 5:
                    raise
                continue
            handler = _HANDLERS.get(type(msg))
            if handler is None:
                raise ProtocolError(f"unexpected {type(msg).__name__} from coordinator")
            await handler(self, msg)

    async def _next_frame(self, ws: aiohttp.ClientWebSocketResponse) -> bytes | None:
        """The next data frame (a text frame as its UTF-8 bytes), or None once the session was
        closed cleanly (the coordinator's close frame with code 1000 or 1001, or a close from this
        side). Answers pings and notes pongs (autoping is off: see ``_keepalive``). A connection
        that ended without a clean close, or one aiohttp found broken (a bad or oversized frame),
        raises ConnectionError: a lost session, or before registration a failed connect."""
        while True:
            frame = await ws.receive()
            kind = frame.type
            if kind is aiohttp.WSMsgType.BINARY:
                return frame.data  # type: ignore[no-any-return]
            if kind is aiohttp.WSMsgType.PING:
                await ws.pong(frame.data)
            elif kind is aiohttp.WSMsgType.PONG:
                self._pong.set()
            elif kind is aiohttp.WSMsgType.TEXT:
                return frame.data.encode()  # type: ignore[no-any-return]
            elif kind is aiohttp.WSMsgType.CLOSE and frame.data in (aiohttp.WSCloseCode.OK, aiohttp.WSCloseCode.GOING_AWAY):
                log.info("coordinator closed the session%s", f": {frame.extra}" if frame.extra else "")
                return None
            elif kind is aiohttp.WSMsgType.CLOSING:  # closed from this side
                return None
            elif kind is aiohttp.WSMsgType.ERROR:
                raise ConnectionError(f"WebSocket to coordinator failed: {frame.data}") from frame.data
            else:  # CLOSE with an error code; CLOSED: the connection ended without a close frame
                raise ConnectionError(f"connection to coordinator closed abnormally (close code {ws.close_code}"
                                      f"{f': {frame.extra}' if frame.extra else ''})")

    async def _on_registered(self, msg: m.Message) -> None:
        assert isinstance(msg, m.Registered)
        self.liveness = (msg.heartbeat_interval_s, msg.worker_ttl_s)
        self.candidates.connected(self.candidates.current)
        self.credentials.coordinator_url = self.candidates.current  # token renewals go where the session is
        log.info("registered with coordinator as %s (session %s); heartbeat every %gs, declared dead after %gs "
                 "without a frame", msg.worker_id, msg.session_id, msg.heartbeat_interval_s, msg.worker_ttl_s)
        self.registered.set()
        self.sessions += 1
        if self.draining:
            self._beat_now.set()  # a new session starts as ready: say at once that we are not
        await self._apply_all(self.state.registered())

    async def _on_assign(self, msg: m.Message) -> None:
        assert isinstance(msg, m.AssignTasks)
        self._apply(self.state.assign(msg))

    async def _on_confirm(self, msg: m.Message) -> None:
        assert isinstance(msg, m.Confirm)
        await self._apply_all(self.state.confirm(msg.upto))

    async def _on_ack(self, msg: m.Message) -> None:
        assert isinstance(msg, m.ResultAck)
        await self._apply_all(self.state.ack(msg))
        self._acked.set()

    async def _on_cancel(self, msg: m.Message) -> None:
        assert isinstance(msg, m.Cancel)
        await self._apply_all(self.state.cancel(msg, self.clock()))

    async def _on_take_back(self, msg: m.Message) -> None:
        assert isinstance(msg, m.TakeBack)
        self._apply(self.state.take_back(msg))

    async def _on_drain(self, msg: m.Message) -> None:
        """The coordinator's drain: the same graceful stop as SIGTERM, with its deadline. It runs
        in its own task (owned here, awaited at shutdown) so this reader keeps reading acks."""
        assert isinstance(msg, m.Drain)
        timeout = msg.deadline_s if math.isfinite(msg.deadline_s) and msg.deadline_s >= 0 else self.config.drain_timeout_s
        log.warning("coordinator asked us to drain within %gs: %s", timeout, msg.reason)
        if self._drain_task is None:
            self._drain_task = asyncio.create_task(self._drain(msg.reason, timeout), name="worker-drain")
        else:
            log.info("already draining (%s)", self._drain_reason)

    async def _on_error(self, msg: m.Message) -> None:
        assert isinstance(msg, m.ErrorMsg)
        if msg.fatal and msg.code == "heartbeat_interval":  # refused at registration: retrying cannot help
            log.error("coordinator refused this worker's heartbeat interval: %s", msg.detail)
            raise SessionRejected(f"coordinator refused --heartbeat-interval: {msg.detail}")
        log.warning("coordinator rejected our message: %s: %s", msg.code, msg.detail)
        if msg.fatal:
            raise ProtocolError(f"coordinator closed the session: {msg.code}: {msg.detail}")

    # --------------------------------------------------------------- executing

    def _apply(self, instructions: Sequence[Instruction]) -> list[asyncio.Future[None]]:
        """Execute the state's instructions in order; returns the outbox writes' futures (an
        async caller awaits them before it goes on, as the outbox's durability point)."""
        writes: list[asyncio.Future[None]] = []
        for ins in instructions:
            if (fut := _INSTRUCTIONS[type(ins)](self, ins)) is not None:
                writes.append(fut)
        return writes

    async def _apply_all(self, instructions: list[Instruction]) -> None:
        for write in self._apply(instructions):
            await write

    def _do_send(self, ins: Instruction) -> None:
        assert isinstance(ins, Send)
        self._send(ins.msg)

    def _do_start(self, ins: Instruction) -> None:
        assert isinstance(ins, Start)
        first = ins.assignments[0]
        if ins.batched:
            coro, name = self._execute_batch(list(ins.assignments)), f"batch-{first.task_id}"
        else:
            coro, name = self._execute(first), f"task-{first.task_id}"
        task = asyncio.create_task(coro, name=name)
        self._runs[ins.run] = task
        task.add_done_callback(functools.partial(self._run_ended, ins.run))

    def _run_ended(self, run: int, _task: asyncio.Task[None]) -> None:
        self._runs.pop(run, None)
        self._apply(self.state.run_ended(run))  # its slot goes to the next queued run

    def _do_kill(self, ins: Instruction) -> None:
        assert isinstance(ins, Kill)
        if (task := self._runs.get(ins.run)) is not None:
            task.cancel()

    def _do_keep(self, ins: Instruction) -> asyncio.Future[None]:
        assert isinstance(ins, Keep)
        return self.outbox.add(ins.result)

    def _do_forget(self, ins: Instruction) -> None:
        assert isinstance(ins, Forget)
        self.outbox.ack(ins.refs)

    def _do_resend_kept(self, ins: Instruction) -> asyncio.Future[None]:
        """Re-send what the outbox keeps; the returned future completes once it is queued."""
        async def resend() -> None:
            unsent = await self.outbox.unacked()
            if unsent:
                log.info("re-sending %d unacknowledged results", len(unsent))
                self._send(m.Results(unsent))
        return asyncio.ensure_future(resend())

    def _do_record_started(self, ins: Instruction) -> None:
        assert isinstance(ins, RecordStarted)
        self.outbox.running_started(ins.refs)

    def _do_record_finished(self, ins: Instruction) -> None:
        assert isinstance(ins, RecordFinished)
        self.outbox.running_finished(ins.refs)

    def _do_flush_soon(self, _ins: Instruction) -> None:
        asyncio.get_running_loop().call_soon(self._flush)

    def _do_arm_hold(self, _ins: Instruction) -> None:
        self._hold = asyncio.get_running_loop().call_later(RESULT_HOLD_S, self._hold_expired)

    def _do_disarm_hold(self, _ins: Instruction) -> None:
        if self._hold is not None:
            self._hold.cancel()
            self._hold = None

    def _do_warn(self, ins: Instruction) -> None:
        assert isinstance(ins, Warn)
        log.warning("%s", ins.text)

    def _flush(self) -> None:
        self._apply(self.state.flush(self.clock()))

    def _hold_expired(self) -> None:
        self._hold = None
        self._apply(self.state.hold_expired(self.clock()))

    async def _execute(self, a: m.TaskAssignment) -> None:
        """One task; started by the state only once a slot is free (``state.Start``)."""
        ref = m.TaskRef(a.task_id, a.attempt)
        announce = asyncio.get_running_loop().call_later(STARTED_DELAY_S, self._announce_started, ref)
        try:
            outcome = await self._run_executor(a)
        finally:
            announce.cancel()
        await self._report(a, outcome)

    async def _execute_batch(self, batch: list[m.TaskAssignment]) -> None:
        """Several tasks in one executor call (one model load); one slot for the whole batch."""
        ex = self.executors[batch[0].type]
        for a in batch:
            self._announce_started(m.TaskRef(a.task_id, a.attempt))
        ctxs = [self._context(a) for a in batch]
        try:
            outcomes = await ex.run_batch(ctxs)  # type: ignore[attr-defined]
        except ExecutionError as exc:
            outcomes = [ExecOutcome("error", error=str(exc)) for _ in batch]
        except asyncio.CancelledError:
            cancelled = [a.task_id for a in batch if (r := self.running.get(a.task_id)) and r.cancel_reason]
            if not cancelled:
                raise
            outcomes = [self._batch_cancel_outcome(a, cancelled) for a in batch]
        for a, outcome in zip(batch, outcomes, strict=True):
            await self._report(a, outcome)

    def _batch_cancel_outcome(self, a: m.TaskAssignment, cancelled: list[str]) -> ExecOutcome:
        r = self.running.get(a.task_id)
        if r is not None and r.cancel_reason:
            return ExecOutcome("cancelled", error=r.cancel_reason)
        return ExecOutcome("error", output={"retryable": True},
                           error=f"stopped because {', '.join(cancelled)} in the same batch was cancelled")

    async def _report(self, a: m.TaskAssignment, outcome: ExecOutcome) -> None:
        """Sent at once. Written to the outbox too (no fsync of its own: see outbox_duckdb), so an
        unacked result is re-sent after a reconnect; the coordinator acks only after its fsync."""
        result = m.TaskResult(task_id=a.task_id, attempt=a.attempt, status=outcome.status,
                              started_at=outcome.started_at, finished_at=outcome.finished_at,
                              output=outcome.output, error=outcome.error, worker_id=self.config.worker_id)
        await self._apply_all(self.state.finished(result))

    def _context(self, a: m.TaskAssignment) -> TaskContext:
        return TaskContext(task_id=a.task_id, attempt=a.attempt, type=a.type, config=a.config,
                           timeout_s=a.timeout_s or self.config.task_timeout_s, max_memory_mb=a.max_memory_mb,
                           test_root=self.config.test_root, cache=a.cache, gang=a.gang, interface=self.interface,
                           allow_model_modules=self.config.allow_model_modules,
                           allow_test_options=self.config.allow_test_options,
                           progress=functools.partial(self._progress, m.TaskRef(a.task_id, a.attempt)))

    def _progress(self, ref: m.TaskRef, fraction: float, message: str) -> None:
        """An executor's progress report (called on the loop) as a ``progress`` message."""
        if self.state.attempt(ref.task_id, ref.attempt) is not None and self.registered.is_set():
            self._send(m.TaskProgress(ref, fraction, message))

    def _announce_started(self, ref: m.TaskRef) -> None:
        self._apply(self.state.announce(ref))

    async def _run_executor(self, a: m.TaskAssignment) -> ExecOutcome:
        started = self.clock()
        ex = self.executors.get(a.type)
        if ex is None:
            return ExecOutcome("error", error=f"this worker has no executor for task type {a.type!r}",
                               started_at=started, finished_at=self.clock())
        try:
            if a.bundle is None:
                return await ex.run(self._context(a))
            cred = await self.credentials.current()
            async with self.shipped.task(a.type, a.task_id, self.candidates.current, cred, a.bundle,
                                         a.python) as shipped:
                out = await ex.run(dataclasses.replace(self._context(a), **shipped))
            if "python_env" in shipped:  # its environment's digest, build time and whether it was cached
                out.output.setdefault("python_env", shipped["python_env"])
            return out
        except ExecutionError as exc:
            return ExecOutcome("error", error=str(exc), started_at=started, finished_at=self.clock())
        except asyncio.CancelledError:
            r = self.running.get(a.task_id)
            if r is None or r.cancel_reason is None:
                raise
            return ExecOutcome("cancelled", error=r.cancel_reason, started_at=started, finished_at=self.clock())

    async def _shutdown_tasks(self) -> None:
        if self._drain_task is not None:
            self._drain_task.cancel()  # stop() during a drain stops at once; a finished one is unaffected
            try:
                await self._drain_task
            except asyncio.CancelledError:
                pass
            except Exception:
                log.exception("the drain failed")
        self.state.closing()  # a cancelled run's slot must not start a queued one now
        runs = list(self._runs.values())
        for t in runs:
            t.cancel()
        for t in runs:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self.outbox.running_finished(self.state.running_refs())
        self._sampler.close()
        for ex in self.executors.values():
            await ex.close()
        await self.outbox.close()

    # ----------------------------------------------------------------- writing

    def _send(self, msg: m.Message) -> None:
        self._sendq.put_nowait(msg)

    async def _writer(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        assert self._channel is not None
        q = self._sendq
        while True:
            msg = await q.get()
            await ws.send_bytes(self._channel.seal(msg, self.clock()))
            q.task_done()

    async def _keepalive(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """How this side finds a dead coordinator, with the one number of the session's contract
        (``registered``): its TTL.

        - A dead host or path: the heartbeats this worker sends every interval stay unacknowledged,
          and the kernel ends the connection once data has waited a TTL for its ACK
          (``TCP_USER_TIMEOUT``, Linux; nothing for the coordinator's process to do).
        - A coordinator process that is alive to TCP but not answering (SIGSTOP, a stuck loop): a
          WebSocket ping every TTL (every half of it with ``--high-availability``); no pong within
          the TTL ends the session. Pings go every TTL, not every heartbeat, because each pong is
          a write the coordinator makes for every worker: at 10,000 idle workers, pinging every
          second made the pongs a third of its CPU (``benchmarks/fleet.py``).

        The coordinator never pings; each ping is also a sign of life to it. aiohttp's
        ``heartbeat=`` is not used: its pong timeout is half the interval and cannot be set, so a
        coordinator busy for half a second would cost a reconnect and every provisional
        assignment with it."""
        await self.registered.wait()
        _, ttl = self.liveness
        bound_unacknowledged(ws, ttl)
        period = ping_period(ttl, self.config.high_availability)
        while True:
            await asyncio.sleep(period)
            self._pong.clear()
            try:
                async with asyncio.timeout(ttl):
                    await ws.ping()  # waits while the send buffer is full, as a dead path leaves it
                    await self._pong.wait()
            except TimeoutError:
                raise ConnectionError(f"no pong from the coordinator within {ttl:g}s") from None

    async def _heartbeats(self) -> None:
        """A heartbeat every heartbeat interval of this session's contract (``registered``), and
        one at once when the state changes (limits crossed, cool-down over, draining). Sampling
        runs in a thread."""
        await self.registered.wait()
        loop = asyncio.get_running_loop()
        interval = self._beat_interval(self.liveness[0])
        period = min(interval, SAMPLE_PERIOD_S) if self.monitor.limits.active else interval
        sent_state, sent_at = "ready", loop.time()  # the coordinator starts a session as ready
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._beat_now.wait(), period)
            self._beat_now.clear()
            hb = self._heartbeat_msg(await asyncio.to_thread(self._sampler.sample), loop.time())
            if hb.state != sent_state or loop.time() - sent_at >= interval * 0.95:
                if hb.state != sent_state:
                    log.log(logging.INFO if hb.state == "ready" else logging.WARNING, "worker state %s -> %s%s",
                            sent_state, hb.state, f": {hb.reason}" if hb.reason else "")
                self._send(hb)
                sent_state, sent_at = hb.state, loop.time()

    def _beat_interval(self, granted: float) -> float:
        """Heartbeats go every interval the coordinator granted, every half of it with
        ``--high-availability`` (the TTL on both sides stays the granted one)."""
        return granted / 2 if self.config.high_availability else granted

    def _heartbeat_msg(self, sample: Sample, now: float) -> m.Heartbeat:
        refs = [m.TaskRef(tid, r.assignment.attempt) for tid, r in self.running.items()]
        state: m.WorkerState
        state, reason = self.monitor.update(sample, now)
        if self.draining:
            state, reason = "draining", self._drain_reason
        return m.Heartbeat(state=state, running=refs, cpu_percent=sample.cpu_percent,
                           memory_percent=sample.memory_percent,
                           free_slots=max(0, self.config.max_concurrent_tasks - len(refs)), reason=reason,
                           available_memory_mb=memory_for_tasks_mb(self.monitor.limits, sample),
                           gpu_percent=sample.gpu_percent, swap_percent=swap_percent(sample))

    async def _renew_tokens(self) -> None:
        await self.registered.wait()
        while True:
            delay = self.credentials.renew_in(self.clock())
            if delay is None:
                return
            await asyncio.sleep(delay)
            # retried until the token would expire; a refusal (AuthError) is not retried
            left = max(1, int((self.credentials.renew_in(self.clock()) or 0) * 1.5 / self.config.reconnect_interval_s))
            token = await retry_async(self.credentials.renew, backoff=Backoff(base_s=self.config.reconnect_interval_s),
                                      attempts=left, retry_on=(aiohttp.ClientError, OSError, asyncio.TimeoutError),
                                      what="token renewal")
            self._send(m.AuthRenew(token))


_HANDLERS: dict[type[Any], Callable[[WorkerAgent, m.Message], Awaitable[None]]] = {
    m.Registered: WorkerAgent._on_registered,
    m.AssignTasks: WorkerAgent._on_assign,
    m.ResultAck: WorkerAgent._on_ack,
    m.Confirm: WorkerAgent._on_confirm,
    m.Cancel: WorkerAgent._on_cancel,
    m.TakeBack: WorkerAgent._on_take_back,
    m.Drain: WorkerAgent._on_drain,
    m.ErrorMsg: WorkerAgent._on_error,
}

_INSTRUCTIONS: dict[type[Any], Callable[[WorkerAgent, Instruction], asyncio.Future[None] | None]] = {
    Send: WorkerAgent._do_send,
    Start: WorkerAgent._do_start,
    Kill: WorkerAgent._do_kill,
    Keep: WorkerAgent._do_keep,
    Forget: WorkerAgent._do_forget,
    ResendKept: WorkerAgent._do_resend_kept,
    RecordStarted: WorkerAgent._do_record_started,
    RecordFinished: WorkerAgent._do_record_finished,
    FlushSoon: WorkerAgent._do_flush_soon,
    ArmHold: WorkerAgent._do_arm_hold,
    DisarmHold: WorkerAgent._do_disarm_hold,
    Warn: WorkerAgent._do_warn,
}
