"""What the coordinator's scheduling core (:mod:`.state`) works on and emits: the commands its
events return (:class:`Save` records first, then :class:`Send` / :class:`CloseWorker` /
:class:`Notify` / :class:`Refused` for the transport), its :class:`Policy` and the liveness
contract it grants, and the :class:`Task` (with its :class:`Gang` placement) and :class:`Worker`
it keeps in memory with the store rows they become. Plain data: no scheduling decisions here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ...errors import ValidationError
from ...protocol import messages as m
from ...retry import Backoff
from ...tasks import spec as specs
from ...tasks.usercode import model_module
from .pipeline import Pace
from .placement import NO_REQUIREMENTS, ReqKey, WorkerView, requirement_key
from .rows import Record, TaskRow, WorkerRow


@dataclass(frozen=True)
class Save:
    record: Record


@dataclass(frozen=True)
class Send:
    worker_id: str
    msg: m.Message


@dataclass(frozen=True)
class CloseWorker:
    worker_id: str
    session_id: str
    reason: str


@dataclass(frozen=True)
class Notify:
    task_ids: tuple[str, ...]


@dataclass(frozen=True)
class Refused:
    """A worker spoke for something it does not hold (``what``: result, started, progress); the
    transport logs it, counts it and tells the worker. Nothing of it was stored."""

    worker_id: str
    what: str
    task: m.TaskRef
    reason: str


Command = Save | Send | CloseWorker | Notify | Refused


@dataclass(frozen=True)
class Liveness:
    """The liveness contract of one worker session: it heartbeats every
    ``interval_s``; it is dead after ``ttl_s`` without any frame from it."""

    interval_s: float
    ttl_s: float


@dataclass(frozen=True)
class Policy:
    worker_grace_s: float = 10.0
    # a worker disconnected and not heard from for this long is forgotten (its id, row and key
    # binding; tasks and results it ran stay); 0: never
    worker_retention_s: float = 86400.0
    # Liveness (docs/operations.md#liveness). A worker that asks for no interval gets
    # (heartbeat_interval_s, worker_ttl_s); one that asks for a longer interval gets a TTL of as
    # many intervals (worker_ttl_s / heartbeat_interval_s, 3 by default), never below worker_ttl_s;
    # one asking for more than max_heartbeat_interval_s is refused at registration.
    heartbeat_interval_s: float = 1.0
    worker_ttl_s: float = 3.0
    max_heartbeat_interval_s: float = 60.0
    batch_max: int = 8  # benchmark tasks per batch
    batch_wait_s: float = 0.2  # how long a lone benchmark task may wait for others to batch with
    retry_backoff: Backoff = field(default_factory=lambda: Backoff(base_s=0.5, factor=2.0, max_s=30.0, jitter=0.0))
    gang_max_wait_s: float = 60.0  # then a waiting gang's eligible workers take no new lower/equal-priority work
    gang_port_range: tuple[int, int] = (29500, 29999)  # rendezvous ports the coordinator hands to gangs
    strict: bool = False  # refuse at submit a custom task whose handler no connected worker has
    # Pipelining (coordinator/core/pipeline.py): a task sent ahead waits behind at most about this much
    # queued work on its worker, judged by the durations the worker reports
    pipeline_budget_s: float = 0.02
    # finished tasks kept in memory once their terminal record is durable (answers to ?wait and to
    # reads right after the outcome need no store read); older ones are read back from the store
    finished_cache: int = 4096
    # per-key quotas (coordinator/core/quota.py): tasks queued or running, and their payload; 0: off
    max_queued_per_key: int = 0
    max_payload_bytes_per_key: int = 0

    def liveness(self, requested_s: float) -> Liveness:
        """The contract for a worker that asks for a heartbeat interval of ``requested_s`` seconds
        (0: no preference). Raises ``ValidationError`` naming the numbers when it is not a finite
        number >= 0 or exceeds ``max_heartbeat_interval_s``."""
        field_name = "register.heartbeat_interval_s"
        if not math.isfinite(requested_s) or requested_s < 0:
            raise ValidationError([{"field": field_name, "error": f"must be a number of seconds >= 0, got {requested_s}"}])
        if requested_s == 0:
            return Liveness(self.heartbeat_interval_s, self.worker_ttl_s)
        if requested_s > self.max_heartbeat_interval_s:
            raise ValidationError([{"field": field_name, "error": (
                f"a heartbeat interval of {requested_s:g}s is above this coordinator's maximum of "
                f"{self.max_heartbeat_interval_s:g}s (--max-heartbeat-interval); start the worker with "
                f"--heartbeat-interval {self.max_heartbeat_interval_s:g} or less")}])
        intervals = self.worker_ttl_s / self.heartbeat_interval_s
        return Liveness(requested_s, max(self.worker_ttl_s, intervals * requested_s))


@dataclass(slots=True)
class Gang:
    """A gang task's placement (``Task.gang``; the rest of gang scheduling is :mod:`.gang`).
    ``members`` is empty while the task is pending."""

    nodes: int
    members: list[str] = field(default_factory=list)  # worker ids by node rank, current attempt
    addresses: list[str] = field(default_factory=list)  # their Register.address, by node rank
    master_addr: str = ""
    master_port: int = 0
    all_cuda: bool = False
    dispatched_at: float = 0.0
    held: dict[str, m.TaskResult] = field(default_factory=dict)  # member -> its result, not yet acked
    awaiting: dict[str, float] = field(default_factory=dict)  # member -> deadline for its re-sent result
    queued_at: float = 0.0  # when it last became dispatchable; the starvation bound counts from here
    protecting: bool = False  # past gang_max_wait_s: its eligible workers take no new lower work

    def place(self, members: list[str], addresses: list[str], port: int, all_cuda: bool, now: float) -> None:
        self.members, self.addresses = list(members), list(addresses)
        self.master_addr, self.master_port, self.all_cuda = addresses[0], port, all_cuda
        self.dispatched_at, self.protecting = now, False
        self.held.clear()
        self.awaiting.clear()

    def clear(self) -> None:
        """The attempt is over: forget its members and held results."""
        self.members, self.addresses = [], []
        self.master_addr, self.master_port = "", 0
        self.held.clear()
        self.awaiting.clear()

    def assignment(self, rank: int) -> m.GangAssignment:
        return m.GangAssignment(node_rank=rank, nnodes=self.nodes, master_addr=self.master_addr,
                                master_port=self.master_port, all_cuda=self.all_cuda, members=list(self.members))

    def record(self) -> dict[str, Any]:
        """What the dispatch history entry keeps, so a restarted coordinator knows the members."""
        return {"members": list(self.members), "addresses": list(self.addresses), "master_addr": self.master_addr,
                "master_port": self.master_port, "all_cuda": self.all_cuda}

    def restore(self, history: list[dict[str, Any]], attempt: int, fallback_worker: str | None, at: float) -> None:
        """Rebuild the members of ``attempt`` from the dispatch entry of the task's history."""
        for h in reversed(history):
            rec = h.get("gang")
            if h.get("to") == "assigned" and h.get("attempt") == attempt and isinstance(rec, dict):
                self.members = [str(w) for w in rec.get("members", [])]
                self.addresses = [str(a) for a in rec.get("addresses", [])] or [""] * len(self.members)
                self.master_addr, self.master_port = str(rec.get("master_addr", "")), int(rec.get("master_port", 0))
                self.all_cuda, self.dispatched_at = bool(rec.get("all_cuda", False)), float(h.get("at", at))
                return
        self.members = [fallback_worker] if fallback_worker else []
        self.addresses, self.dispatched_at = [""] * len(self.members), at

    def view(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "members": list(self.members), "master_addr": self.master_addr or None,
                "master_port": self.master_port or None, "all_cuda": self.all_cuda if self.members else None,
                "reported": sorted(self.held), "waiting_past_bound": self.protecting}


