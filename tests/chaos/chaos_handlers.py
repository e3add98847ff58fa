"""Custom handlers for the chaos suite, registered through the ``distributed_testing.custom_handlers``
entry-point group (``chaos_support.plugin_env`` writes the distribution metadata; nothing in the
product imports this module).

``record`` runs for ``seconds`` (sleeping, or with ``burn`` spinning one core at 100 %), then
appends one JSON line to the file ``log``: task id, attempt, the worker (``DT_CHAOS_WORKER`` in the
worker's environment, inherited by its pool children), pid, start and end times and the CPU
seconds used. One ``os.write`` on an ``O_APPEND`` descriptor, so concurrent writers never
interleave. The line is written when the work is done, before the result goes back: a line
without a result means the worker died in between, and two lines for a task mean it ran twice.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any


def record(parameters: dict[str, Any], ctx: Any) -> dict[str, Any]:
    seconds = float(parameters.get("seconds", 0.0))
    started, cpu0 = time.time(), time.process_time()
    if parameters.get("burn"):
        end, spins = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            spins += 1
    else:
        time.sleep(seconds)
    finished, cpu = time.time(), time.process_time() - cpu0
    worker = os.environ.get("DT_CHAOS_WORKER", "?")
    line = {"task_id": ctx.task_id, "attempt": ctx.attempt, "worker": worker, "pid": os.getpid(),
            "started": started, "finished": finished, "cpu_s": round(cpu, 3)}
    fd = os.open(parameters["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)
    return {"worker": worker, "wall_s": round(finished - started, 3), "cpu_s": round(cpu, 3)}


def print_wait(parameters: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Print one line, wait until the file ``go`` exists, print another: a task whose output is
    read while it runs (test_chaos_logs_failover.py)."""
    print("first line", flush=True)
    while not os.path.exists(parameters["go"]):
        time.sleep(0.05)
    print("second line", flush=True)
    return {}
