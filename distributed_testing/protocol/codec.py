"""Bytes ⇄ messages. The only place the wire format is known.

The payload of a frame is a MessagePack ``Envelope`` (sequence number, timestamp, message).
Decoding is strict: unknown fields, unknown ``type`` tags, wrong types, strings that are not
UTF-8, and free-form values (``hardware``, ``config``, ``output``) that JSON cannot represent
(MessagePack extension types; map keys other than strings and numbers) raise one
:class:`~distributed_testing.errors.DecodeError` with the cause chained: the coordinator stores
and serves those values as JSON.
"""

from __future__ import annotations

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
