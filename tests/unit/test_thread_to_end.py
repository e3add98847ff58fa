"""``process.aio.thread_to_end``: a cancelled caller resumes only once the thread has ended, so
its cleanup never races the thread (a shipped task cancelled while its tree was being copied
removed the folder the copy went on writing into: rmtree failed, the folder stayed)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from distributed_testing.process.aio import thread_to_end


@pytest.mark.asyncio
async def test_a_cancel_waits_for_the_thread_to_end(tmp_path: Path) -> None:
    started = threading.Event()

    def copy() -> str:
        started.set()
        time.sleep(0.5)
        (tmp_path / "written").write_text("late")
        return "done"

    task = asyncio.ensure_future(thread_to_end(copy))
    await asyncio.to_thread(started.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (tmp_path / "written").exists()  # the thread had ended when the cancel reached the caller


@pytest.mark.asyncio
async def test_its_result_and_errors_are_the_threads() -> None:
    assert await thread_to_end(lambda a, b=0: a + b, 2, b=3) == 5
    with pytest.raises(ZeroDivisionError):
        await thread_to_end(lambda: 1 / 0)
