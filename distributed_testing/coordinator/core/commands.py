"""What the scheduling core (:mod:`.state`) asks of its transport: each event returns a list of
these, :class:`Save` records first (made durable before anything else of the same event runs),
then :class:`Send` / :class:`CloseWorker` / :class:`Notify` / :class:`Refused`."""

from __future__ import annotations

from dataclasses import dataclass

from ...protocol import messages as m
from .rows import Record


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
