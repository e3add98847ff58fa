"""The rules for what a task's result may carry (worker/core/output.py), how a ``results`` message
becomes frames the coordinator accepts (worker/session.py ``sealed``), and the manifest paths a
worker can lay out (bundles/manifest.py). The processes behind them:
tests/integration/security/test_task_output_attacks.py."""

from __future__ import annotations

import time
from typing import Any

import pytest

from distributed_testing.bundles import manifest as mf
from distributed_testing.errors import ValidationError
from distributed_testing.protocol import messages as m
from distributed_testing.protocol.signing import Channel
from distributed_testing.worker.core.output import (
    INLINE_CHECK_BYTES,
    MAX_ERROR_CHARS,
    MAX_OUTPUT_BYTES,
    bound,
    cut,
    large,
)
from distributed_testing.worker.session import sealed

DIGEST = "ab" * 32


@pytest.mark.parametrize(("output", "named"), [
    ({"n": 2**80}, "output['n']: the integer 1208925819614629174706176 is outside the 64 bits"),
    ({"a": [{"b": -(2**63) - 1}]}, "output['a'][0]['b']: the integer -9223372036854775809"),
    ({"k": {None: 1}}, "output['k']: the key None is not a string or a number"),
    ({"k": {(1, 2): 1}}, "output['k']: the key (1, 2) is not a string or a number"),
    ({1: "x"}, "output: the key 1 is not a string"),
    ({"s": "\udcff"}, "output['s']: a string that is not UTF-8"),
    ({"o": object()}, "output['o']: a value of type object has no form"),
    ({"n": 2**4000}, "the integer of 4001 bits"),
])
def test_an_output_no_frame_carries_is_the_tasks_error_naming_where(output: dict[Any, Any], named: str) -> None:
    status, out, error = bound("succeeded", output, "a note")
    assert (status, out) == ("error", {"retryable": False})
    assert error is not None and named in error and error.endswith("(the task itself ended succeeded: a note)"), error


def test_what_a_frame_carries_passes_as_it_is() -> None:
    output = {"n": 2**64 - 1, "m": -(2**63), "f": 1.5, "l": [None, True, "x"], "d": {"1": {2: 3}}}
    assert bound("failed", output, None) == ("failed", output, None)
    assert bound("succeeded", output, None)[1] is output  # not copied


def test_an_empty_output_passes_at_once_with_its_error_cut() -> None:
    """The empty output (a no-op's; the check's short path) passes as it is, its error still cut."""
    empty: dict[str, Any] = {}
    status, out, error = bound("failed", empty, "e" * (2 * MAX_ERROR_CHARS))
    assert (status, out) == ("failed", {}) and out is empty and error is not None and len(error) < MAX_ERROR_CHARS + 100
    assert not large(empty) and large({"blob": "x" * (INLINE_CHECK_BYTES + 1)})


def test_an_output_over_the_limit_is_refused_with_its_size() -> None:
    status, out, error = bound("succeeded", {"blob": "x" * MAX_OUTPUT_BYTES}, None)
    assert status == "error" and out["retryable"] is False and out["output_bytes"] > MAX_OUTPUT_BYTES
    assert f"its output is {out['output_bytes']:,} bytes encoded, over the 8,388,608 bytes (8 MiB)" in str(error)


def test_error_text_is_cut_in_the_middle_and_made_utf8() -> None:
    text = "head" + "x" * (2 * MAX_ERROR_CHARS) + "tail"
    short = cut(text, MAX_ERROR_CHARS)
    assert short.startswith("head") and short.endswith("tail") and len(short) < MAX_ERROR_CHARS + 100
    assert f"[... {len(text) - MAX_ERROR_CHARS:,} characters cut ...]" in short
    assert bound("failed", {}, "bad \udcff byte") == ("failed", {}, "bad ? byte")


def _result(task_id: str, output: dict[str, Any]) -> m.TaskResult:
    return m.TaskResult(task_id, 1, "succeeded", 1.0, 2.0, output=output, worker_id="w")


def test_a_results_message_is_split_across_frames_and_an_unsendable_result_replaced() -> None:
    sender, receiver = Channel(b"k" * 32, max_frame=1000), Channel(b"k" * 32, max_frame=1000)
    results = [_result("a", {"x": "y" * 400}), _result("b", {"x": "y" * 400}), _result("big", {"x": "y" * 2000}),
               _result("int", {"n": 2**70}), _result("c", {})]
    frames = sealed(sender, m.Results(results), time.time(), limit=1000)
    messages = [receiver.open(f, time.time()) for f in frames]
    got = [r for msg in messages if isinstance(msg, m.Results) for r in msg.results]
    assert all(len(f) <= 1000 for f in frames) and len(frames) > 1
    assert [(r.task_id, r.status) for r in got] == [("a", "succeeded"), ("b", "succeeded"), ("big", "error"),
                                                    ("int", "error"), ("c", "succeeded")]
    assert "its frame is" in str(got[2].error) and "over the 1,000 bytes a frame may hold" in str(got[2].error)
    assert "cannot be encoded" in str(got[3].error) and got[3].output == {"retryable": False}


def test_another_message_that_cannot_be_sealed_is_our_fault() -> None:
    with pytest.raises(ValueError, match="cannot send TaskProgress"):
        sealed(Channel(b"k" * 32), m.TaskProgress(m.TaskRef("t", 1), 0.5, "x" * 2000), time.time(), limit=1000)


@pytest.mark.parametrize(("path", "named"), [
    ("n" * 256, "is 256 bytes; a file or directory name is at most 255 bytes"),
    ("é" * 128 + ".py", "is 259 bytes"),
    ("/".join(["d"] * 101), "101 levels deep; at most 100"),
    ("/".join(["dd"] * 400), "path is 1,199 bytes; at most 1,024"),
    ("bad\udcffname.py", "not valid UTF-8"),
])
def test_a_manifest_path_a_worker_cannot_lay_out_is_refused_naming_the_limit(path: str, named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        mf.validate(mf.Manifest([mf.FileEntry(path, DIGEST, 1)]))
    mf.validate(mf.Manifest([mf.FileEntry("n" * 255, DIGEST, 1), mf.FileEntry("/".join(["d"] * 99) + "/x", DIGEST, 1)]))
