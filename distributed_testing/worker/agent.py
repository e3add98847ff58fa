"""The worker agent: connect, register, run assigned tasks in child processes, report results.

One reader coroutine receives every frame and dispatches by message type (``_HANDLERS``); one
writer drains an ordered queue, signing each frame as it is sent. Heartbeats come from this event
loop, never from task code (tasks run in children), so a task at 100 % CPU cannot make the worker
look dead. Results are written to the result store before they are sent and stay there until the
coordinator acknowledges them; after a reconnect the unacknowledged ones are sent again and
still-running tasks are re-announced in ``register``.

The bookkeeping (what runs, what is provisional, what waits to be sent or acknowledged) is the
pure ``core.state.WorkerState``; this module feeds it events, and ``runs.Runs`` executes its
instructions and runs the tasks. ``session.py`` opens the connection (``Dialer``), reads its
frames and notices a dead coordinator (``keepalive``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from ..config import WorkerConfig
from ..errors import ProtocolError
from ..process import aio
from ..process.netif import InterfaceError, interface_address, interface_of
from ..protocol import messages as m
from ..protocol.signing import Channel, derive_session_key
from ..retry import Backoff, RetriesExhausted, retry_async
from .auth import Credentials
from .bundles import ShippedCode
from .coordinators import Candidates
from .core.registration import shipped_network
from .core.state import Attempt, WorkerState
from .executors.base import Executor, advertised_handlers
from .limits import Limits, ResourceMonitor, Sample, Sampler, memory_for_tasks_mb, swap_percent
from .result_store import ResultStore
from .runs import Runs
from .session import (
    FIRST_RECONNECT_SPREAD_S,
    HA_FIRST_PAUSE_S,
    RETRY_ON,
    Dialer,
    NotTheLeader,
    SessionRejected,
    keepalive,
    next_frame,
    sealed,
    sealed_batch,
)

log = logging.getLogger(__name__)
# With resource limits, resources are sampled this often (heartbeats still go out every
# heartbeat_interval_s, and at once when the state changes).
SAMPLE_PERIOD_S = 1.0
# A drain waits at least this long for its results' acks, even when the tasks used the whole
# drain timeout.
FLUSH_MIN_S = 5.0
# When a session ends, its reader, writer, heartbeats and the rest are cancelled and waited for,
# for at most this long: one that outlives its cancel is logged and left, never waited for.
SESSION_STOP_S = 5.0


class WorkerAgent:
    def __init__(self, config: WorkerConfig, executors: dict[str, Executor], result_store: ResultStore,
                 hardware: dict[str, Any], capabilities: list[str], credentials: Credentials,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.executors = executors
        self.result_store = result_store
        self.hardware = hardware
        self.capabilities = capabilities
        self.credentials = credentials
        self.clock = clock
        self.state = WorkerState(batch_types=frozenset(t for t, ex in executors.items() if hasattr(ex, "run_batch")),
                                 slots=config.max_concurrent_tasks,
                                 chain_types=frozenset(t for t, ex in executors.items() if hasattr(ex, "run_chain")))
        self.registered = asyncio.Event()
        self.draining = False
        self.sessions = 0  # sessions established (registered) since start
        self._sendq: asyncio.Queue[m.Message] = asyncio.Queue()
        self._session_over = asyncio.Event()  # set when the current session ends (its queue goes nowhere)
        self._channel: Channel | None = None
        self._batches = False  # the coordinator of this session reads ``batch`` frames (``registered``)
        self._pong = asyncio.Event()  # set by the reader at each pong (see session.keepalive)
        # The liveness contract of the current session, from ``registered``: (interval, TTL).
        self.liveness: tuple[float, float] = (config.heartbeat_interval_s or 1.0, 3.0)
        self._stop = asyncio.Event()
        # Told when a stop begins, with the seconds its drain may take (0 for ``stop()``); the CLI
        # arms its last-resort exit with it (process.deadline).
        self.on_stop: Callable[[float], None] = lambda _seconds: None
        self.monitor = ResourceMonitor(Limits(
            max_cpu_percent=config.max_cpu_percent, max_memory_percent=config.max_memory_percent,
            max_gpu_percent=config.max_gpu_percent, memory_buffer=config.memory_buffer,
            cooldown_s=config.limit_cooldown_s, count_swap=config.enable_swap))
        self._sampler = Sampler(gpu=config.max_gpu_percent is not None)
        self._beat_now = asyncio.Event()  # set: send a heartbeat now (state changed)
        self._acked = asyncio.Event()  # set whenever an ack arrives
        self._drain_reason: str | None = None
        self._drain_task: asyncio.Task[list[m.TaskRef]] | None = None  # the one drain, once begun
        # the coordinators this worker may connect to, and the one of the current attempt
        self.candidates = Candidates(config.urls)
        self._dialer = Dialer(self.candidates, credentials.ssl)
        self.rng = random.Random()  # the first reconnect's jitter (first_reconnect_delay)
        self.shipped = ShippedCode.at_start(config, credentials.ssl)  # --accept-bundles, --sandbox
        self.runs = Runs(config, self.state, executors, result_store, send=self._send, registered=self.registered,
                         candidates=self.candidates, credentials=credentials, shipped=self.shipped, clock=clock)

    @property
    def running(self) -> dict[str, Attempt]:
        """The attempts running here, by task id (the state's; read-only for the shell)."""
        return self.state.running

    @property
    def interface(self) -> str | None:
        """The NIC training ranks bind: ``--interface``, else the one carrying this session's
        coordinator connection (set at each connect); reported in ``register``."""
        return self.runs.interface

    @interface.setter
    def interface(self, value: str | None) -> None:
        self.runs.interface = value

    # --------------------------------------------------------------- lifecycle

    async def run(self) -> None:
        """Connect and serve until ``stop()``; reconnect with backoff on connection loss, up to
        ``reconnect_attempts`` consecutive failures."""
        for ex in self.executors.values():
            await ex.start()
        await self.runs.recovery_report()
        backoff = Backoff(base_s=self.config.reconnect_interval_s, factor=2.0, max_s=max(30.0, self.config.reconnect_interval_s))
        try:
            async with self._dialer.client_session() as self._dialer.http:
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
            self._dialer.http = None
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

    async def _backoff_sleep(self, delay: float) -> None:
        """The reconnect backoff's wait; ``stop()`` ends it at once (a worker told to stop while
        the coordinator is unreachable would otherwise sit out a whole backoff, up to 30 s, first)."""
        await aio.wait_event(self._stop, delay)

    def stop(self) -> None:
        """Stop at once: running tasks are killed without a result (the coordinator requeues
        them after its grace period). ``drain()`` is the graceful way."""
        self._stop.set()
        self.on_stop(0.0)

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
        self.on_stop(timeout_s)
        self._beat_now.set()
        log.info("draining (%s): %d task(s) running, up to %gs to finish", reason, len(self.running), timeout_s)
        while (busy := self.runs.busy()) and (left := deadline - loop.time()) > 0:
            await asyncio.wait(busy, timeout=left)  # and again for tasks assigned meanwhile
        handed = await self._hand_back(reason, timeout_s)
        await self._await_acks(max(deadline - loop.time(), FLUSH_MIN_S))
        if self.registered.is_set():
            self._send(m.Goodbye(f"worker stopped: {reason}"))
            await self._flush(FLUSH_MIN_S)
        log.info("drain complete; unregistered from the coordinator")
        self.stop()
        return handed

    async def _flush(self, timeout_s: float) -> None:
        """Wait until the writer has sent what is queued, for at most ``timeout_s``, or until the
        session ends first (its writer is gone: what it had not sent is never sent)."""
        sent = asyncio.ensure_future(self._sendq.join())
        over = asyncio.ensure_future(self._session_over.wait())
        try:
            await asyncio.wait({sent, over}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sent.cancel()
            over.cancel()

    async def _hand_back(self, reason: str, timeout_s: float) -> list[m.TaskRef]:
        """Kill the tasks still running and tell the coordinator they were not finished."""
        refs, kills = self.state.hand_back()
        if not refs:
            return []
        tasks = self.runs.of(kills)
        self.runs.apply(kills)  # no cancel_reason: no result is reported for them
        await self.runs.stopped(tasks, "while being handed back")
        self.runs.apply(self.state.handed_back(refs))  # stopped on purpose: not a crash
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
        # results sent before their confirm are not in the result store yet, but are waited for all the same
        while (unacked := [*await self.result_store.unacked(), *self.state.unlogged.values()]):
            if (left := until - loop.time()) <= 0:
                log.warning("%d result(s) not acknowledged before the drain deadline; %s", len(unacked),
                            "they stay in the result store" if self.config.db_path else "they are lost (no --db-path)")
                return
            self._acked.clear()
            await aio.wait_event(self._acked, left)

    async def _connect_once(self) -> None:
        if self._stop.is_set():
            return  # stopped during the backoff: no further attempt
        assert self._dialer.http is not None, "only run() connects"
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
        ws = await self._dialer.open(url, cred)
        async with ws:
            session_id = self._dialer.session_id()
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

    async def _serve(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._session_over = asyncio.Event()
        self._send(self._register_msg(self._rendezvous_address(ws)))
        writer = asyncio.create_task(self._writer(ws), name="worker-writer")
        beats = asyncio.create_task(self._heartbeats(), name="worker-heartbeats")
        renew = asyncio.create_task(self._renew_tokens(), name="worker-token-renewal")
        stopper = asyncio.create_task(self._stop.wait(), name="worker-stop-wait")
        learn = asyncio.create_task(self._learn_group(), name="worker-learn-group")
        pinger = asyncio.create_task(self._keepalive(ws), name="worker-keepalive")
        reader = asyncio.create_task(self._reader(ws), name="worker-reader")
        ending = (reader, writer, pinger)
        try:
            done, _ = await asyncio.wait({*ending, stopper}, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not stopper and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        finally:
            self.registered.clear()
            self.runs.outputs.session_ended()  # the next coordinator holds none of the tasks' output
            self.runs.reports.session_ended()
            self._session_over.set()
            self.runs.apply(self.state.session_ended())
            await _cancel_all((beats, renew, learn, stopper, *ending), quiet=ending)  # those re-raised above

    async def _learn_group(self) -> None:
        """``--high-availability``: once registered, add every member ``GET /api/v1/cluster``
        lists to the candidates (a failure is logged: the configured ones remain)."""
        await self.registered.wait()
        if not self.config.high_availability:
            return
        url = self.candidates.current
        view = await self._dialer.cluster_view(url, await self.credentials.current())
        new = self.candidates.learn(view, url) if view is not None else []
        if new:
            log.info("learned coordinator(s) %s from %s; known: %s", ", ".join(new), url, ", ".join(self.candidates.urls))

    def _register_msg(self, address: str = "") -> m.Register:
        return m.Register(worker_id=self.config.worker_id, name=self.config.name, protocol_version=m.PROTOCOL_VERSION,
                          hardware=self.hardware, capabilities=self.capabilities, tags=list(self.config.tags),
                          max_concurrent=self.config.max_concurrent_tasks,
                          memory_gb=float(self.hardware.get("memory_gb", 0.0)),
                          running=self.state.running_refs(),
                          address=address, interface=self.interface, finished=self.result_store.unacked_refs(),
                          abandoned=list(self.state.abandoned), model_modules=list(self.config.allow_model_modules),
                          accept_bundles=self.shipped.accepting,
                          heartbeat_interval_s=self.config.heartbeat_interval_s or 0.0,
                          handlers=advertised_handlers(self.executors), pipeline_depth=self.config.pipeline_depth,
                          task_network=shipped_network(self.config.sandbox, self.config.task_network), batches=True,
                          reports=True)

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
        while (frame := await next_frame(ws, self._pong)) is not None:
            try:
                msg = self._channel.open(frame, self.clock())
            except ProtocolError as exc:
                violations += 1
                log.warning("rejected frame from coordinator (%s): %s", exc.code, exc)
                self._send(m.ErrorMsg(exc.code, str(exc)))
                if violations >= 5:
                    raise
                continue
            for one in msg.messages if isinstance(msg, m.Batch) else (msg,):  # a batch: each as if alone
                handler = _HANDLERS.get(type(one))
                if handler is None:
                    raise ProtocolError(f"unexpected {type(one).__name__} from coordinator")
                await handler(self, one)

    async def _on_registered(self, msg: m.Message) -> None:
        assert isinstance(msg, m.Registered)
        self.liveness = (msg.heartbeat_interval_s, msg.worker_ttl_s)
        self._batches = msg.batches
        self.runs.reports_kept = msg.reports
        self.candidates.connected(self.candidates.current)
        self.credentials.coordinator_url = self.candidates.current  # token renewals go where the session is
        log.info("registered with coordinator as %s (session %s); heartbeat every %gs, declared dead after %gs "
                 "without a frame", msg.worker_id, msg.session_id, msg.heartbeat_interval_s, msg.worker_ttl_s)
        self.registered.set()
        self.sessions += 1
        if self.draining:
            self._beat_now.set()  # a new session starts as ready: say at once that we are not
        await self.runs.apply_all(self.state.registered())

    async def _on_assign(self, msg: m.Message) -> None:
        assert isinstance(msg, m.AssignTasks)
        self.runs.apply(self.state.assign(msg))

    async def _on_confirm(self, msg: m.Message) -> None:
        assert isinstance(msg, m.Confirm)
        await self.runs.apply_all(self.state.confirm(msg.upto))

    async def _on_ack(self, msg: m.Message) -> None:
        assert isinstance(msg, m.ResultAck)
        await self.runs.apply_all(self.state.ack(msg))
        self._acked.set()

    async def _on_cancel(self, msg: m.Message) -> None:
        assert isinstance(msg, m.Cancel)
        await self.runs.apply_all(self.state.cancel(msg, self.clock()))

    async def _on_take_back(self, msg: m.Message) -> None:
        assert isinstance(msg, m.TakeBack)
        self.runs.apply(self.state.take_back(msg))

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

    async def _shutdown_tasks(self) -> None:
        if self._drain_task is not None:
            self._drain_task.cancel()  # stop() during a drain stops at once; a finished one is unaffected
            try:
                await self._drain_task
            except asyncio.CancelledError:
                pass
            except Exception:
                log.exception("the drain failed")
        await self.runs.stop_all()
        self._sampler.close()
        for ex in self.executors.values():
            await ex.close()
        await self.result_store.close()

    # ----------------------------------------------------------------- writing

    def _send(self, msg: m.Message) -> None:
        self._sendq.put_nowait(msg)

    async def _writer(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Sends what is queued: all that waits at once in one ``batch`` frame when the coordinator
        reads them (``sealed_batch``), else one frame per message."""
        assert self._channel is not None
        q = self._sendq
        while True:
            queued = [await q.get()]
            while not q.empty():
                queued.append(q.get_nowait())
            if self._batches and len(queued) > 1:
                frames = sealed_batch(self._channel, queued, self.clock())
            else:
                frames = [f for msg in queued for f in sealed(self._channel, msg, self.clock())]
            for frame in frames:
                await ws.send_bytes(frame)
            for _ in queued:
                q.task_done()

    async def _keepalive(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        """Once registered, ``session.keepalive`` with this session's TTL."""
        await self.registered.wait()
        await keepalive(ws, self.liveness[1], self.config.high_availability, self._pong)

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
            await aio.wait_event(self._beat_now, period)
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


async def _cancel_all(tasks: tuple[asyncio.Task[Any], ...], quiet: tuple[asyncio.Task[Any], ...]) -> None:
    """Cancel ``tasks`` and wait for them, for at most ``SESSION_STOP_S``: the end of a session
    (and so the worker's stop) never waits for ever on one that does not stop. An error a task
    ended with is logged, unless it is one of ``quiet``."""
    for t in tasks:
        t.cancel()
    done, stuck = await asyncio.wait(tasks, timeout=SESSION_STOP_S)
    for t in done:
        if not t.cancelled() and (exc := t.exception()) is not None and t not in quiet:
            log.error("%s stopped: %s", t.get_name(), exc)
    for t in stuck:
        log.error("%s still running %gs after it was cancelled; not waiting for it any longer", t.get_name(),
                  SESSION_STOP_S)


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
