"""Failures of a DDP training task, all under :class:`~distributed_testing.errors.ExecutionError`.

::

    ExecutionError
    ├── InvalidTrainingConfig   a task config key or value is wrong (``field`` names it)
    ├── PreflightError          this node cannot reach the rendezvous endpoint (names both ends)
    └── LaunchError             the local torch.distributed launch did not produce a result
        ├── RankFailure         a rank (or the launcher agent) exited non-zero
        ├── LaunchTimeout       the whole launch ran past its timeout; every local rank was killed
        └── LaunchCancelled     the caller asked to stop; every local rank was killed

The worker executor maps :class:`LaunchTimeout` to ``timed_out``, :class:`LaunchCancelled` to
``cancelled`` and the rest to ``error``.
"""

from __future__ import annotations

from distributed_testing.errors import ExecutionError


class InvalidTrainingConfig(ExecutionError):
    """A training task config is invalid. ``field`` is the offending key (``""`` for the whole)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.errors = [{"field": field, "error": message}]
        super().__init__(f"training config {field!r}: {message}" if field else message)


class PreflightError(ExecutionError):
    """The rendezvous endpoint is unreachable or a peer node never checked in."""


class LaunchError(ExecutionError):
    """The local launch failed. ``log_tail`` holds the last lines of the launcher's output."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        self.log_tail = log_tail
        full = f"{message}\n--- launcher log (tail) ---\n{log_tail}" if log_tail else message
        super().__init__(full)


class RankFailure(LaunchError):
    """A local rank or the torch elastic agent exited with a non-zero status."""


class LaunchTimeout(LaunchError):
    """The launch exceeded its timeout."""


class LaunchCancelled(LaunchError):
    """The launch was cancelled by the caller."""
