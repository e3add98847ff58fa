"""The coordinator's Prometheus metrics: one registry per ``Runtime``, rendered by ``GET /metrics``.

Most figures are read from state the coordinator keeps anyway, at scrape time (a custom collector):
tasks and workers by state, per-worker load from the last heartbeat, refused worker frames
(``Runtime.stats``), open worker sessions. Only what no state holds is counted as it happens:
submissions, dispatches, the submit→assign and submit→outcome latencies, store write latency and
records per write, and refused credentials. Those on the task path (all but the refused
credentials) are plain counts kept by the event loop (:class:`LoopCounter`, :class:`LoopHistogram`):
an observation is a bisect and two additions, about 0.6 µs, where prometheus-client's
``Histogram.observe`` takes a lock for the bucket and one for the sum (about 4 µs here; a serial
``?wait`` task made six observations and two increments, a task under load about three). They are
read only at scrape time, which also runs on the loop. Like prometheus-client's own instruments
they export a ``_created`` series (the time they were made), unless prometheus-client's is off
(``PROMETHEUS_DISABLE_CREATED_SERIES``, ``disable_created_metrics``).

A per-runtime registry, never prometheus-client's global one: a process may hold several
coordinators (tests do), and each must report only its own.

Metric names (all prefixed ``dt_``) are listed in docs/operations.md, "Metrics".
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, cast

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client import metrics as client_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ..process.promhttp import CONTENT_TYPE, serve_metrics
from .core.state import CoordinatorState

_go_float = cast(Callable[[float], str], floatToGoString)  # how prometheus-client writes a bucket bound


def _created(at: float) -> float | None:
    """``at`` where prometheus-client's own instruments export their ``_created`` series now."""
    return at if getattr(client_metrics, "_use_created", True) else None


class Runtime(Protocol):
    """What the collector reads of ``runtime.Runtime`` (named here, not imported: the runtime
    imports this module)."""

    state: CoordinatorState
    stats: Any
    sessions: Any

__all__ = ["CONTENT_TYPE", "Metrics", "StateCollector", "serve_metrics"]
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   300.0, 900.0, 3600.0, float("inf"))
STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, float("inf"))
RECORD_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, float("inf"))
# Where a refused credential is counted: AuthError (unknown, expired, revoked, malformed),
# PermissionDenied (valid but lacking the route's permission), missing (no credential at all),
# throttled (its address was refused for too many failures before its credential was looked at).
AUTH_FAILURE_REASONS = ("invalid", "forbidden", "missing", "throttled")
_LOAD_GAUGES = (("cpu_percent", "dt_worker_cpu_percent", "CPU use of the worker's host, % (last heartbeat)"),
                ("memory_percent", "dt_worker_memory_percent", "memory use of the worker's host, % (last heartbeat)"),
                ("gpu_percent", "dt_worker_gpu_percent",
                 "utilisation of the worker's busiest NVIDIA GPU, % (last heartbeat; only workers that measure it)"),
                ("available_memory_mb", "dt_worker_available_memory_mb",
                 "memory the worker offers to new tasks, MB (last heartbeat; only with --memory-buffer)"))


class LoopCounter:
    """A counter updated and read on the event loop only (see the module doc)."""

    __slots__ = ("name", "doc", "value", "created")

    def __init__(self, name: str, doc: str) -> None:
        self.name, self.doc, self.value, self.created = name, doc, 0.0, time.time()

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def family(self) -> Metric:
        return CounterMetricFamily(self.name, self.doc, value=self.value, created=_created(self.created))


class LoopHistogram:
    """A histogram updated and read on the event loop only (see the module doc); ``buckets`` are
    the upper bounds, ascending, the last one ``inf``, each inclusive as Prometheus has them."""

    __slots__ = ("name", "doc", "bounds", "counts", "sum", "created")

    def __init__(self, name: str, doc: str, buckets: Sequence[float]) -> None:
        if list(buckets) != sorted(buckets) or buckets[-1] != float("inf"):
            raise ValueError(f"{name}: buckets must ascend and end with inf")
        self.name, self.doc = name, doc
        self.bounds = tuple(float(b) for b in buckets)
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bound >= value
        self.sum += value

    def family(self) -> Metric:
        cumulative, buckets = 0, []
        for bound, n in zip(self.bounds, self.counts, strict=True):
            cumulative += n
            buckets.append((_go_float(bound), cumulative))
        f = HistogramMetricFamily(self.name, self.doc)
        f.add_metric([], buckets, self.sum)
        if (created := _created(self.created)) is not None:
            f.add_sample(self.name + "_created", {}, created)
        return f


