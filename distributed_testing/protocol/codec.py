"""Bytes ⇄ messages. The only place the wire format is known.

The payload of a frame is a MessagePack ``Envelope`` (sequence number, timestamp, message).
Decoding is strict: unknown fields, unknown ``type`` tags and wrong types raise one
:class:`~distributed_testing.errors.DecodeError` with the cause chained.
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


def encode_envelope(seq: int, ts: float, msg: Message) -> bytes:
    return _encoder.encode(Envelope(seq, ts, msg))


def decode_envelope(payload: bytes) -> Envelope:
    try:
        return _decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise DecodeError(f"malformed message: {exc}") from exc
