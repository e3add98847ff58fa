"""Every message on the worker WebSocket, as frozen typed structs with a ``type`` tag.

Pure: no I/O. ``Message`` is the tagged union that :mod:`.codec` decodes into. Adding a message
means adding a struct here and to ``Message``; the receiving side's dispatch table must then
handle it (an unhandled type raises).

Direction: W→C worker to coordinator, C→W coordinator to worker.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

PROTOCOL_VERSION = 11  # 2: provisional assignments, confirm, register.abandoned; 3: results before the confirm;
# 4: result_ack.confirm_upto; 5: register.model_modules; 6: register.handlers (a custom task waits for a
# worker that has its handler instead of failing on one that does not); 7: register.heartbeat_interval_s,
# registered.worker_ttl_s, heartbeat.swap_percent (the coordinator owns the liveness contract);
# 8: register.pipeline_depth, take_back / taken_back (a worker holds short tasks ahead of its slots);
# 9: register.accept_bundles, task assignment bundle (shipped code); 10: task assignment python (its
# requirements.python, installed by the worker in a virtual environment); register.task_network came
# within 10 as an optional field (a worker that omits it is placed as before); 11: output (a running task's
# stdout/stderr streamed while it runs); task assignment submitted_by and run_id came within 11; so did
# batch (several messages in one signed frame), sent only to a peer that said it reads them
# (register.batches, registered.batches); and reports (each test's reports while its task runs), sent
# only to a coordinator that said it keeps them (registered.reports)

ResultStatus = Literal["succeeded", "failed", "timed_out", "cancelled", "error"]
# Attempt numbers are stored as signed 64-bit integers; a peer's larger number is malformed.
Attempt = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
Offset = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
WorkerState = Literal["ready", "constrained", "draining"]
TaskNetwork = Literal["none", "loopback", "host"]  # the network a task with shipped code gets (--task-network)
MAX_PIPELINE_DEPTH = 256
PipelineDepth = Annotated[int, msgspec.Meta(ge=0, le=MAX_PIPELINE_DEPTH)]


class _Msg(msgspec.Struct, frozen=True, tag_field="type", forbid_unknown_fields=True):
    pass


class TaskRef(msgspec.Struct, frozen=True, array_like=True):
    """One attempt of one task; the attempt number fences stale results."""

    task_id: str
    attempt: Attempt


class Register(_Msg, frozen=True, tag="register"):
    """W→C, first message of a session. ``running`` re-announces tasks still running after a
    reconnect so they are kept, not dispatched a second time."""

    worker_id: str
    name: str
    protocol_version: int
    hardware: dict[str, Any]
    capabilities: list[str]
    tags: list[str]
    max_concurrent: int
    memory_gb: float = 0.0
    running: list[TaskRef] = []
    # Where other workers reach this one for a multi-node rendezvous: the address of ``--interface``
    # when given, else the local address of this WebSocket connection. Empty: the coordinator uses
    # the peer address it sees.
    address: str = ""
    interface: str | None = None  # the NIC gloo/NCCL bind on this worker: --interface, else the one holding ``address``
    # Attempts that finished here but whose results are not acknowledged yet: they are re-sent
    # right after ``registered``, so the coordinator keeps these tasks instead of requeueing them.
    finished: list[TaskRef] = []
    # Provisional attempts stopped because the last session ended before their ``confirm``: the
    # coordinator requeues them without spending a retry (they never reported anything).
    abandoned: list[TaskRef] = []
    # ``--allow-model-modules``: module prefixes whose ``module:callable`` models this worker runs;
    # the coordinator places no task with another user model here.
    model_modules: list[str] = []
    accept_bundles: bool = False  # --accept-bundles: this worker runs tasks with shipped code (sandboxed)
    # ``--heartbeat-interval``: the interval this worker asks for; 0: the coordinator's default.
    # The coordinator answers with the interval and TTL it applies, or refuses one above its maximum.
    heartbeat_interval_s: float = 0.0
    # The custom handler names this worker runs; the coordinator places a custom task only on a
    # worker that lists its handler. None: not reported (a test double speaking the protocol by
    # hand); the worker agent always reports its list.
    handlers: list[str] | None = None
    # ``--pipeline-depth``: how many assigned tasks this worker accepts beyond its slots, queued
    # to run one after another as slots free (0: none). The coordinator decides how many it
    # actually sends ahead from the durations it observes (docs/protocol.md, "Pipelining").
    pipeline_depth: PipelineDepth = 0
    # The network this worker's tasks with shipped code get: its --task-network, or "host" under
    # --sandbox none (unconfined). The coordinator places a multi-node training task with a bundle
    # only where its ranks reach each other ("host"). None: not reported (a worker before this
    # field, or a test double): placed as before, and the worker refuses what it cannot run.
    task_network: TaskNetwork | None = None
    # This worker reads ``batch`` frames (within 11: a peer that omits it is sent none).
    batches: bool = False
    # This worker streams ``reports`` messages (within 11: a peer that omits it is told nothing of them).
    reports: bool = False


class Registered(_Msg, frozen=True, tag="registered", omit_defaults=True):
    """C→W, answer to ``Register``: the liveness contract of this session. The worker sends a
    heartbeat every ``heartbeat_interval_s`` and a WebSocket ping every ``worker_ttl_s``; the
    coordinator declares it dead after ``worker_ttl_s`` without any frame from it, and the worker
    ends the session when a ping gets no pong within ``worker_ttl_s``."""

    worker_id: str
    session_id: str
    heartbeat_interval_s: float
    server_time: float
    worker_ttl_s: float
    # Optional within 11, sent (true) only to a worker whose ``register`` said the same, so a
    # worker built before them (it refuses unknown fields) reads none: omitted while false.
    batches: bool = False  # this coordinator reads ``batch`` frames (omitted: send none)
    reports: bool = False  # this coordinator keeps ``reports`` messages (omitted: send none)


class Heartbeat(_Msg, frozen=True, tag="heartbeat"):
    """W→C, periodic: load and what is running. ``state`` is ``constrained`` when a resource
    limit is exceeded (``reason`` says which). ``available_memory_mb``, when set, is the memory a
    new task may use; the coordinator places no task whose ``max_memory_mb`` exceeds it."""

    state: WorkerState
    running: list[TaskRef]
    cpu_percent: float
    memory_percent: float
    free_slots: int
    reason: str | None = None
    available_memory_mb: float | None = None  # memory offered to new tasks (--memory-buffer); None: not reported
    gpu_percent: float | None = None  # busiest NVIDIA GPU's utilisation; None: not measured (no --max-gpu-percent)
    swap_percent: float | None = None  # swap in use; None: the machine has no swap


class GangAssignment(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One node's part of a multi-node (gang) task: every member of the gang receives the same
    task and attempt with its own ``node_rank``. ``members`` lists the worker ids by node rank."""

    node_rank: int
    nnodes: int
    master_addr: str
    master_port: int
    all_cuda: bool
    members: list[str]