@dataclass(slots=True)
class Task:
    spec: specs.TaskSpec
    spec_dict: dict[str, Any]
    task_id: str
    type: str
    digest: str
    seq: int
    submitted_at: float
    state: str = "pending"
    attempt: int = 0
    worker_id: str | None = None
    updated_at: float = 0.0
    retries_used: int = 0
    not_before: float = 0.0
    history: list[dict[str, Any]] = field(default_factory=list)
    outcome: dict[str, Any] | None = None
    submitted_by: str | None = None
    key: ReqKey = NO_REQUIREMENTS
    batch_key: tuple[Any, ...] | None = None  # benchmark tasks with equal keys may share a model load
    slot: str = ""  # the worker slot this attempt holds: its task id, or its batch id
    gang: Gang | None = None  # multi-node training tasks only
    pipelined: bool = False  # may wait on a busy worker ahead of a free slot (its kind's ``pipelined``)
    sent_ahead: bool = False  # this attempt went to a worker with no free slot (it waits behind others there)
    spared: bool = False  # already requeued once without a retry after its worker was lost while it waited ahead
    payload_bytes: int = 0  # its spec's size as JSON while it counts against its key's quota (quota.py)

    def __post_init__(self) -> None:
        kind = specs.kind_of(self.spec)
        self.pipelined = kind.pipelined
        cfg = kind.decode(self.spec.config)
        # shipped code brings its own model module and handler (the worker checks them against the
        # bundle), and gets its own tree and child: no allow-list or handler to match, never batched
        shipped = self.spec.bundle is not None
        self.key = requirement_key(self.spec.requirements, kind.hardware(cfg), self.spec.max_memory_mb,
                                   None if shipped else model_module(kind.imports_model, self.spec.config),
                                   None if shipped else kind.handler(cfg), bundle=shipped)
        nodes = kind.gang_size(cfg)
        if nodes:
            self.gang = Gang(nodes)
        self.batch_key = None if shipped else kind.batch_key(cfg)

    def ref(self) -> m.TaskRef:
        return m.TaskRef(self.task_id, self.attempt)

    def assignment(self, gang: m.GangAssignment | None = None) -> m.TaskAssignment:
        """The message that gives the current attempt to a worker (``gang``: its node rank's part)."""
        return m.TaskAssignment(
            task_id=self.task_id, attempt=self.attempt, type=self.type, config=specs.config_dict(self.spec),
            timeout_s=self.spec.timeout_s, max_memory_mb=self.spec.max_memory_mb, cache=self.spec.cache, gang=gang,
            bundle=self.spec.bundle, python=list(self.spec.requirements.python))

    @classmethod
    def from_row(cls, row: TaskRow) -> Task:
        """The task a stored row describes (``seq`` as stored)."""
        return cls(spec=specs.spec_from_dict(row.spec), spec_dict=row.spec, task_id=row.task_id, type=row.type,
                   digest=row.digest, seq=row.seq, submitted_by=row.submitted_by, submitted_at=row.submitted_at,
                   state=row.state, attempt=row.attempt, worker_id=row.worker_id, updated_at=row.updated_at,
                   retries_used=row.retries_used, not_before=row.not_before, history=list(row.history),
                   outcome=row.outcome)

    def row(self) -> TaskRow:
        return TaskRow(
            task_id=self.task_id, type=self.type, state=self.state, attempt=self.attempt,
            priority=self.spec.priority, submitted_at=self.submitted_at, updated_at=self.updated_at,
            digest=self.digest, spec=self.spec_dict, worker_id=self.worker_id,
            retries_used=self.retries_used, not_before=self.not_before, history=list(self.history),
            outcome=self.outcome, seq=self.seq, submitted_by=self.submitted_by,
        )


