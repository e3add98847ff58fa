"""The change feed: task, worker and result events with ids, for the dashboard and other watchers.

``EventHub.publish_records(records)`` turns durable store records into events; the runtime calls
it only while ``hub.active`` (someone is subscribed), so the submit path pays one attribute
check and nothing per task otherwise. Events live in a bounded ring (``capacity``) so a client
that reconnects with the last id it saw (``Last-Event-ID``) gets what it missed. A client whose
id is older than the ring, from before a time nobody listened (nothing was recorded then), from another coordinator run (the id's epoch differs), or that falls
more than ``queue_max`` events behind while connected gets one ``reset`` event instead and must
re-read the state it shows.

Event ids are ``EPOCH-N``: ``EPOCH`` is random per coordinator start, ``N`` counts from 1.
``GET /api/v1/events`` (``tasks:read``) serves the feed as server-sent events.
"""

from __future__ import annotations

import asyncio
import collections
import secrets
from dataclasses import dataclass, field
from typing import Any

import msgspec

from .core.rows import Record, ResultRow, TaskRow, WorkerRow

RING_CAPACITY = 10_000
QUEUE_MAX = 5_000


class Event(msgspec.Struct, frozen=True):
    """One change: ``kind`` is ``task``, ``worker``, ``result``, ``load`` or ``reset``."""

    id: str
    kind: str
    data: dict[str, Any]


RESET = "reset"


@dataclass(eq=False)
class Subscriber:
    """One connected client: events queued for it; ``None`` in the queue ends the stream.
    ``key_id``: the API key it reads with (``end_key`` ends its stream when the key is revoked)."""

    queue: asyncio.Queue[Event | None] = field(default_factory=asyncio.Queue)
    key_id: str | None = None


def task_event(r: TaskRow) -> dict[str, Any]:
    return {"task_id": r.task_id, "type": r.type, "state": r.state, "attempt": r.attempt,
            "worker_id": r.worker_id, "updated_at": r.updated_at, "submitted_by": r.submitted_by, "run_id": r.run_id}


def worker_event(r: WorkerRow) -> dict[str, Any]:
    return {"worker_id": r.worker_id, "name": r.name, "state": r.state, "last_seen": r.last_seen}


def result_event(r: ResultRow) -> dict[str, Any]:
    return {"task_id": r.task_id, "attempt": r.attempt, "worker_id": r.worker_id, "status": r.status,
            "task_type": r.task_type}


_BUILDERS: dict[type[Any], tuple[str, Any]] = {TaskRow: ("task", task_event), WorkerRow: ("worker", worker_event),
                                               ResultRow: ("result", result_event)}


class EventHub:
    """The ring of recent events and the connected subscribers. Loop-bound, not thread-safe."""

    def __init__(self, capacity: int = RING_CAPACITY, queue_max: int = QUEUE_MAX) -> None:
        if capacity < 1 or queue_max < 1:
            raise ValueError("capacity and queue_max must be >= 1")
        self.epoch = secrets.token_hex(4)
        self.queue_max = queue_max
        self._ring: collections.deque[tuple[int, Event]] = collections.deque(maxlen=capacity)
        self._next = 1
        self._subs: set[Subscriber] = set()
        self.closed = False  # the coordinator is stopping: a stream opened now ends at once

    @property
    def active(self) -> bool:
        """Whether anyone listens: publishers skip all work otherwise."""
        return bool(self._subs)

    @property
    def last_id(self) -> str:
        return f"{self.epoch}-{self._next - 1}"

    def publish_records(self, records: list[Record]) -> None:
        """One event per task, worker or result record (keys and meta are not published)."""
        for r in records:
            built = _BUILDERS.get(type(r))
            if built is not None:
                self.publish(built[0], built[1](r))

    def publish(self, kind: str, data: dict[str, Any]) -> None:
        n = self._next
        self._next += 1
        ev = Event(f"{self.epoch}-{n}", kind, data)
        self._ring.append((n, ev))
        for s in self._subs:
            self._offer(s, ev)

    def _offer(self, s: Subscriber, ev: Event) -> None:
        if s.queue.qsize() >= self.queue_max:  # too slow: drop its backlog, tell it to re-read
            while not s.queue.empty():
                s.queue.get_nowait()
            s.queue.put_nowait(Event(ev.id, RESET, {"reason": "client too far behind"}))
            return  # the reset covers ``ev`` too; later events follow it as usual
        s.queue.put_nowait(ev)

    def subscribe(self, last_event_id: str | None, key_id: str | None = None) -> Subscriber:
        """A new subscriber reading with ``key_id``; with ``last_event_id`` its queue starts with
        what it missed, or with one ``reset`` event when that cannot be given (see the module doc)."""
        s = Subscriber(key_id=key_id)
        if self.closed:
            s.queue.put_nowait(None)
            return s
        self._subs.add(s)
        if not last_event_id:
            return s
        epoch, _, num = last_event_id.partition("-")
        seen = int(num) if num.isdigit() else -1
        oldest = self._ring[0][0] if self._ring else self._next
        if epoch != self.epoch or seen < oldest - 1 or seen >= self._next:
            s.queue.put_nowait(Event(self.last_id, RESET, {"reason": "cannot resume from that event id"}))
            return s
        missed = [ev for n, ev in self._ring if n > seen]
        if len(missed) > self.queue_max:
            s.queue.put_nowait(Event(self.last_id, RESET, {"reason": "client too far behind"}))
            return s
        for ev in missed:
            s.queue.put_nowait(ev)
        return s

    def unsubscribe(self, s: Subscriber) -> None:
        """Drop ``s``. When the last one leaves, nothing is recorded until the next arrives, so the
        ring is emptied and the epoch changes: a later resume gets ``reset`` instead of a gap."""
        self._subs.discard(s)
        if not self._subs:
            self._ring.clear()
            self.epoch = secrets.token_hex(4)
            self._next = 1

    def end_key(self, key_id: str) -> int:
        """End the streams of the subscribers reading with ``key_id`` (it was revoked); how many."""
        ended = [s for s in self._subs if s.key_id == key_id]
        for s in ended:
            s.queue.put_nowait(None)
        return len(ended)

    def close(self) -> None:
        """End every stream, and any opened from now on (coordinator shutdown)."""
        self.closed = True
        for s in self._subs:
            s.queue.put_nowait(None)
        self._subs.clear()


def sse_frame(ev: Event) -> bytes:
    """``ev`` as one server-sent event."""
    return b"id: %s\nevent: %s\ndata: %s\n\n" % (ev.id.encode(), ev.kind.encode(), msgspec.json.encode(ev.data))
