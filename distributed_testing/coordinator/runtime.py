"""Glue between the pure state machine and the world: executes its commands.

``Runtime.execute(cmds)`` makes the ``Save`` records durable through the store, and only when they
are on disk runs the other commands (sends, closes, notifications) in order. It never awaits the
write itself, so a WebSocket reader keeps reading while a group commit is in flight.

One exception, so a worker runs a task during the coordinator's fsync instead of after it: an
assignment goes out at once as *provisional* (numbered per session) when nothing else for that
session is waiting, and a ``confirm`` follows once its records are durable. The worker may send
a provisional attempt's result before the confirm (it is journalled after the assignment, so it
cannot be durable first) but keeps it for a re-send only once confirmed, and abandons the attempt
if the session ends first, so an attempt lost in a crash leaves no result, and attempt numbers
are never reused in anything a worker reports. Messages to one session keep their order: an
assignment never overtakes a command of an earlier event (a ``cancel`` of the same task's
previous attempt, say) or an earlier command of its own event, except a ``result_ack`` (see
``_orders``).

Memory holds the active work (``state``'s docstring): once an event's records are durable, the
tasks they finished are handed to ``state.retire`` (after that event's notifications ran), and the
oldest finished tasks leave memory. Their rows stay in the store, read back through ``views``.

A write the store could not make is fatal (see ``supervisor``): the records' state is already in
memory, so the coordinator stops and its restart replays the journal. The future of the request
that made it fails (no success answer for something not on disk), and no command of that event
is sent.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import msgspec
from aiohttp import web

from ..config import CoordinatorConfig
from ..errors import Fenced, NotFound, StoreError
from ..protocol import messages as m
from ..protocol.signing import Channel
from ..security import auth as sa
from ..security import keys as sk
from ..security import secret_file, tokens
from ..security.roles import Role
from . import views
from .core.commands import CloseWorker, Command, Notify, Refused, Save, Send
from .core.entities import Task
from .core.policy import Policy
from .core.quota import MIB
from .core.rows import KeyRow, MetaRow, Record, TaskRow
from .core.state import CoordinatorState
from .events import EventHub
from .group import Group, LeadershipLost, NotLeader, default_advertise_url
from .metrics import Metrics
from .store import blobs_for
from .store.base import TERMINAL, Store
from .supervisor import Supervisor
from .tasklogs import TaskLogs, TestReports

log = logging.getLogger(__name__)


class Outbox:
    """An unbounded FIFO read by one writer coroutine: ``asyncio.Queue``'s ``put_nowait``, ``get``,
    ``get_nowait`` and ``empty`` in a fraction of its memory (one deque, and one future while the
    writer waits, where a Queue keeps four deques and an Event): a coordinator holds one per
    connected worker."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[m.Message | None] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: m.Message | None) -> None:
        self._items.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    def get_nowait(self) -> m.Message | None:
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.popleft()

    async def get(self) -> m.Message | None:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()


@dataclass(eq=False)
class Session:
    """One worker's live WebSocket: its channel and an ordered outbound queue."""

    session_id: str
    worker_id: str
    key_id: str
    channel: Channel
    outbox: Outbox = field(default_factory=Outbox)
    closing: str | None = None
    token_exp: float | None = None
    deferred: int = 0  # commands for this session waiting for their event's records to be durable
    provisional: int = 0  # provisional assignments sent on this session so far (see Runtime.execute)
    batches: bool = False  # the worker reads ``batch`` frames (its register said so): the writer may send them

    def send(self, msg: m.Message) -> None:
        self.outbox.put_nowait(msg)

    def close(self, reason: str) -> None:
        self.closing = reason
        self.outbox.put_nowait(None)