@dataclass(slots=True)
class Worker:
    view: WorkerView
    name: str
    hardware: dict[str, Any]
    session_id: str | None
    first_seen: float
    last_seen: float
    connected: bool = True
    health: str = "ready"
    health_reason: str | None = None
    disconnected_at: float | None = None
    load: dict[str, float] = field(default_factory=dict)
    address: str = ""  # where other workers reach it (gang rendezvous); Register.address
    key_id: str = ""  # the key this worker id is bound to ("": none yet, or released by an admin)
    liveness: Liveness = Liveness(1.0, 3.0)  # this session's contract (set at registration)
    pace: Pace = field(default_factory=lambda: Pace(0))  # this session's pipelining window

    @property
    def worker_id(self) -> str:
        return self.view.worker_id

    @property
    def state(self) -> str:
        """One of ``tasks.states.WORKER_STATES`` (rows.FORGOTTEN, the record that deletes a
        worker's row after ``worker_retention_s``, is never listed)."""
        return self.health if self.connected else "disconnected"

    def row(self, state: str | None = None) -> WorkerRow:
        """The store record; ``state=rows.FORGOTTEN`` makes it the one that deletes the row."""
        return WorkerRow(
            worker_id=self.worker_id, name=self.name, hardware=self.hardware,
            capabilities=sorted(self.view.capabilities), tags=sorted(self.view.tags),
            first_seen=self.first_seen, last_seen=self.last_seen,
            state=state or self.state, key_id=self.key_id or None,
        )
