"""What a task's result may carry. Pure: no awaits, no clock, no sockets.

A task's output is untrusted data: a handler's return value, a test's ``record_property``, a
benchmark's numbers. It is checked once, where an executor's outcome enters the worker
(``runs.Runs._report``, with :func:`bound`), so nothing after it (the outbox journal, the result
store, the ``results`` frame, the coordinator) meets a value it cannot encode or a result larger
than a frame: such an outcome becomes the task's ``error`` naming what was wrong, and the worker,
its other tasks and its other stored results go on as before. A result stored before these checks
that still cannot be sent (an old outbox) is replaced, where its frame is sealed, by an ``error``
result saying so (:func:`unsendable`), so it is acknowledged and forgotten, never re-sent for ever.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...protocol import messages as m
from ...protocol.codec import free_form_payload
from ...protocol.signing import DEFAULT_MAX_FRAME

# The encoded output one result may carry: half the frame limit, so a result with its error text
# (MAX_ERROR_CHARS) always fits one ``results`` frame, and a batch of them is split across frames.
MAX_OUTPUT_BYTES = DEFAULT_MAX_FRAME // 2
# A result's error text keeps its first and last half of this many characters (the opening names
# what failed, the end of a traceback where).
MAX_ERROR_CHARS = 64 * 1024
# An executor's progress message is cut to this many characters.
MAX_PROGRESS_CHARS = 1024
# Outputs that encode to more than this are checked off the event loop (``large``): reading back
# a 6 MB pytest report takes ~70 ms.
INLINE_CHECK_BYTES = 256 * 1024


def bound(status: m.ResultStatus, output: dict[str, Any], error: str | None
          ) -> tuple[m.ResultStatus, dict[str, Any], str | None]:
    """``(status, output, error)`` as a result may carry them: the error text cut to
    ``MAX_ERROR_CHARS`` (and made UTF-8), and an output that a frame cannot carry (a number beyond
    64 bits, a type with no JSON form) or that encodes to more than ``MAX_OUTPUT_BYTES`` refused:
    then the status is ``error`` (not retryable: it would be refused anywhere), the output holds
    only ``retryable`` (and ``output_bytes``, its size), and the error says what was refused, then
    how the task itself ended."""
    error = None if error is None else cut(error, MAX_ERROR_CHARS)
    if output.__class__ is dict and not output:  # an empty output (a no-op's, most side-effect handlers'): fits
        return status, output, error
    try:
        size = len(free_form_payload(output))
    except ValueError as exc:
        return "error", {"retryable": False}, _refused(f"its output cannot be sent: {exc}", status, error)
    if size > MAX_OUTPUT_BYTES:
        return "error", {"retryable": False, "output_bytes": size}, _refused(
            f"its output is {size:,} bytes encoded, over the {MAX_OUTPUT_BYTES:,} bytes ({MAX_OUTPUT_BYTES >> 20} MiB) "
            "a result may carry; return less, or write it to a file or store of your own", status, error)
    return status, output, error


def large(output: dict[str, Any]) -> bool:
    """Whether checking ``output`` is worth a thread (it encodes to over ``INLINE_CHECK_BYTES``)."""
    if output.__class__ is dict and not output:
        return False
    try:
        return len(msgspec.msgpack.encode(output)) > INLINE_CHECK_BYTES
    except (OverflowError, TypeError, ValueError, RecursionError):
        return False  # refused by ``bound`` at once


def cut(text: str, limit: int) -> str:
    """``text`` as valid UTF-8 (a lone surrogate replaced) and at most about ``limit`` characters:
    its first and last halves around a note of how much was cut."""
    try:
        text.encode()
    except UnicodeEncodeError:
        text = text.encode(errors="replace").decode()
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half:,} characters cut ...]\n{text[-half:]}"


def unsendable(result: m.TaskResult, why: str) -> m.TaskResult:
    """What is sent instead of a stored ``result`` whose frame cannot be made (``why``): an
    ``error`` result of the same attempt, so its acknowledgement ends the re-sends."""
    return m.TaskResult(task_id=result.task_id, attempt=result.attempt, status="error",
                        started_at=result.started_at, finished_at=result.finished_at, output={"retryable": False},
                        error=f"the result this worker stored for the task (status {result.status}) cannot be sent: "
                              f"{why}", worker_id=result.worker_id)


def _refused(what: str, status: str, error: str | None) -> str:
    return f"the task's result was refused: {what} (the task itself ended {status}{': ' + error if error else ''})"
