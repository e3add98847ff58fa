"""The worker's Prometheus metrics (``--metrics-port``): read from the agent at scrape time.

Nothing is counted on the task path: every figure is the agent's state when scraped, or a
reading of the host taken then (CPU and memory through psutil, as the heartbeat's). Names are
listed in docs/operations.md, "Metrics".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import psutil
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .agent import WorkerAgent

STATES = ("ready", "constrained", "draining")


class AgentCollector(Collector):
    def __init__(self, agent: WorkerAgent) -> None:
        self._agent = agent

    def collect(self) -> Iterator[Metric]:
        a = self._agent
        yield _gauge("dt_worker_connected", "1 while registered with the coordinator", int(a.registered.is_set()))
        yield _gauge("dt_worker_running_tasks", "tasks running now", len(a.running))
        yield _gauge("dt_worker_slots", "tasks it runs at once (--max-concurrent-tasks)", a.config.max_concurrent_tasks)
        yield _gauge("dt_worker_unacked_results", "results kept until the coordinator acknowledges them",
                     len(a.result_store.unacked_refs()))
        state = "draining" if a.draining else a.monitor.state
        by_state = GaugeMetricFamily("dt_worker_state", "1 for the state the worker reports", labels=["state"])
        for s in STATES:
            by_state.add_metric([s], int(s == state))
        yield by_state
        sessions = CounterMetricFamily("dt_worker_sessions", "sessions registered with the coordinator since start")
        sessions.add_metric([], a.sessions)
        yield sessions
        yield _gauge("dt_worker_host_cpu_percent", "host CPU use since the previous reading, %",
                     psutil.cpu_percent(interval=None))
        yield _gauge("dt_worker_host_memory_percent", "host memory use, %", psutil.virtual_memory().percent)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc)
    g.add_metric([], value)
    return g


def registry_for(agent: WorkerAgent) -> CollectorRegistry:
    """A registry of its own reporting ``agent`` (never the process-global one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(agent))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
