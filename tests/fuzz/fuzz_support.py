"""Shared plumbing for the fuzz suite: one real coordinator per module, and case counters.

Hypothesis drives plain (synchronous) test functions; the coordinator and every client run on an
event loop in a background thread (``Background``), and each example submits its coroutine there.
That keeps one coordinator per module however many examples run, with no event-loop scoping
between pytest-asyncio and hypothesis to get wrong.

Every example increments ``CASES[<suite>]``; the totals are printed at the end of the session
(``pytest_terminal_summary``), e.g. ``fuzz cases run: 1234 REST, 567 WS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

from distributed_testing.testing import Cluster, run_cluster

T = TypeVar("T")
CASES: Counter[str] = Counter()
CALL_TIMEOUT_S = 30.0


class Background:
    """An event loop in a daemon thread, holding a ``run_cluster`` open until ``close()``."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fuzz-coordinator", daemon=True)
        self._thread.start()
        self._stop: asyncio.Event | None = None
        self._holder: Any = None
        self.cluster: Cluster | None = None

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT_S) -> T:
        """Run ``coro`` on the background loop and return its result (or raise its exception)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start_cluster(self, tmp: Path, **kwargs: Any) -> Cluster:
        ready: asyncio.Future[Cluster] = self.loop.create_future()

        async def hold() -> None:
            self._stop = asyncio.Event()
            try:
                async with run_cluster(tmp, **kwargs) as c:
                    ready.set_result(c)
                    await self._stop.wait()
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc)
                raise

        self._holder = asyncio.run_coroutine_threadsafe(hold(), self.loop)

        async def wait_ready() -> Cluster:
            return await ready

        self.cluster = self.run(wait_ready())
        return self.cluster

    def close(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
            with contextlib.suppress(Exception):
                self._holder.result(CALL_TIMEOUT_S)
        pending = asyncio.run_coroutine_threadsafe(_cancel_others(), self.loop)
        with contextlib.suppress(Exception):
            pending.result(CALL_TIMEOUT_S)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(CALL_TIMEOUT_S)
        self.loop.close()


async def _cancel_others() -> None:
    me = asyncio.current_task()
    others = [t for t in asyncio.all_tasks() if t is not me]
    for t in others:
        t.cancel()
    await asyncio.gather(*others, return_exceptions=True)


@contextlib.contextmanager
def background_cluster(tmp: Path, **kwargs: Any) -> Iterator[tuple[Background, Cluster]]:
    bg = Background()
    try:
        yield bg, bg.start_cluster(tmp, **kwargs)
    finally:
        bg.close()
