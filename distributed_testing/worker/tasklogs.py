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
from ..protocol.codec import free_form_payload
from ..tasks.log import TaskLog

FLUSH_S = 0.25
CHUNK_BYTES = 64 * 1024
MESSAGE_BYTES = 256 * 1024  # at most 1 MiB/s of output per worker on its session


class _Stream:
    __slots__ = ("log", "sent")

    def __init__(self) -> None:
        self.log = TaskLog()
        self.sent = 0  # everything before this offset went out (or was left out)


class _Flushed:
    """What output and test reports share: ``send`` queues a message on the current session;
    ``ready`` says whether one is registered; ``current`` whether an attempt still runs here (what
    one that does not wrote is dropped); one timer, armed by what is new; after a new session the
    next flush sends each attempt's from its start again (:meth:`_restart`)."""

    def __init__(self, send: Callable[[m.Message], None], ready: Callable[[], bool],
                 current: Callable[[m.TaskRef], bool]) -> None:
        self._send, self._ready, self._current = send, ready, current
        self._timer: asyncio.TimerHandle | None = None
        self._was_ready = True

    def _arm(self) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_S, self.flush)

    def flush(self) -> None:
        raise NotImplementedError

    def _pending(self) -> bool:
        raise NotImplementedError

    def _restart(self) -> None:
        raise NotImplementedError

    def _may_send(self) -> bool:
        """The timer fired: whether a session is registered to send to (if not, try again later
        while anything is held); the first flush of a new session restarts every attempt's stream."""
        self._timer = None
        if not self._ready():
            self._was_ready = False
            if self._pending():
                self._arm()
            return False
        if not self._was_ready:  # a new session: the coordinator holds nothing of ours
            self._was_ready = True
            self._restart()
        return True

    def session_ended(self) -> None:
        """The session is over: the next one starts each attempt's stream again from its start."""
        self._was_ready = False

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class OutputStreams(_Flushed):
    """The output of this worker's running attempts (:class:`_Flushed`)."""

    def __init__(self, send: Callable[[m.Message], None], ready: Callable[[], bool],
                 current: Callable[[m.TaskRef], bool]) -> None:
        super().__init__(send, ready, current)
        self._streams: dict[m.TaskRef, _Stream] = {}

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

    def _pending(self) -> bool:
        return bool(self._streams)

    def _restart(self) -> None:
        for s in self._streams.values():
            s.sent = 0

    def flush(self) -> None:
        """Send what is new (the timer's callback; module docstring)."""
        if not self._may_send():
            return
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


REPORTS_KEPT_BYTES = 4 * 1024 * 1024  # of one attempt's streamed tests; past it the rest come with its result


class ReportStreams(_Flushed):
    """Each running attempt's tests as they end (``reports`` messages; docs/protocol.md, "Test
    reports"), sent like output: one timer, every ``FLUSH_S`` what is new of each attempt, at most
    ``MESSAGE_BYTES`` in all; only while a session whose coordinator keeps them (``ready``) is
    registered, from the first test again after a reconnect; none is held while the last
    coordinator registered with keeps none (``keeps``: its ``registered`` did not say ``reports``). An attempt keeps at most
    :data:`REPORTS_KEPT_BYTES` of them (a test whose entry alone exceeds ``MESSAGE_BYTES``, and
    those past the bound, are not streamed: the result carries every test)."""

    def __init__(self, send: Callable[[m.Message], None], ready: Callable[[], bool],
                 current: Callable[[m.TaskRef], bool], keeps: Callable[[], bool] = lambda: True) -> None:
        super().__init__(send, ready, current)
        self._keeps = keeps  # whether the coordinator of the last ``registered`` keeps them; while not, none is held
        self._tests: dict[m.TaskRef, tuple[str, list[tuple[dict[str, Any], int]]]] = {}
        self._sent: dict[m.TaskRef, int] = {}
        self._bytes: dict[m.TaskRef, int] = {}

    def sink(self, ref: m.TaskRef) -> Callable[[str, dict[str, Any]], None]:
        """Where an executor hands ``ref``'s ended tests: ``(tree, entry)``, on the event loop."""
        def put(tree: str, entry: dict[str, Any]) -> None:
            if not self._keeps():  # a coordinator that keeps none: nothing to hold for it
                return
            try:
                size = len(free_form_payload(entry))  # what a frame cannot carry is left to the result's check
            except ValueError:
                return
            held = self._tests.setdefault(ref, (tree, []))
            if size > MESSAGE_BYTES or self._bytes.get(ref, 0) + size > REPORTS_KEPT_BYTES:
                return
            held[1].append((entry, size))
            self._bytes[ref] = self._bytes.get(ref, 0) + size
            self._arm()
        return put

    def finish(self, ref: m.TaskRef) -> None:
        self._tests.pop(ref, None)
        self._sent.pop(ref, None)
        self._bytes.pop(ref, None)

    def _pending(self) -> bool:
        return bool(self._tests)

    def _restart(self) -> None:
        self._sent.clear()

    def flush(self) -> None:
        if not self._keeps():  # the coordinator registered with since keeps none: drop what is held
            self._timer = None
            self._tests.clear()
            self._sent.clear()
            self._bytes.clear()
            return
        if not self._may_send():
            return
        chunks: list[m.ReportsChunk] = []
        budget = MESSAGE_BYTES
        for ref, (tree, tests) in list(self._tests.items()):
            if not self._current(ref):
                self.finish(ref)
                continue
            first = end = self._sent.get(ref, 0)
            while end < len(tests) and tests[end][1] <= budget:
                budget -= tests[end][1]
                end += 1
            if end > first:
                self._sent[ref] = end
                chunks.append(m.ReportsChunk(ref, first, tree, [e for e, _ in tests[first:end]]))
                self._tests[ref] = self._tests.pop(ref)  # to the back: the budget goes round the attempts
            if end < len(tests):
                self._arm()  # the rest next time
        if chunks:
            self._send(m.TaskReports(chunks))

