"""What the metrics cost the coordinator: the per-task hooks on the hot path, and one scrape.

Per task the runtime counts the submission, the dispatch with its submit→assign latency, and the
submit→outcome latency (``Runtime._observe_assignments`` / ``_observe_outcomes``, plus
``metrics.submitted``); each store write observes its latency and size. This times exactly those
calls over ``--tasks`` real tasks in a real ``CoordinatorState`` and, in the same run, the state
machine's own submit+dispatch work for the same tasks, so the figure to read is the ratio. A scrape
(``Metrics.render``) is timed with ``--workers`` connected workers reporting load.

Run: ``python benchmarks/metrics_overhead.py --tasks 20000 --workers 2000``
"""

from __future__ import annotations

import argparse
import time

from distributed_testing.config import CoordinatorConfig
from distributed_testing.coordinator.core.commands import Command, Send
from distributed_testing.coordinator.runtime import Runtime
from distributed_testing.coordinator.store.memory import MemoryStore
from distributed_testing.protocol import messages as m
from distributed_testing.tasks.spec import parse_tasks


def register(rt: Runtime, n: int) -> None:
    for i in range(n):
        reg = m.Register(worker_id=f"w{i}", name=f"w{i}", protocol_version=m.PROTOCOL_VERSION, hardware={},
                         capabilities=["cpu"], tags=[], max_concurrent=1_000_000)
        rt.state.register(reg, f"s{i}", 0.0, key_id="k")
        rt.state.heartbeat(f"w{i}", m.Heartbeat(state="ready", running=[], cpu_percent=12.5, memory_percent=40.0,
                                                free_slots=1), 0.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=20000)
    p.add_argument("--workers", type=int, default=2000)
    ns = p.parse_args()
    rt = Runtime(CoordinatorConfig(db_path="memory://"), MemoryStore())
    register(rt, ns.workers)
    specs = parse_tasks([{"task_id": f"t{i}", "type": "custom", "config": {"name": "noop"}} for i in range(ns.tasks)])

    t0 = time.perf_counter()
    accepted, cmds = rt.state.submit(specs, 1.0)
    state_s = time.perf_counter() - t0
    sends: list[Command] = [c for c in cmds if isinstance(c, Send) and isinstance(c.msg, m.AssignTasks)]
    assigned = sum(len(c.msg.tasks) for c in sends if isinstance(c, Send) and isinstance(c.msg, m.AssignTasks))

    t0 = time.perf_counter()
    rt.metrics.submitted.inc(sum(1 for a in accepted if a["created"]))
    rt._observe_assignments(cmds)
    rt._observe_outcomes([a["task_id"] for a in accepted])  # none has an outcome: the lookup is the cost
    for _ in range(len(sends)):
        rt.metrics.store_write.observe(0.001)
        rt.metrics.store_records.observe(4)
    hooks_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    text = rt.metrics.render()
    scrape_s = time.perf_counter() - t0
    print(f"tasks {ns.tasks} (assigned {assigned}), workers {ns.workers}")
    print(f"  state machine submit+dispatch: {state_s / ns.tasks * 1e6:.2f} us/task")
    print(f"  metrics hooks:                 {hooks_s / ns.tasks * 1e6:.2f} us/task "
          f"({hooks_s / state_s:.1%} of the state machine's work)")
    print(f"  one scrape: {scrape_s * 1e3:.1f} ms, {len(text) / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
