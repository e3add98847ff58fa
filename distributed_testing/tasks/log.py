"""A task's output as it is kept: bounded, addressed by byte offset. Pure: no I/O, no clock.

One :class:`TaskLog` holds the first ``head_bytes`` and the last ``tail_bytes`` of everything an
attempt wrote (its stdout and stderr as one stream; for a test task pytest's own terminal report).
An offset is a byte position in that whole stream, so a reader that has read up to ``N`` asks for
what follows ``N`` whatever was dropped meanwhile: what is no longer kept reads as one
``[... N bytes left out ...]`` line. The worker keeps one per running attempt and streams it
(``worker/tasklogs.py``); the coordinator keeps the same bounds for each running attempt
(``coordinator/tasklogs.py``), and the attempt's result carries the final one as ``output["log"]``
(:meth:`TaskLog.to_json`).
"""

from __future__ import annotations

from typing import Any

HEAD_BYTES = 32 * 1024
TAIL_BYTES = 224 * 1024
LOG_KEY = "log"  # the key of the kept output in a result's output


def left_out(n: int) -> bytes:
    """The line that stands for ``n`` bytes no longer kept."""
    return f"\n[... {n:,} bytes left out ...]\n".encode()


def complete(data: bytes) -> int:
    """How many bytes of ``data`` end on a UTF-8 character boundary: a character split across two
    reads is returned whole by the second, never as two replacement characters."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b < 0x80:  # ASCII: everything before it is whole
            return len(data)
        if b >= 0xC0:  # the lead byte of a sequence of ``need`` bytes, ``back`` of them here
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return len(data) if back >= need else len(data) - back
    return len(data)


class TaskLog:
    """The kept head and tail of one attempt's output (module docstring). ``total`` counts every
    byte written, kept or not."""

    def __init__(self, head_bytes: int = HEAD_BYTES, tail_bytes: int = TAIL_BYTES) -> None:
        self.head_bytes, self.tail_bytes = head_bytes, tail_bytes
        self.head = bytearray()
        self.tail = bytearray()  # the bytes [tail_offset, total)
        self.total = 0
        self._head_open = True  # nothing went past the head yet: bytes still extend it

    @property
    def tail_offset(self) -> int:
        return self.total - len(self.tail)

    def append(self, data: bytes) -> None:
        """``data`` written after everything before it."""
        if self._head_open:
            room = self.head_bytes - len(self.head)
            self.head += data[:room]
            self.total += min(room, len(data))
            data = data[room:]
            if not data:
                return
            self._head_open = False
        if len(data) >= self.tail_bytes:
            self.tail[:] = data[-self.tail_bytes:]
        else:
            self.tail += data
            if (over := len(self.tail) - self.tail_bytes) > 0:
                del self.tail[:over]
        self.total += len(data)

    def put(self, offset: int, data: bytes) -> None:
        """A chunk received at byte ``offset``: what overlaps bytes already held is skipped; a gap
        before it (bytes the sender left out) is recorded as such."""
        if offset + len(data) <= self.total:
            return
        if offset < self.total:
            data = data[self.total - offset:]
        elif offset > self.total:
            self._head_open = False
            self.tail.clear()
            self.total = offset
        self.append(data)

    def segment(self, offset: int, limit: int) -> tuple[int, bytes]:
        """What a sender that sent everything before ``offset`` sends next, at most ``limit``
        bytes: ``(its offset, the bytes)``. From the head in order; past it, the newest ``limit``
        bytes of the tail when more is waiting (the middle is left out: a reader sees what the task
        writes now)."""
        if offset < len(self.head):
            return offset, bytes(self.head[offset:offset + limit])
        start = max(offset, self.tail_offset, self.total - limit)
        return start, bytes(self.tail[start - self.tail_offset:])

    def read(self, offset: int = 0, final: bool = False) -> tuple[bytes, int]:
        """Everything kept from byte ``offset`` on, with a ``left_out`` line where bytes are no
        longer kept, and the offset to read from next. Unless ``final``, a character still
        incomplete at the end is left for the next read."""
        if offset >= self.total:
            return b"", max(offset, self.total)
        out = bytearray()
        if offset < len(self.head):
            out += self.head[offset:]
            offset = len(self.head)
        if offset < self.tail_offset:
            out += left_out(self.tail_offset - offset)
            offset = self.tail_offset
        out += self.tail[offset - self.tail_offset:]
        end = len(out) if final else complete(bytes(out))
        return bytes(out[:end]), self.total - (len(out) - end)

    def to_json(self) -> dict[str, Any]:
        """The kept output as a result's ``output["log"]``: ``head`` and ``tail`` as text (a byte
        sequence that is not UTF-8 replaced), where the tail starts and how many bytes there were."""
        return {"head": self.head.decode(errors="replace"), "tail": self.tail.decode(errors="replace"),
                "tail_offset": self.tail_offset, "bytes": self.total}

    @classmethod
    def from_json(cls, value: Any) -> TaskLog | None:
        """The log :meth:`to_json` made (read back from a stored result); None for anything else."""
        if not isinstance(value, dict):
            return None
        head, tail, total = value.get("head"), value.get("tail"), value.get("bytes")
        if not isinstance(head, str) or not isinstance(tail, str) or not isinstance(total, int):
            return None
        log = cls(head_bytes=0, tail_bytes=1 << 62)
        log.head, log.tail = bytearray(head.encode()), bytearray(tail.encode())
        log._head_open = False
        log.total = max(total, len(log.head) + len(log.tail))
        return log

    @classmethod
    def of_text(cls, text: str) -> TaskLog:
        """A log holding ``text`` whole (the output an older worker's result carried)."""
        log = cls(head_bytes=0, tail_bytes=1 << 62)
        log._head_open = False
        log.append(text.encode(errors="replace"))
        return log
