"""Helpers shared by the command-line entry points (logging, signals, argument types)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import math
import os
import signal
from pathlib import Path

# Cyclic-GC thresholds for the long-running processes; see tune_gc.
GC_THRESHOLDS = (50_000, 20, 100)


def add_log_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="logging verbosity (default INFO)")


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def tune_gc() -> None:
    """Make CPython's cyclic garbage collector run rarely in a long-running process.

    The coordinator keeps every task's spec and history in memory and the worker its running
    tasks; with the default thresholds (700, 10, 10) the collector rescans those long-lived
    objects thousands of times a minute. Measured in a 6,000-task ``benchmarks/dispatch.py`` run:
    the coordinator spent 1.27 s in 554 collections with the defaults, 0.14 s in 4 with these
    thresholds. Reference counting still frees almost every object at once; only garbage in
    reference cycles waits longer. Objects alive after start-up are frozen out of collection.
    """
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def wait_for_signal() -> signal.Signals:
    """Block until SIGINT or SIGTERM arrives; returns which."""
    loop = asyncio.get_running_loop()
    got: asyncio.Future[signal.Signals] = loop.create_future()

    def on_signal(sig: signal.Signals) -> None:
        if not got.done():
            got.set_result(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        return await got
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def seconds(text: str) -> float:
    """An argparse type: a finite number of seconds >= 0, else a usage error naming the flag (a
    negative one would time out at once; nan or inf would reach the API as invalid JSON)."""
    return _seconds(text, positive=False)


def positive_seconds(text: str) -> float:
    """As :func:`seconds`, > 0."""
    return _seconds(text, positive=True)


def _seconds(text: str, *, positive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not ((value > 0 if positive else value >= 0) and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds {'>' if positive else '>='} 0: {text!r}")
    return value


def output_file(text: str) -> Path:
    """An argparse type: a file this process can create or replace (``--junit``, ``--json``),
    checked before any work, so a typo does not surface only after a long wait."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory, not a file to write")
    existing = path.parent  # the reports create missing folders: the nearest one that exists decides
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: {existing} is not a directory")
    if not os.access(path if path.exists() else existing, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: permission denied")
    return path
