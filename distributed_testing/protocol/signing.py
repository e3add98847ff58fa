"""The signed envelope every WebSocket frame travels in. Pure: the clock is passed in.

Frame layout: ``HMAC-SHA256(key, payload) [32 bytes] || payload`` where ``payload`` is the
MessagePack envelope (seq, ts, msg). The receiver checks the size, then the tag over the exact
bytes received, and only then decodes: nothing unauthenticated is ever parsed.

The per-session key is derived on both sides from the credential the worker presented at the
WebSocket handshake (API key or JWT) and a random session id the coordinator chose, so the key
itself never crosses the wire::

    key = HMAC-SHA256(credential, "dt-session-v1|" + session_id)

Each direction has its own strictly increasing sequence number; a frame whose ``seq`` is not
greater than the last accepted one is a replay. Timestamps outside ``±max_skew_s`` are stale.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field

from ..errors import DecodeError, FrameTooLarge, ReplayedMessage, SignatureError, StaleMessage
from .codec import decode_envelope, encode_envelope
from .messages import Message

TAG_SIZE = 32
DEFAULT_MAX_FRAME = 16 * 1024 * 1024
DEFAULT_MAX_SKEW_S = 300.0
# The handshake response header carrying the session id, the second input of derive_session_key
SESSION_HEADER = "X-DT-Session"


def derive_session_key(credential: str, session_id: str) -> bytes:
    return hmac.new(
        credential.encode(), b"dt-session-v1|" + session_id.encode(), hashlib.sha256
    ).digest()


@dataclass
class Channel:
    """One direction pair of a session: signs what we send, verifies what we receive."""

    key: bytes
    max_frame: int = DEFAULT_MAX_FRAME
    max_skew_s: float = DEFAULT_MAX_SKEW_S
    send_seq: int = 0
    recv_seq: int = 0
    rejected: dict[str, int] = field(default_factory=dict)

    def seal(self, msg: Message, now: float) -> bytes:
        self.send_seq += 1
        payload = encode_envelope(self.send_seq, now, msg)
        return hmac.digest(self.key, payload, hashlib.sha256) + payload

    def open(self, frame: bytes, now: float) -> Message:
        """Verify and decode one received frame; raises a ProtocolError subclass (and counts
        it in ``rejected``) when the frame must be refused."""
        try:
            return self._open(frame, now)
        except (DecodeError, FrameTooLarge, SignatureError) as exc:
            self.rejected[exc.code] = self.rejected.get(exc.code, 0) + 1
            raise

    def _open(self, frame: bytes, now: float) -> Message:
        if len(frame) > self.max_frame:
            raise FrameTooLarge(f"frame of {len(frame)} bytes exceeds limit {self.max_frame}")
        if len(frame) <= TAG_SIZE:
            raise DecodeError(f"frame of {len(frame)} bytes is too short to carry a signature")
        tag, payload = frame[:TAG_SIZE], frame[TAG_SIZE:]
        expected = hmac.digest(self.key, payload, hashlib.sha256)
        if not hmac.compare_digest(tag, expected):
            raise SignatureError("HMAC signature does not match the frame")
        env = decode_envelope(payload)
        if not abs(env.ts - now) <= self.max_skew_s:  # also rejects NaN
            raise StaleMessage(
                f"timestamp {env.ts:.3f} is {env.ts - now:+.1f}s from now (window ±{self.max_skew_s}s)"
            )
        if env.seq <= self.recv_seq:
            raise ReplayedMessage(f"sequence {env.seq} is not after {self.recv_seq}")
        self.recv_seq = env.seq
        return env.msg
