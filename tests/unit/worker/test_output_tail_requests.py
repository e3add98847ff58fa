"""A long-lived child's stderr carries ``REQUEST_END`` after each request's output
(process/childout.py): the tail a later request reports starts after the last one, so bytes of the
request before that the worker had not read yet when the later one started never reach its
``stderr_tail`` (another submitter's output, possibly), and the marker is in no tail or log line."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from distributed_testing.process.childout import REQUEST_END
from distributed_testing.worker.executors.proc import OutputTail

ROOT = Path(__file__).resolve().parents[3]


def test_bytes_of_the_request_before_read_after_the_next_one_started_are_not_its_output() -> None:
    tail = OutputTail()
    tail.feed(b"task A: starting\n")
    mark = tail.total_bytes  # task B starts: the worker has not read A's last bytes yet
    tail.feed(b"task A: secret of submitter A\n" + REQUEST_END)
    tail.feed(b"task B: dying\n")
    assert tail.text(since=mark) == "task B: dying\n"


@pytest.mark.parametrize("cut", range(1, len(REQUEST_END)))
def test_a_marker_split_between_two_reads_is_found(cut: int) -> None:
    tail = OutputTail()
    data = b"A's output" + REQUEST_END + b"B's output"
    split = len(b"A's output") + cut
    tail.feed(data[:split])
    tail.feed(data[split:])
    assert tail.ended_at == len(b"A's output" + REQUEST_END)
    assert tail.text(since=0) == "B's output"


def test_without_markers_the_tail_is_what_came_after_since() -> None:
    tail = OutputTail(limit=8)
    tail.feed(b"0123456789")
    assert (tail.text(), tail.text(since=6)) == ("23456789", "6789")


def test_a_marker_is_no_line_of_the_log(caplog: pytest.LogCaptureFixture) -> None:
    async def forward() -> OutputTail:
        reader = asyncio.StreamReader()
        reader.feed_data(b"line one\n" + REQUEST_END + b"no newline" + REQUEST_END + b"line two\n")
        reader.feed_eof()
        tail = OutputTail()
        await tail.forward(reader, logging.getLogger("test.requests"), "child 7:")
        return tail

    with caplog.at_level(logging.INFO, logger="test.requests"):
        tail = asyncio.run(forward())
    assert [r.getMessage() for r in caplog.records] == ["child 7: line one", "child 7: no newline",
                                                        "child 7: line two"]
    assert tail.text() == "line two\n"


@pytest.mark.parametrize(("printed", "expected"), [("", b""), ("unread output\n", b"unread output\n" + REQUEST_END)])
def test_a_child_marks_the_end_only_of_output_the_worker_has_not_read(printed: str, expected: bytes) -> None:
    """A request that printed nothing (or whose output the worker read already) writes no marker,
    so the worker's stderr reader is not woken for it."""
    code = ("import sys; from distributed_testing.process.childout import end_request; "
            f"sys.stderr.write({printed!r}); end_request()")
    child = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, cwd=ROOT)
    assert child.wait(60) == 0  # nothing of the pipe read meanwhile (a few bytes: it cannot fill)
    assert child.stderr is not None and child.stderr.read() == expected
    child.stderr.close()
