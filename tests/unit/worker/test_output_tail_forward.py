"""``OutputTail.forward``: a child's stderr line becomes exactly one line of the worker's log,
marked as the child's. Every character Python's ``str.splitlines`` (and so a log reader written
in Python) takes for a line boundary is escaped: U+2028 and U+2029 (line and paragraph separator)
were not, so a child could forge what read as a line of the worker's own."""

from __future__ import annotations

import asyncio
import logging

import pytest

from distributed_testing.worker.executors.proc import OutputTail

BOUNDARIES = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\r"
FORGED = "2030-01-01 00:00:00,000 ERROR distributed_testing.worker.agent: forged"


@pytest.mark.parametrize("boundary", list(BOUNDARIES))
def test_a_childs_line_is_one_line_of_the_log(boundary: str, caplog: pytest.LogCaptureFixture) -> None:
    async def forward() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(f"harmless{boundary}{FORGED}\n".encode())
        reader.feed_eof()
        await OutputTail().forward(reader, logging.getLogger("test.forward"), "child 7:")

    with caplog.at_level(logging.INFO, logger="test.forward"):
        asyncio.run(forward())
    [message] = [r.getMessage() for r in caplog.records]
    assert message.startswith("child 7: harmless")
    assert len(message.splitlines()) == 1, repr(message)
