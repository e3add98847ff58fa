"""A placeholder for a task type this worker cannot run yet.

Every task of that type ends with ``status="error"`` and the stated reason, so the coordinator
learns why instead of waiting on a task nobody runs.
"""

from __future__ import annotations

import time

from distributed_testing.worker.executors.base import ExecOutcome, TaskContext


class UnsupportedExecutor:
    """Answers every task of ``task_type`` with ``status="error"`` and ``reason``."""

    def __init__(self, task_type: str, *, reason: str) -> None:
        self.task_type = task_type
        self.reason = reason

    async def start(self) -> None:
        """Nothing to prepare."""

    async def run(self, ctx: TaskContext) -> ExecOutcome:
        """Return an ``error`` outcome carrying the reason; runs nothing."""
        now = time.time()
        return ExecOutcome("error", error=self.reason, started_at=now, finished_at=now)

    async def close(self) -> None:
        """Nothing to free."""
