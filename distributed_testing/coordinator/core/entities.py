"""What the scheduling core (:mod:`.state`) keeps in memory: the :class:`Task` (with its
:class:`Gang` placement, for a multi-node task) and the :class:`Worker`, each with the store row it
becomes. Plain data: no scheduling decisions here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...protocol import messages as m
from ...tasks import spec as specs
from ...tasks.usercode import model_module
from .pipeline import Pace
from .placement import NO_REQUIREMENTS, ReqKey, WorkerView, ranks_network, requirement_key
from .policy import Liveness
from .rows import TaskRow, WorkerRow


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
    progress: dict[str, Any] | None = None  # the running attempt's latest report (memory only): note_progress

    def __post_init__(self) -> None:
        kind = specs.kind_of(self.spec)
        self.pipelined = kind.pipelined
        cfg = kind.decode(self.spec.config)
        # shipped code brings its own model module and handler (the worker checks them against the
        # bundle), and gets its own tree and child: no allow-list or handler to match, never batched
        shipped = self.spec.bundle is not None
        nodes = kind.gang_size(cfg)
        self.key = requirement_key(self.spec.requirements, kind.hardware(cfg), self.spec.max_memory_mb,
                                   None if shipped else model_module(kind.imports_model, self.spec.config),
                                   None if shipped else kind.handler(cfg), bundle=shipped,
                                   network=ranks_network(shipped, nodes))
        if nodes:
            self.gang = Gang(nodes)
        self.batch_key = None if shipped else kind.batch_key(cfg)

    def note_progress(self, attempt: int, fraction: float, message: str, now: float) -> None:
        """Keep ``attempt``'s latest progress report while it is this task's running attempt."""
        if attempt == self.attempt and self.state == "running":
            self.progress = {"attempt": attempt, "fraction": fraction, "message": message, "at": now}

    def progress_view(self) -> dict[str, Any] | None:
        """The running attempt's latest progress (``fraction``, ``message``, ``at``), else None."""
        p = self.progress
        if p is None or self.state != "running" or p["attempt"] != self.attempt:
            return None
        return {"fraction": p["fraction"], "message": p["message"], "at": p["at"]}

    def ref(self) -> m.TaskRef:
        return m.TaskRef(self.task_id, self.attempt)

    def assignment(self, gang: m.GangAssignment | None = None) -> m.TaskAssignment:
        """The message that gives the current attempt to a worker (``gang``: its node rank's part)."""
        s = self.spec  # positional, in TaskAssignment's field order (one per dispatch; keywords cost more)
        return m.TaskAssignment(self.task_id, self.attempt, self.type, specs.config_dict(s), s.timeout_s,
                                s.max_memory_mb, s.cache, gang, s.bundle, list(s.requirements.python),
                                self.submitted_by, s.run_id)

    @classmethod
    def from_row(cls, row: TaskRow) -> Task:
        """The task a stored row describes (``seq`` as stored)."""
        return cls(spec=specs.spec_from_dict(row.spec), spec_dict=row.spec, task_id=row.task_id, type=row.type,
                   digest=row.digest, seq=row.seq, submitted_by=row.submitted_by, submitted_at=row.submitted_at,
                   state=row.state, attempt=row.attempt, worker_id=row.worker_id, updated_at=row.updated_at,
                   retries_used=row.retries_used, not_before=row.not_before, history=list(row.history),
                   outcome=row.outcome)

    def row(self) -> TaskRow:
        # Positional, in TaskRow's field order (a third of the cost of keywords; made at every
        # transition): task_id, type, state, attempt, priority, submitted_at, updated_at, digest,
        # spec, worker_id, reason, retries_used, not_before, history, outcome, seq, submitted_by, run_id.
        return TaskRow(self.task_id, self.type, self.state, self.attempt, self.spec.priority, self.submitted_at,
                       self.updated_at, self.digest, self.spec_dict, self.worker_id, None, self.retries_used,
                       self.not_before, list(self.history), self.outcome, self.seq, self.submitted_by,
                       self.spec.run_id)


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
