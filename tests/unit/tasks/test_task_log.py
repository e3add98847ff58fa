"""A task's kept output (tasks/log.py): bounded head and tail, byte offsets, left-out marks, and
the worker's stream of it (worker/tasklogs.py) and the coordinator's copy (coordinator/tasklogs.py)."""

from __future__ import annotations

import asyncio

import pytest

from distributed_testing.coordinator.tasklogs import TaskLogs
from distributed_testing.protocol import messages as m
from distributed_testing.tasks.log import TaskLog, complete, left_out
from distributed_testing.worker import tasklogs as wt


def test_small_output_reads_back_whole_from_any_offset() -> None:
    log = TaskLog(head_bytes=8, tail_bytes=8)
    log.append(b"hello ")
    log.append(b"world")
    assert log.read(0) == (b"hello world", 11)
    assert log.read(6) == (b"world", 11)
    assert log.read(11) == (b"", 11)


def test_the_middle_of_a_long_output_reads_as_left_out() -> None:
    log = TaskLog(head_bytes=4, tail_bytes=4)
    for i in range(10):
        log.append(str(i).encode() * 3)
    assert log.total == 30 and bytes(log.head) == b"0001" and bytes(log.tail) == b"8999"
    text, nxt = log.read(0)
    assert text == b"0001" + left_out(22) + b"8999" and nxt == 30
    assert len(log.head) + len(log.tail) == 8  # the bound holds however much was written


def test_a_chunk_after_a_gap_is_kept_and_the_gap_reads_as_left_out() -> None:
    log = TaskLog(head_bytes=4, tail_bytes=100)
    log.put(0, b"ab")
    log.put(1, b"bc")  # overlap: only the new byte counts
    log.put(10, b"xyz")
    assert log.read(0)[0] == b"abc" + left_out(7) + b"xyz"
    log.put(5, b"old")  # wholly before what is held: ignored
    assert log.total == 13


def test_a_character_split_across_reads_is_returned_whole() -> None:
    data = "é".encode() * 3
    assert complete(data[:3]) == 2 and complete(data) == 6 and complete(b"ab") == 2
    log = TaskLog()
    log.append(data[:3])
    assert log.read(0) == ("é".encode(), 2)
    log.append(data[3:])
    assert log.read(2)[0].decode() == "éé"


def test_json_round_trip_keeps_offsets() -> None:
    log = TaskLog(head_bytes=4, tail_bytes=4)
    log.append(b"0123456789")
    back = TaskLog.from_json(log.to_json())
    assert back is not None and back.read(0) == log.read(0) and back.total == 10
    assert TaskLog.from_json({"head": 1}) is None


def test_worker_stream_sends_head_then_newest_tail_and_resends_after_reconnect() -> None:
    sent: list[m.Message] = []
    ready = [True]
    ref = m.TaskRef("t", 1)

    async def go() -> None:
        streams = wt.OutputStreams(sent.append, lambda: ready[0], lambda r: r == ref)
        write = streams.sink(ref)
        write(b"x" * (2 * wt.CHUNK_BYTES))
        streams.flush()  # the head
        streams.flush()  # the newest CHUNK_BYTES of the rest: the middle is left out
        ready[0] = False
        streams.flush()  # no session: nothing goes out
        ready[0] = True
        streams.flush()  # a new session: from offset 0 again
        streams.session_ended()  # a session that ended between two flushes
        streams.flush()  # the next one gets it all again too
        assert streams.finish(ref) is not None and streams.finish(ref) is None
        streams.close()

    asyncio.run(go())
    offsets = [c.offset for msg in sent for c in msg.chunks]  # type: ignore[attr-defined]
    sizes = [len(c.data) for msg in sent for c in msg.chunks]  # type: ignore[attr-defined]
    assert offsets == [0, wt.CHUNK_BYTES, 0, 0] and max(sizes) <= wt.CHUNK_BYTES


def test_coordinator_keeps_only_the_current_attempt_of_its_own_worker() -> None:
    from distributed_testing.coordinator.core.entities import Task
    from distributed_testing.tasks import spec as specs

    spec = specs.parse_task_json(b'{"task_id": "t", "type": "custom", "config": {"name": "noop"}}')[0]
    t = Task(spec=spec, spec_dict={}, task_id="t", type="custom", digest="", seq=1, submitted_at=0.0,
             state="running", attempt=2, worker_id="w1",
             history=[{"to": "assigned", "attempt": a, "worker_id": "w1"} for a in (1, 2)])
    logs = TaskLogs()
    msg = m.TaskOutput([m.OutputChunk(m.TaskRef("t", 2), 0, b"hi")])
    assert logs.receive({"t": t}, "w1", msg) == []
    assert logs.get("t") is not None
    refused = logs.receive({"t": t}, "w2", msg)
    assert [r.what for r in refused] == ["output"] and "another worker" in refused[0].reason  # type: ignore[union-attr]
    old = m.TaskOutput([m.OutputChunk(m.TaskRef("t", 1), 0, b"old")])
    assert logs.receive({"t": t}, "w1", old) == []  # its own superseded attempt: dropped, not refused
    never = m.TaskOutput([m.OutputChunk(m.TaskRef("t", 3), 0, b"never")])
    assert "never assigned" in logs.receive({"t": t}, "w1", never)[0].reason  # type: ignore[union-attr]
    held = logs.get("t")
    assert held is not None and held[1].read(0)[0] == b"hi"
    logs.end(["t"])
    assert logs.get("t") is None


@pytest.mark.parametrize("limit", [1, 5])
def test_segment_never_exceeds_the_limit(limit: int) -> None:
    log = TaskLog(head_bytes=3, tail_bytes=10)
    log.append(b"abcdefghijklmnop")
    offset, sent = 0, b""
    while offset < log.total:
        start, data = log.segment(offset, limit)
        assert len(data) <= limit and start >= offset
        offset, sent = start + len(data), sent + data
    assert sent.startswith(b"abc") and sent.endswith(b"p")