class _LoopInstruments(Collector):
    def __init__(self, instruments: Sequence[LoopCounter | LoopHistogram]) -> None:
        self._instruments = instruments

    def collect(self) -> Iterator[Metric]:
        for i in self._instruments:
            yield i.family()


class Metrics:
    """The instruments the runtime updates as things happen, and the registry that holds them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.submitted = LoopCounter("dt_tasks_submitted", "tasks accepted as new by POST /api/v1/tasks")
        self.dispatched = LoopCounter("dt_tasks_dispatched", "task attempts sent to workers")
        self.assign_latency = LoopHistogram("dt_task_submit_to_assign_seconds",
                                            "seconds from a task's submission to the assignment of each attempt",
                                            LATENCY_BUCKETS)
        self.outcome_latency = LoopHistogram("dt_task_submit_to_outcome_seconds",
                                             "seconds from a task's submission to its final outcome being durable",
                                             LATENCY_BUCKETS)
        self.store_write = LoopHistogram("dt_store_write_seconds",
                                         "seconds from handing records to the store to their being durable",
                                         STORE_BUCKETS)
        self.store_records = LoopHistogram("dt_store_write_records", "records per write handed to the store",
                                           RECORD_BUCKETS)
        r.register(_LoopInstruments([self.submitted, self.dispatched, self.assign_latency, self.outcome_latency,
                                     self.store_write, self.store_records]))
        self.auth_failures = Counter("dt_auth_failures", "refused REST and WebSocket-handshake credentials",
                                     ["reason"], registry=r)
        for reason in AUTH_FAILURE_REASONS:
            self.auth_failures.labels(reason)

    def bind(self, rt: Runtime) -> None:
        """Report ``rt``'s state at every scrape (once per runtime)."""
        self.registry.register(StateCollector(rt))

    def render(self) -> bytes:
        """Every metric in the Prometheus text format (``CONTENT_TYPE``)."""
        return generate_latest(self.registry)


class StateCollector(Collector):
    """Reads the runtime's in-memory state at scrape time; adds no work to the hot path."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt

    def collect(self) -> Iterator[Metric]:
        rt = self._rt
        tasks = GaugeMetricFamily("dt_tasks", "tasks by state, every stored task (finished ones included)",
                                  labels=["state"])
        for state, n in sorted(rt.state.counts.items()):
            tasks.add_metric([state], n)
        yield tasks
        held = GaugeMetricFamily("dt_tasks_in_memory", "tasks held in the coordinator's memory: the active ones "
                                 "and at most a bounded cache of finished ones (the rest are read from the store)")
        held.add_metric([], len(rt.state.tasks))
        yield held
        yield from self._workers(rt)
        sessions = GaugeMetricFamily("dt_worker_sessions", "open, registered worker WebSocket sessions")
        sessions.add_metric([], len(rt.sessions))
        yield sessions
        results = CounterMetricFamily("dt_results_received", "task results received from workers")
        results.add_metric([], rt.stats.get("results", 0))
        yield results
        refused = CounterMetricFamily("dt_worker_frames_refused",
                                      "worker WebSocket frames refused, by reason (refused_*: a report on an "
                                      "attempt or worker id the sender does not hold; rejected_*: a frame that "
                                      "failed decoding, signing or validation)", labels=["reason"])
        for name, n in sorted(rt.stats.items()):
            if name.startswith(("refused_", "rejected_")):
                refused.add_metric([name], n)
        yield refused

    @staticmethod
    def _workers(rt: Runtime) -> Iterator[Metric]:
        by_state = GaugeMetricFamily("dt_workers", "known workers, by state", labels=["state"])
        counts: dict[str, int] = {}
        gauges = {key: GaugeMetricFamily(name, doc, labels=["worker_id", "name"]) for key, name, doc in _LOAD_GAUGES}
        for w in rt.state.workers.values():
            state = w.state
            counts[state] = counts.get(state, 0) + 1
            if not w.connected:
                continue
            for key, value in w.load.items():
                if key in gauges:
                    gauges[key].add_metric([w.worker_id, w.name], value)
        for state, n in sorted(counts.items()):
            by_state.add_metric([state], n)
        yield by_state
        yield from gauges.values()