class Runtime:
    def __init__(self, config: CoordinatorConfig, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self._completed: asyncio.Future[None] | None = None
        self.state = CoordinatorState(Policy(worker_grace_s=config.worker_grace_s, worker_ttl_s=config.worker_ttl_s,
                                             worker_retention_s=config.worker_retention_s,
                                             heartbeat_interval_s=config.heartbeat_interval_s,
                                             max_heartbeat_interval_s=config.max_heartbeat_interval_s,
                                             batch_max=config.batch_max, batch_wait_s=config.batch_wait_s,
                                             gang_max_wait_s=config.gang_max_wait_s, gang_port_range=config.gang_ports,
                                             strict=config.strict, max_queued_per_key=config.max_queued_per_key,
                                             max_payload_bytes_per_key=config.max_payload_mb_per_key * MIB))
        self.sessions: dict[str, Session] = {}
        self.keys: dict[str, sk.KeyRecord] = {}
        self.blobs = blobs_for(store)
        self.jwt_secret = b""
        self._waiters: dict[str, list[_Waiter]] = defaultdict(list)
        self.stopping = False  # shutdown() ran: no new ?wait waits
        # Tasks whose outcome is set in memory but whose Notify waits for the records to be durable:
        # a ?wait request arriving in between waits for that Notify too.
        self._undurable: Counter[str] = Counter()
        self.stats: dict[str, int] = defaultdict(int)
        self._supervisor: Supervisor | None = None
        self.metrics = Metrics()
        self.metrics.bind(self)
        self.events = EventHub()
        self.logs = TaskLogs()  # running attempts' output (tasklogs.py)
        self.reports = TestReports()  # running attempts' ended tests (tasklogs.py)
        self.activity = views.Activity()  # the overview's last hour (seeded from the store at start)
        self._loads_sent: dict[str, tuple[Any, ...]] = {}
        self._loads_at = 0.0
        # HA (coordinator/group.py): the group this coordinator is a member of, None for a lone
        # coordinator (DuckDB or memory store), which always leads. advertise_url: where clients
        # reach this process (--advertise-url, else set once the port is bound).
        self.group: Group | None = None
        self.advertise_url: str | None = config.advertise_url
        self.bound = asyncio.Event()  # set by bind() once the server listens

    def bind(self, scheme: str, host: str, port: int) -> None:
        """The server listens on ``port``: the advertised URL is known (``--advertise-url``, else
        derived from the bind address; see ``group.default_advertise_url``)."""
        if self.advertise_url is None:
            self.advertise_url = default_advertise_url(scheme, host, port)
        self.bound.set()

    def leading(self) -> bool:
        """Whether this coordinator may act (dispatch, send, write) now. A lone coordinator always
        may; a group member only while it holds the lease (one monotonic comparison)."""
        return self.group is None or self.group.leading

    def not_leader(self, path_qs: str = "") -> NotLeader:
        if self.group is None:
            return NotLeader(None, path_qs)
        return NotLeader(self.group.leader_url, path_qs, self.group.silent_urls())

    def lost_leadership(self, reason: str) -> None:
        """Stop this leader term at once (the CLI starts a new standby term; see cli/coordinator.py)."""
        self.supervisor.fail("lost the leadership", LeadershipLost(reason))

    @property
    def supervisor(self) -> Supervisor:
        """Created on first use, inside the running loop."""
        if self._supervisor is None:
            self._supervisor = Supervisor()
        return self._supervisor

    def persist(self, records: list[Record], linger_s: float = 0.0) -> asyncio.Future[None]:
        """``store.append``, where a failure, now or when the write completes, is fatal (see the
        module doc). The future fails too, so a caller that awaits it answers with an error."""
        durable = self._append(records, linger_s)
        durable.add_done_callback(functools.partial(self._check_written, len(records), time.perf_counter()))
        return durable

    def _append(self, records: list[Record], linger_s: float) -> asyncio.Future[None]:
        """``store.append`` (a failure now is fatal), and the change feed's publication once the
        records are durable; the caller checks the write (``_check_written``) when it completes."""
        try:
            durable = self.store.append(records, linger_s=linger_s)
        except Exception as exc:  # the state already holds what these records say: memory and disk differ
            self.supervisor.fail(f"persisting {len(records)} records failed", exc)
            raise
        if self.events.active:  # the change feed costs nothing while nobody listens
            durable.add_done_callback(functools.partial(self._publish, records))
        return durable

    def _publish(self, records: list[Record], f: asyncio.Future[None]) -> None:
        if not f.cancelled() and f.exception() is None:
            self.events.publish_records(records)

    def publish_loads(self, now: float) -> None:
        """At most once a second while someone listens: one ``load`` event with the workers whose
        heartbeat-reported load, health or last heartbeat changed since the last one."""
        if not self.events.active or now - self._loads_at < 1.0:
            return
        self._loads_at = now
        changed: dict[str, Any] = {}
        for w in self.state.workers.values():
            state = w.state
            sig = (state, w.health_reason, w.last_seen, tuple(sorted(w.load.items())), len(w.view.running))
            if self._loads_sent.get(w.worker_id) != sig:
                self._loads_sent[w.worker_id] = sig
                changed[w.worker_id] = {"state": state, "reason": w.health_reason, "last_seen": w.last_seen,
                                        "load": w.load, "running": sorted(w.view.running)}
        if len(self._loads_sent) > len(self.state.workers):  # workers forgotten (--worker-retention)
            self._loads_sent = {k: v for k, v in self._loads_sent.items() if k in self.state.workers}
        if changed:
            self.events.publish("load", {"workers": changed})

    def _check_written(self, n: int, started: float, f: asyncio.Future[None]) -> None:
        self.metrics.store_write.observe(time.perf_counter() - started)
        self.metrics.store_records.observe(n)
        if f.cancelled():
            self.supervisor.fail(f"persisting {n} records failed", StoreError("the store cancelled the write"))
        elif (exc := f.exception()) is not None:
            if self.group is not None and (isinstance(exc, Fenced) or not self.group.leading):  # another member leads
                self.lost_leadership(f"the store refused a write after the lease ran out: {exc}")
            else:
                self.supervisor.fail(f"persisting {n} records failed", exc)

    # ------------------------------------------------------------- commands

    def _done(self) -> asyncio.Future[None]:
        """A completed future, shared: what ``execute`` returns when nothing waits on a write.
        Made once per loop: on Python 3.11 ``asyncio.get_running_loop()`` is a ``getpid`` system
        call, 6 % of the coordinator's CPU at 3,000 idle workers when every heartbeat made one
        (``py-spy --native``)."""
        done = self._completed
        if done is None or done.get_loop().is_closed():
            done = self._completed = asyncio.get_running_loop().create_future()
            done.set_result(None)
        return done

    def execute(self, cmds: list[Command], linger_s: float = 0.0) -> asyncio.Future[None]:
        """Persist the Save records, then run the rest; the future completes after both.

        ``linger_s``: the caller needs the records durable only together with later ones (a
        ``?wait`` submission, answered only with its outcome), so their write may wait up to
        that long for the next records (a fast task's result) and share one fsync with them. Only
        when nothing else waits for them (every assignment went out provisionally)."""
        if not self.leading():  # a replaced leader writes nothing and sends nothing (docs/architecture.md)
            raise self.not_leader()
        if not cmds:  # most heartbeats: nothing to persist or send
            return self._done()
        records = _coalesce([c.record for c in cmds if isinstance(c, Save)])
        rest: list[Command] = [c for c in cmds if not isinstance(c, Save)]
        self._observe_assignments(rest)
        if not records:
            self._run(rest)
            return self._done()
        loop = asyncio.get_running_loop()
        rest, provisional = self._plan_provisional(rest)
        started = time.perf_counter()
        durable = self._append(records, 0.0 if rest else linger_s)  # may raise: nothing sent yet
        ended = [r.task_id for r in records if isinstance(r, TaskRow) and r.state in TERMINAL]
        finished: asyncio.Future[None] = loop.create_future()
        notified = [tid for c in rest if isinstance(c, Notify) for tid in c.task_ids]
        undurable = self._undurable
        undurable.update(notified)
        confirms = self._send_provisional(provisional)
        waiting = [s for c in rest if _orders(c) and (s := self.sessions.get(c.worker_id))]
        for s in waiting:
            s.deferred += 1

        def after(f: asyncio.Future[None]) -> None:
            self._check_written(len(records), started, f)  # one callback for both: persist()'s check first
            for tid in notified:
                if (left := undurable[tid] - 1) > 0:
                    undurable[tid] = left
                else:
                    del undurable[tid]
            for s in waiting:
                s.deferred -= 1
            if f.cancelled() or f.exception() is not None:  # fatal: persist() reported it
                exc = f.exception() if not f.cancelled() else None
                for s in confirms:  # their provisional assignments may never be durable: abandon them
                    s.close("the coordinator could not persist an assignment")
                if not finished.done():  # its caller may have been cancelled
                    finished.set_exception(exc or StoreError("the store cancelled the write"))
                    finished.exception()  # reported by the supervisor; an awaiting caller still gets it
                return
            if not finished.done():  # first, so a request waiting on it answers before the sends go out
                finished.set_result(None)
            if not self.leading():  # durable (so acknowledged), but the lease ran out meanwhile: nothing goes out
                for s in confirms:
                    s.close("this coordinator is no longer the leader")
                return
            for s, upto in confirms.items():
                if self.sessions.get(s.worker_id) is s and not s.closing:
                    s.send(m.Confirm(upto))
            self._run(rest)
            if ended:  # durable now: they may leave memory (the waiters woken above look them up first)
                self.state.retire(ended)
                self.logs.end(ended)  # their results hold their output now
                self.reports.end(ended)

        durable.add_done_callback(after)
        return finished

    def _observe_assignments(self, cmds: Sequence[Command]) -> None:
        """Count each assigned attempt and its submit→assign latency (``metrics``)."""
        now: float | None = None
        for c in cmds:
            if isinstance(c, Send) and isinstance(c.msg, m.AssignTasks):
                now = self.clock() if now is None else now
                self.metrics.dispatched.inc(len(c.msg.tasks))
                for a in c.msg.tasks:
                    if (t := self.state.tasks.get(a.task_id)) is not None:
                        self.metrics.assign_latency.observe(max(0.0, now - t.submitted_at))

    def _plan_provisional(self, cmds: Sequence[Command]) -> tuple[list[Command], list[tuple[Session, m.AssignTasks]]]:
        """Split off each assignment that may go out at once, as provisional: its session has
        nothing waiting, and no earlier command for the same worker stays behind. Sends nothing."""
        later: list[Command] = []
        now: list[tuple[Session, m.AssignTasks]] = []
        blocked: set[str] = set()
        for c in cmds:
            if isinstance(c, Send) and isinstance(c.msg, m.AssignTasks) and c.worker_id not in blocked:
                s = self.sessions.get(c.worker_id)
                if s is not None and s.deferred == 0 and not s.closing:
                    now.append((s, c.msg))
                    continue
            if _orders(c):
                blocked.add(c.worker_id)
            later.append(c)
        return later, now

    @staticmethod
    def _send_provisional(assignments: list[tuple[Session, m.AssignTasks]]) -> dict[Session, int]:
        """Send these numbered as provisional; return the number to confirm per session."""
        confirms: dict[Session, int] = {}
        for s, msg in assignments:
            s.provisional += 1
            s.send(msgspec.structs.replace(msg, provisional=s.provisional))
            confirms[s] = s.provisional
        return confirms

    def _run(self, cmds: Sequence[Command]) -> None:
        for c in cmds:
            if isinstance(c, Send):
                s = self.sessions.get(c.worker_id)
                if s is None:
                    log.debug("dropping %s for disconnected worker %s", type(c.msg).__name__, c.worker_id)
                else:
                    s.send(c.msg)
            elif isinstance(c, CloseWorker):
                s = self.sessions.get(c.worker_id)
                if s is not None and s.session_id == c.session_id:
                    log.warning("worker %s: closing its session: %s", c.worker_id, c.reason)
                    s.close(c.reason)
            elif isinstance(c, Notify):
                self._observe_outcomes(c.task_ids)
                for tid in c.task_ids:
                    for w in self._waiters.pop(tid, []):
                        w.done_one(tid)
            elif isinstance(c, Refused):
                self._refused(c)
            else:
                raise TypeError(f"unhandled command {c!r}")

    def _observe_outcomes(self, task_ids: Sequence[str]) -> None:
        """The submit→outcome latency of each of these tasks whose outcome is now durable, and
        the overview's count of finished tasks."""
        now = self.clock()
        for tid in task_ids:
            t = self.state.tasks.get(tid)
            if t is not None and t.outcome is not None:
                self.metrics.outcome_latency.observe(max(0.0, now - t.submitted_at))
                self.activity.finished(t)

    def _refused(self, c: Refused) -> None:
        """A worker reported on an attempt it was never given: log, count, and tell it (the
        ``result_ack`` the state machine sent settles a refused result in its outbox)."""
        self.stats[f"refused_{c.what}"] += 1
        log.warning("worker %s: refused %s for task %s attempt %d: %s", c.worker_id, c.what, c.task.task_id,
                    c.task.attempt, c.reason)
        s = self.sessions.get(c.worker_id)
        if s is not None:
            s.send(m.ErrorMsg(f"{c.what}_refused", f"{c.what} for task {c.task.task_id!r} attempt {c.task.attempt} "
                              f"refused: {c.reason}; not stored"))

    def undurable(self, task_id: str) -> bool:
        """Whether ``task_id``'s outcome is set in memory while its records are still being written."""
        return task_id in self._undurable

    async def load_tasks(self, task_ids: Sequence[str]) -> None:
        """Read the tasks among ``task_ids`` that left memory back from the store
        (``views.load_missing``) before an event that names them."""
        await views.load_missing(self.state, self.store, task_ids)

    async def settled(self, task_ids: list[str], bound_s: float) -> list[Task]:
        """Each of ``task_ids`` (in memory, or read back if it left memory) once none of them has
        an outcome whose records are still being written (waiting at most ``bound_s`` at a
        time): what a ``?wait`` answer may show. A wait that ended (its time up, or
        :meth:`shutdown`) while such a write was in flight waits for it here, so an answer never
        shows an outcome that a crash could still take back. Nothing is awaited between the last
        look and the read."""
        while True:
            await self.load_tasks(task_ids)  # awaits nothing when all are in memory
            writing = [tid for tid in task_ids if tid in self._undurable]
            if not writing:
                return [self.state.get(tid) for tid in task_ids]
            await self.wait_terminal(writing, bound_s)

    async def wait_terminal(self, task_ids: Sequence[str], timeout: float) -> None:
        """Wait until every one of these tasks is in a terminal state that is on disk (or ``timeout``
        elapses): an outcome set in memory whose records are still being written is waited for.

        One future for the whole call, awaited directly: the waiting request resumes one loop
        iteration after the Notify (``asyncio.wait`` over a future per task took three)."""
        open_ids = {tid for tid in task_ids
                    if (t := self.state.tasks.get(tid)) is not None and (t.outcome is None or tid in self._undurable)}
        if not open_ids:
            return
        w = _Waiter(open_ids, asyncio.get_running_loop().create_future())
        for tid in open_ids:
            self._waiters[tid].append(w)
        try:
            async with asyncio.timeout(timeout):
                await w.fut
        except TimeoutError:
            pass
        finally:
            for tid in w.remaining:
                lst = self._waiters.get(tid)
                if lst and w in lst:
                    lst.remove(w)
                    if not lst:
                        del self._waiters[tid]

    async def wait_finished(self, task_ids: Sequence[str], timeout: float) -> None:
        """A ``?wait`` request's wait: :meth:`wait_terminal`, or nothing once :meth:`shutdown` ran
        (a request that reaches its wait after that is answered at once, as those waiting were)."""
        if not self.stopping:
            await self.wait_terminal(task_ids, timeout)

    def shutdown(self, reason: str) -> None:
        """Close every worker session and answer every ``?wait`` request now (with the state as
        it is), and any that reaches its wait later, so the HTTP server's shutdown does not wait
        for them."""
        self.stopping = True
        for s in list(self.sessions.values()):
            s.close(reason)
        self.events.close()
        waiters = {id(w): w for ws in self._waiters.values() for w in ws}
        self._waiters.clear()
        for w in waiters.values():
            if not w.fut.done():
                w.fut.set_result(None)

    # ------------------------------------------------------------- security

    def lookup_key(self, key_id: str) -> sk.KeyRecord | None:
        return self.keys.get(key_id)

    def authenticate(self, credential: str) -> sa.Principal:
        return sa.authenticate(credential, self.lookup_key, self.jwt_secret, self.clock())

    async def save_key(self, rec: sk.KeyRecord) -> None:
        self.keys[rec.key_id] = rec
        await self.persist([key_row(rec)])

    async def revoke_key(self, key_id: str) -> sk.KeyRecord:
        rec = self.keys.get(key_id)
        if rec is None:
            raise NotFound(f"no key {key_id!r}")
        rec = sk.revoke(rec, self.clock())
        await self.save_key(rec)
        for s in list(self.sessions.values()):
            if s.key_id == key_id:
                s.close(f"key {key_id} revoked")
        self.events.end_key(key_id)
        return rec

    async def ensure_secret(self, meta: dict[str, str]) -> None:
        """Load the token-signing secret from its own file (created on the first start), never
        from the store: a secret an older version kept in ``meta`` is moved to the file and
        deleted from the store (see ``security.secret_file``)."""
        legacy = meta.get(secret_file.LEGACY_META_KEY) or None
        path = self.config.jwt_secret_path
        if path is None:  # memory:// store: nothing outlives the process, the secret included
            self.jwt_secret = tokens.generate_secret()
            return
        self.jwt_secret = await asyncio.to_thread(secret_file.load_or_create, path, legacy)
        if legacy is not None:
            await self.persist([MetaRow(secret_file.LEGACY_META_KEY, "")])  # an empty value deletes it

    def tick(self) -> None:
        if not self.leading():
            return
        self.execute(self.state.tick(self.clock()))
        now = self.clock()
        self.activity.sample_depth(now, self.state.counts.get("pending", 0))
        self.publish_loads(now)
        for s in list(self.sessions.values()):
            if s.token_exp is not None and now > s.token_exp:
                s.close("session token expired and was not renewed")


RUNTIME = web.AppKey("runtime", Runtime)


def _orders(c: Command) -> TypeGuard[Send | CloseWorker]:
    """Whether a later assignment to the same worker must not overtake ``c``. A ``result_ack`` may
    be overtaken (it only ends the worker's short result hold sooner or later), so a busy worker,
    whose results are always being acknowledged, still gets provisional assignments."""
    return isinstance(c, CloseWorker) or (isinstance(c, Send) and not isinstance(c.msg, m.ResultAck))


@dataclass(eq=False)
class _Waiter:
    """One ``wait_terminal`` call: the task ids still open, and the future set when none are."""

    remaining: set[str]
    fut: asyncio.Future[None]

    def done_one(self, task_id: str) -> None:
        self.remaining.discard(task_id)
        if not self.remaining and not self.fut.done():
            self.fut.set_result(None)


def _coalesce(records: list[Record]) -> list[Record]:
    """Keep only the last row of each task: one event (a submit that dispatches at once) can
    change a task twice, and only its final state needs to reach the journal."""
    last = {r.task_id: i for i, r in enumerate(records) if isinstance(r, TaskRow)}
    if len(last) == sum(isinstance(r, TaskRow) for r in records):
        return records
    return [r for i, r in enumerate(records) if not isinstance(r, TaskRow) or last[r.task_id] == i]


def key_row(rec: sk.KeyRecord) -> KeyRow:
    return KeyRow(key_id=rec.key_id, name=rec.name, role=rec.role, hash=rec.hash, created_at=rec.created_at,
                  expires_at=rec.expires_at, revoked_at=rec.revoked_at, allow_code=rec.allow_code)


def key_record(row: KeyRow) -> sk.KeyRecord:
    return sk.KeyRecord(key_id=row.key_id, name=row.name, role=Role(row.role), hash=row.hash, created_at=row.created_at,
                        expires_at=row.expires_at, revoked_at=row.revoked_at, allow_code=row.allow_code)


def key_view(rec: sk.KeyRecord) -> dict[str, Any]:
    return {"key_id": rec.key_id, "name": rec.name, "role": rec.role, "created_at": rec.created_at,
            "expires_at": rec.expires_at, "revoked_at": rec.revoked_at, "allow_code": rec.allow_code}
