"""Payloads found by fuzzing the worker endpoint (tests/fuzz): each must be one DecodeError."""

from __future__ import annotations

import hashlib
import hmac
import time

import msgspec
import pytest

from distributed_testing.errors import DecodeError
from distributed_testing.protocol import messages as m
from distributed_testing.protocol.codec import decode_envelope, encode_envelope
from distributed_testing.protocol.signing import Channel

NOW = 1_700_000_000.0


def envelope(msg: dict[str, object]) -> bytes:
    return msgspec.msgpack.encode([1, NOW, msg])


def result(**over: object) -> dict[str, object]:
    r: dict[str, object] = {"task_id": "t", "attempt": 1, "status": "succeeded", "started_at": 0.0, "finished_at": 1.0}
    return {"type": "results", "results": [{**r, **over}]}


@pytest.mark.parametrize(("payload", "why"), [
    # a str whose bytes are not UTF-8 (was a UnicodeDecodeError that ended the session)
    (envelope({"type": "goodbye", "reason": "x"}).replace(b"\xa1x", b"\xa1\x80"), "utf-8"),
    # values JSON cannot hold, in fields stored as JSON (each crashed the DuckDB checkpointer)
    (envelope(result(output={"a": msgspec.msgpack.Ext(1, b"x")})), "Ext"),
    (envelope(result(output={"a": {None: 1}})), "keys"),
    (envelope(result(output={"a": {(1,): 1}})), "keys"),
    (envelope({"type": "register", "worker_id": "w", "name": "w", "protocol_version": 1, "capabilities": [],
               "tags": [], "max_concurrent": 1, "hardware": {"gpu": {True: "x"}}}), "keys"),
    # attempts are 64-bit signed in the store (2**64 - 1 crashed the checkpointer)
    (envelope(result(attempt=2**64 - 1)), "<= 9223372036854775807"),
    (envelope({"type": "started", "tasks": [["t", 2**63]], "at": 0.0}), "<= 9223372036854775807"),
    # nesting deeper than the decoder's recursion limit
    (b"\x93\x01\xcb" + msgspec.msgpack.encode(NOW)[1:] + b"\x91" * 100_000, ""),
])
def test_is_one_decode_error(payload: bytes, why: str) -> None:
    with pytest.raises(DecodeError, match="malformed message") as info:
        decode_envelope(payload)
    assert why.lower() in str(info.value).lower()  # msgspec 0.23 says "UTF-8", earlier "utf-8"


def test_json_values_still_pass() -> None:
    msg = m.Results([m.TaskResult("t", 2**63 - 1, "failed", 0.0, 1.0, output={"a": [1, 2.5, None, {"b": "c"}],
                                                                             "inf": float("inf"), "raw": b"\x00"})])
    assert decode_envelope(encode_envelope(3, NOW, msg)).msg == msg  # served as null and base64


def test_a_channel_counts_them_as_malformed() -> None:
    ch = Channel(b"k" * 32)
    peer = Channel(b"k" * 32)
    frame = peer.seal(m.Results([m.TaskResult("t", 1, "succeeded", 0.0, 1.0)]), time.time())
    payload = frame[32:].replace(b"\xa1t", b"\xa1\xff")  # signed correctly, but not UTF-8
    bad = hmac.new(b"k" * 32, payload, hashlib.sha256).digest() + payload
    with pytest.raises(DecodeError):
        ch.open(bad, time.time())
    assert ch.rejected == {"malformed": 1}
