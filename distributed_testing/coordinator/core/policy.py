"""How the scheduling core (:mod:`.state`) behaves: its :class:`Policy` (the coordinator's flags,
read once at the edge) and the :class:`Liveness` contract it grants each worker session."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...errors import ValidationError
from ...retry import Backoff


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
