"""Helpers shared by the executor tests: a real handler module, condition waits, loop runner."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

HANDLER_MODULE = "dt_exec_test_handlers"

HANDLER_SOURCE = '''
import ctypes
import os
import subprocess
import sys
import time
from pathlib import Path


def boom(parameters, ctx):
    raise ValueError("boom: " + str(parameters.get("why", "no reason")))


def exit_hard(parameters, ctx):
    os._exit(parameters.get("code", 7))


def whisper(parameters, ctx):
    print(parameters["text"])  # stdout (the child's stderr), buffered
    return {}


def say_and_exit(parameters, ctx):
    print(parameters["text"], flush=True)
    os._exit(3)


def segfault(parameters, ctx):
    ctypes.string_at(0)


def whoami(parameters, ctx):
    return {"pid": os.getpid(), "pgid": os.getpgid(0), "task_id": ctx.task_id,
            "cache_dir": None if ctx.cache_dir is None else str(ctx.cache_dir)}


def spawn_and_block(parameters, ctx):
    """Start a `sleep 60` grandchild, record both pids in parameters["pidfile"], then block."""
    grandchild = subprocess.Popen(["sleep", "60"])
    tmp = Path(parameters["pidfile"] + ".tmp")
    tmp.write_text(f"{os.getpid()} {grandchild.pid}")
    tmp.rename(parameters["pidfile"])
    time.sleep(60)
    return {}


def chatty(parameters, ctx):
    print("x" * 100000)
    print("to stderr", file=sys.stderr)
    return {"said": "hello"}


def not_json(parameters, ctx):
    return {"value": object()}


def hog(parameters, ctx):
    held = b"x" * (parameters["mb"] * 1024 * 1024)
    time.sleep(60)
    return {"len": len(held)}
'''

HANDLER_NAMES = ("boom", "exit_hard", "say_and_exit", "whisper", "segfault", "whoami", "spawn_and_block", "chatty", "not_json", "hog")


def run(coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
    """Run ``coro`` in a fresh event loop, failing the test if it takes over ``timeout`` s."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``predicate`` until true; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


async def closing(executor: Any, body: Callable[[Any], Awaitable[T]]) -> T:
    """Start ``executor``, run ``body(executor)``, always close it."""
    await executor.start()
    try:
        return await body(executor)
    finally:
        await executor.close()
