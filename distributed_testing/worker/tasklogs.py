"""Streams running attempts' output to the coordinator (``output`` messages; docs/protocol.md,
"Task output").

Executors hand each chunk their children write to the attempt's sink (``TaskContext.output``),
on the event loop; the sink appends it to the attempt's bounded :class:`~..tasks.log.TaskLog` and
arms one timer. Every ``FLUSH_S`` the timer sends one message with what is new of each attempt
(at most ``CHUNK_BYTES`` each, ``MESSAGE_BYTES`` in all, taking turns), so a task that prints a line at a time
costs a buffer append per line, never a frame, and nothing a task writes waits on the network:
what is not sent in time stays in the bounded log and the middle of it is left out. Output is sent
only while a session is registered; after a reconnect each attempt's kept output is sent again
from offset 0 (a new leader holds none of it). The attempt's result carries the whole kept log
(:meth:`OutputStreams.finish`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..protocol import messages as m
from ..tasks.log import TaskLog

FLUSH_S = 0.25
CHUNK_BYTES = 64 * 1024
MESSAGE_BYTES = 256 * 1024  # at most 1 MiB/s of output per worker on its session


class _Stream:
    __slots__ = ("log", "sent")

    def __init__(self) -> None:
        self.log = TaskLog()
        self.sent = 0  # everything before this offset went out (or was left out)


class OutputStreams:
    """The output of this worker's running attempts. ``send`` queues a message on the current
    session; ``ready`` says whether one is registered; ``current`` whether an attempt still runs
    here (output of one that does not is dropped)."""

    def __init__(self, send: Callable[[m.Message], None], ready: Callable[[], bool],
                 current: Callable[[m.TaskRef], bool]) -> None:
        self._send, self._ready, self._current = send, ready, current
        self._streams: dict[m.TaskRef, _Stream] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._was_ready = True

    def sink(self, ref: m.TaskRef) -> Callable[[bytes], None]:
        """Where an executor writes ``ref``'s output (called on the event loop)."""
        def write(data: bytes) -> None:
            if data:
                stream = self._streams.get(ref)
                if stream is None:  # made at the first byte: a task that prints nothing costs nothing here
                    stream = self._streams[ref] = _Stream()
                stream.log.append(data)
                self._arm()
        return write

    def finish(self, ref: m.TaskRef) -> dict[str, Any] | None:
        """``ref`` ended: its kept output for its result (None when it wrote nothing)."""
        stream = self._streams.pop(ref, None)
        return None if stream is None or not stream.log.total else stream.log.to_json()

    def _arm(self) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_S, self.flush)

    def flush(self) -> None:
        """Send what is new (the timer's callback; module docstring)."""
        self._timer = None
        if not self._ready():
            self._was_ready = False
            if self._streams:
                self._arm()
            return
        if not self._was_ready:  # a new session: the coordinator holds nothing of ours
            self._was_ready = True
            for s in self._streams.values():
                s.sent = 0
        chunks: list[m.OutputChunk] = []
        budget = MESSAGE_BYTES
        for ref, s in list(self._streams.items()):
            if not self._current(ref):
                del self._streams[ref]
                continue
            if s.sent >= s.log.total:
                continue
            if budget <= 0:
                self._arm()  # the rest next time
                break
            offset, data = s.log.segment(s.sent, min(CHUNK_BYTES, budget))
            s.sent = offset + len(data)
            budget -= len(data)
            chunks.append(m.OutputChunk(ref, offset, data))
            self._streams[ref] = self._streams.pop(ref)  # to the back: the budget goes round the attempts
            if s.sent < s.log.total:
                self._arm()
        if chunks:
            self._send(m.TaskOutput(chunks))

    def session_ended(self) -> None:
        """The session is over: the next one starts each attempt's output again from offset 0."""
        self._was_ready = False

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
