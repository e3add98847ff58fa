"""Bytes ⇄ messages. The only place the wire format is known.

The payload of a frame is a MessagePack ``Envelope`` (sequence number, timestamp, message).
Decoding is strict: unknown fields, unknown ``type`` tags, wrong types, strings that are not
UTF-8, and free-form values (``hardware``, ``config``, ``output``) that JSON cannot represent
(MessagePack extension types; map keys other than strings and numbers) raise one
:class:`~distributed_testing.errors.DecodeError` with the cause chained: the coordinator stores
and serves those values as JSON. :func:`free_form_payload` applies the same rules to a value
before it is sent, so the sender can refuse it in words instead of losing the frame.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..errors import DecodeError
from .messages import Message


class Envelope(msgspec.Struct, frozen=True, array_like=True):
    seq: int
    ts: float
    msg: Message


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Envelope)
_json_check = msgspec.json.Encoder().encode
_free_form_decoder = msgspec.msgpack.Decoder(dict[str, Any])
# MessagePack's integers: what a frame can carry at all
INT_MIN, INT_MAX = -(2**63), 2**64 - 1
# How deep ``unrepresentable`` looks for the value to name; deeper, it names the depth
_LOCATE_DEPTH = 64


def encode_envelope(seq: int, ts: float, msg: Message) -> bytes:
    return _encoder.encode(Envelope(seq, ts, msg))


def decode_envelope(payload: bytes) -> Envelope:
    try:
        env = _decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError) as exc:
        raise DecodeError(f"malformed message: {exc}") from exc
    try:
        _json_check(env.msg)
    except (TypeError, RecursionError) as exc:  # an extension type; a map key not a string or number
        raise DecodeError(f"malformed message: not representable as JSON: {exc}") from exc
    return env


def free_form_payload(value: dict[str, Any]) -> bytes:
    """``value`` (a result's ``output``) encoded as a frame carries it, checked the way
    ``decode_envelope`` reads it back. ValueError naming where it holds what a frame cannot carry:
    an integer outside ``INT_MIN..INT_MAX``, a type MessagePack has no form for, a map key that is
    neither a string nor a number, nesting deeper than the encoder follows."""
    try:
        payload = _encoder.encode(value)
        _json_check(_free_form_decoder.decode(payload))
    except (OverflowError, TypeError, ValueError, RecursionError, msgspec.DecodeError) as exc:
        raise ValueError(unrepresentable(value) or str(exc)) from exc
    return payload


def unrepresentable(value: Any, path: str = "output", depth: int = 0) -> str | None:
    """Where in ``value`` the first thing a frame cannot carry sits, and what it is (None when
    nothing is found within ``_LOCATE_DEPTH`` levels)."""
    if depth > _LOCATE_DEPTH:
        return f"{path.split('[')[0]}: nested more than {_LOCATE_DEPTH} levels deep"
    if isinstance(value, str):
        return None if _utf8(value) else f"{path}: a string that is not UTF-8 (it holds a lone surrogate)"
    if isinstance(value, bool) or value is None or isinstance(value, float | bytes):
        return None
    if isinstance(value, int):
        if INT_MIN <= value <= INT_MAX:
            return None
        return (f"{path}: the integer {_show(value)} is outside the 64 bits a result carries "
                "(-2**63..2**64-1); return it as a string")
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and not _utf8(k):
                return f"{path}: a key that is not UTF-8 (it holds a lone surrogate)"
            if not isinstance(k, str) and (depth == 0 or isinstance(k, bool) or not isinstance(k, int | float)):
                return f"{path}: the key {_show(k)} is not a string{'' if depth == 0 else ' or a number'}"
            if (why := unrepresentable(v, f"{path}[{_show(k)}]", depth + 1)) is not None:
                return why
        return None
    if isinstance(value, list | tuple | set | frozenset):
        for i, v in enumerate(value):
            if (why := unrepresentable(v, f"{path}[{i}]", depth + 1)) is not None:
                return why
        return None
    return f"{path}: a value of type {type(value).__name__} has no form in a result (JSON types only)"


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _show(value: Any) -> str:
    """``repr(value)`` up to 60 characters (an integer too long to print by its size)."""
    if isinstance(value, int) and value.bit_length() > 192:
        return f"of {value.bit_length()} bits"
    return repr(value)[:60]