class TaskAssignment(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    task_id: str
    attempt: Attempt
    type: str
    config: dict[str, Any]
    timeout_s: float | None = None
    max_memory_mb: int | None = None
    cache: bool = False
    gang: GangAssignment | None = None  # set for multi-node training tasks only
    bundle: str | None = None  # the manifest digest of the task's shipped code (docs/tasks.md, "Bundles")
    python: list[str] = []  # its requirements.python: pip requirements the worker installs for the bundle
    # within 11: the submitting key's id and the task's run, which key the worker's pytest sessions
    # (worker/executors/test_session.py): one never serves another key's or run's tests
    submitted_by: str | None = None
    run_id: str | None = None


class AssignTasks(_Msg, frozen=True, tag="assign"):
    """C→W: one task or a batch. A batch of benchmark tasks that share a model may be run in
    one child process that loads the model once.

    ``provisional`` > 0: sent while the coordinator's record of these attempts was still being
    written. The worker runs them at once and sends their results at once (the coordinator
    journals a result after its assignment), but sends no ``started`` and keeps no result for a
    re-send until a ``confirm`` with ``upto >= provisional`` arrives on the same session; it
    abandons them (kills them, drops their results) if the session ends first: whatever the
    coordinator never made durable is never reported again."""

    tasks: list[TaskAssignment]
    batch_id: str | None = None
    provisional: int = 0


class Confirm(_Msg, frozen=True, tag="confirm"):
    """C→W: every provisional assignment of this session numbered up to ``upto`` is on disk."""

    upto: int


class TaskStarted(_Msg, frozen=True, tag="started"):
    """W→C."""

    tasks: list[TaskRef]
    at: float


class TaskProgress(_Msg, frozen=True, tag="progress"):
    """W→C."""

    task: TaskRef
    fraction: float
    message: str = ""


class OutputChunk(msgspec.Struct, frozen=True, array_like=True):
    """Bytes of one attempt's output, at byte ``offset`` of everything it wrote. An offset past
    what the coordinator holds means the bytes between were left out (the worker keeps only a
    bounded head and tail, and sends at a bounded rate: ``tasks/log.py``)."""

    task: TaskRef
    offset: Offset
    data: bytes


class TaskOutput(_Msg, frozen=True, tag="output"):
    """W→C: new output of running attempts, one chunk per attempt, sent a few times a second at
    most. Only the output of the task's current attempt from the worker it is assigned to is kept;
    output for an attempt the worker was never given is refused (``output_refused``), for one of
    its own that ended or was superseded dropped."""

    chunks: list[OutputChunk]


class ReportsChunk(msgspec.Struct, frozen=True, array_like=True):
    """Tests that ended in one running attempt: each test's entry as the attempt's result will
    carry it in ``output["tests"]``, ``tests[0]`` being the attempt's ``first``-th streamed test
    (0-based); ``tree``: the worker's path of the tree the reports name (``output["tree"]``)."""

    task: TaskRef
    first: Offset
    tree: str
    tests: list[dict[str, Any]]


class TaskReports(_Msg, frozen=True, tag="reports"):
    """W→C: the tests that ended in running attempts since the last such message (a few times a
    second at most), so a submitter replays each test as it ends (``GET
    /api/v1/tasks/{id}/reports``). Kept, like ``output``, only for the task's current attempt from
    the worker it is assigned to; for an attempt the worker was never given refused
    (``reports_refused``). Sent only to a coordinator whose ``registered`` said ``reports``."""

    chunks: list[ReportsChunk]


class TaskResult(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    task_id: str
    attempt: Attempt
    status: ResultStatus
    started_at: float
    finished_at: float
    output: dict[str, Any] = {}
    error: str | None = None
    worker_id: str = ""


class Results(_Msg, frozen=True, tag="results"):
    """W→C: one or more finished tasks. Each stays in the worker's outbox until acked."""

    results: list[TaskResult]


class ResultAck(_Msg, frozen=True, tag="result_ack"):
    """C→W: these results are on disk at the coordinator; the worker may forget them. With
    ``confirm_upto`` > 0 it is also a ``confirm`` of that number, sent as one frame when both
    are due at once (their attempts' results are settled by the ack before the confirm applies)."""

    tasks: list[TaskRef]
    confirm_upto: int = 0


class Cancel(_Msg, frozen=True, tag="cancel"):
    """C→W: stop this attempt (kill its process group) and report it ``cancelled``."""

    task: TaskRef
    reason: str


class TakeBack(_Msg, frozen=True, tag="take_back"):
    """C→W: give back these attempts if they have not started here (they wait behind a long task
    while another worker is idle). Answered with ``taken_back``; a task waiting in a chain on the
    worker (already in its pool child's input) in a later one, once the child skipped or began it."""

    tasks: list[TaskRef]


class TakenBack(_Msg, frozen=True, tag="taken_back"):
    """W→C, the answer to ``take_back``. ``dropped``: these attempts had not started and never will
    here (the coordinator may requeue them as a new attempt); ``kept``: these had already started,
    or are not held here at all: their results come (or came) as usual."""

    dropped: list[TaskRef]
    kept: list[TaskRef]


class ErrorMsg(_Msg, frozen=True, tag="error"):
    """Either direction: the peer's last message was rejected. ``code`` is a ProtocolError code."""

    code: str
    detail: str
    fatal: bool = False


class Drain(_Msg, frozen=True, tag="drain"):
    """C→W: stop taking work; finish or hand back running tasks within ``deadline_s``."""

    reason: str
    deadline_s: float


class Goodbye(_Msg, frozen=True, tag="goodbye"):
    """W→C: the worker is leaving; ``handed_back`` tasks were not finished and may be requeued."""

    reason: str
    handed_back: list[TaskRef] = []


class AuthRenew(_Msg, frozen=True, tag="auth_renew"):
    """W→C: a fresh JWT so the session outlives the token it opened with."""

    token: str


Single = (Register | Registered | Heartbeat | AssignTasks | Confirm | TaskStarted | TaskProgress | Results | ResultAck
          | Cancel | TakeBack | TakenBack | ErrorMsg | Drain | Goodbye | AuthRenew | TaskOutput
          | TaskReports)


class Batch(_Msg, frozen=True, tag="batch"):
    """Either direction: several messages in one signed frame (a writer that finds more than one
    queued sends them so, to a peer that said it reads batches). The receiver handles each in
    order exactly as if it had come alone, its own checks included: a worker's batch cannot carry
    a report on an attempt it was not given any more than a single message can. A batch holds no
    batch (by its type), and is never the first message of a session."""

    messages: list[Single]


Message = Single | Batch

MESSAGE_TYPES: dict[str, type[Any]] = {
    cls.__struct_config__.tag: cls
    for cls in Message.__args__
}
