"""The signed wire protocol, tested without an event loop.

What users depend on: every message survives seal/open unchanged; anything an attacker or a broken
peer can do to a frame (flip a byte, cut it, replay it, send it late or early, send it huge, sign
it with the wrong key) is refused with a ProtocolError subclass, counted, and never accepted or
turned into some other exception.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, get_args

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from distributed_testing.errors import (
    DecodeError,
    FrameTooLarge,
    ProtocolError,
    ReplayedMessage,
    SignatureError,
    StaleMessage,
)
from distributed_testing.protocol import messages as m
from distributed_testing.protocol.codec import decode_envelope, encode_envelope
from distributed_testing.protocol.signing import TAG_SIZE, Channel, derive_session_key

KEY = derive_session_key("dtk_test_credential", "session-1")
NOW = 1_700_000_000.0
SKEW = 300.0
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ------------------------------------------------------------------ strategies
# Values stay inside what the wire carries exactly: no NaN (NaN != NaN would make round-trip
# equality meaningless), UTF-8-encodable text, 64-bit ints.

text = st.text(alphabet=st.characters(codec="utf-8"), max_size=20)
ints = st.integers(min_value=-(2**63), max_value=2**63 - 1)
floats = st.floats(allow_nan=False, width=64)
finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12)
opt_text = st.none() | text

json_like: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | ints | floats | text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(text, children, max_size=4),
    max_leaves=12,
)
any_dict = st.dictionaries(text, json_like, max_size=5)

task_refs = st.builds(m.TaskRef, task_id=text, attempt=ints)
ref_lists = st.lists(task_refs, max_size=4)
statuses = st.sampled_from(get_args(m.ResultStatus))
worker_states = st.sampled_from(get_args(m.WorkerState))

assignments = st.builds(
    m.TaskAssignment,
    task_id=text,
    attempt=ints,
    type=text,
    config=any_dict,
    timeout_s=st.none() | finite,
    max_memory_mb=st.none() | ints,
    cache=st.booleans(),
)
task_results = st.builds(
    m.TaskResult,
    task_id=text,
    attempt=ints,
    status=statuses,
    started_at=finite,
    finished_at=finite,
    output=any_dict,
    error=opt_text,
    worker_id=text,
)

MESSAGE_STRATEGIES: dict[type[Any], st.SearchStrategy[Any]] = {
    m.Register: st.builds(
        m.Register,
        worker_id=text,
        name=text,
        protocol_version=ints,
        hardware=any_dict,
        capabilities=st.lists(text, max_size=4),
        tags=st.lists(text, max_size=4),
        max_concurrent=ints,
        memory_gb=finite,
        running=ref_lists,
        abandoned=ref_lists,
        pipeline_depth=st.integers(min_value=0, max_value=m.MAX_PIPELINE_DEPTH),
        batches=st.booleans(),
    ),
    m.Registered: st.builds(
        m.Registered, worker_id=text, session_id=text, heartbeat_interval_s=finite, server_time=finite,
        worker_ttl_s=finite, batches=st.booleans(), reports=st.booleans()
    ),
    m.Heartbeat: st.builds(
        m.Heartbeat,
        state=worker_states,
        running=ref_lists,
        cpu_percent=finite,
        memory_percent=finite,
        free_slots=ints,
        reason=opt_text,
    ),
    m.AssignTasks: st.builds(m.AssignTasks, tasks=st.lists(assignments, max_size=3), batch_id=opt_text,
                             provisional=st.integers(min_value=0, max_value=2**40)),
    m.Confirm: st.builds(m.Confirm, upto=st.integers(min_value=0, max_value=2**40)),
    m.TaskStarted: st.builds(m.TaskStarted, tasks=ref_lists, at=finite),
    m.TaskProgress: st.builds(m.TaskProgress, task=task_refs, fraction=finite, message=text),
    m.Results: st.builds(m.Results, results=st.lists(task_results, max_size=3)),
    m.ResultAck: st.builds(m.ResultAck, tasks=ref_lists),
    m.Cancel: st.builds(m.Cancel, task=task_refs, reason=text),
    m.TakeBack: st.builds(m.TakeBack, tasks=ref_lists),
    m.TakenBack: st.builds(m.TakenBack, dropped=ref_lists, kept=ref_lists),
    m.ErrorMsg: st.builds(m.ErrorMsg, code=text, detail=text, fatal=st.booleans()),
    m.Drain: st.builds(m.Drain, reason=text, deadline_s=finite),
    m.Goodbye: st.builds(m.Goodbye, reason=text, handed_back=ref_lists),
    m.AuthRenew: st.builds(m.AuthRenew, token=text),
    m.TaskOutput: st.builds(m.TaskOutput, chunks=st.lists(st.builds(m.OutputChunk, task=task_refs,
                                                                      offset=st.integers(0, 2**63 - 1),
                                                                      data=st.binary(max_size=64)), max_size=3)),
    m.TaskReports: st.builds(m.TaskReports, chunks=st.lists(st.builds(
        m.ReportsChunk, task=task_refs, first=st.integers(0, 2**63 - 1), tree=text,
        tests=st.lists(st.dictionaries(text, st.one_of(text, st.integers(-(2**63), 2**63 - 1), st.booleans()),
                                       max_size=3), max_size=3)), max_size=3)),
}
# a batch holds any messages but a batch
MESSAGE_STRATEGIES[m.Batch] = st.builds(m.Batch, messages=st.lists(st.one_of(*MESSAGE_STRATEGIES.values()), max_size=3))

messages: st.SearchStrategy[Any] = st.one_of(*MESSAGE_STRATEGIES.values())


def pair(**kw: Any) -> tuple[Channel, Channel]:
    """A sender and a receiver sharing one session key."""
    return Channel(KEY, **kw), Channel(KEY, **kw)


def sign(payload: bytes, key: bytes = KEY) -> bytes:
    return hmac.new(key, payload, hashlib.sha256).digest() + payload


def sample_frame() -> bytes:
    tx, _ = pair()
    return tx.seal(m.Heartbeat("ready", [m.TaskRef("t-1", 1)], 12.5, 40.0, 1), NOW)


def test_strategies_cover_every_message_type() -> None:
    assert set(MESSAGE_STRATEGIES) == set(get_args(m.Message))
    assert set(m.MESSAGE_TYPES.values()) == set(get_args(m.Message))


# ------------------------------------------------------------------ round trip


@FAST
@given(msgs=st.lists(messages, min_size=1, max_size=5))
def test_seal_then_open_returns_each_message_unchanged(msgs: list[Any]) -> None:
    tx, rx = pair()
    for i, msg in enumerate(msgs):
        got = rx.open(tx.seal(msg, NOW + i), NOW + i)
        assert type(got) is type(msg)
        assert got == msg
    assert rx.recv_seq == tx.send_seq == len(msgs)
    assert rx.rejected == {}


@FAST
@given(msg=messages, seq=st.integers(min_value=0, max_value=2**63 - 1), ts=st.floats(allow_nan=False))
def test_envelope_codec_round_trip(msg: Any, seq: int, ts: float) -> None:
    env = decode_envelope(encode_envelope(seq, ts, msg))
    assert (env.seq, env.ts, env.msg) == (seq, ts, msg)


@FAST
@given(msg=messages)
def test_type_tag_on_the_wire_is_the_registered_name(msg: Any) -> None:
    """Peers built from other code bases dispatch on these names: they are part of the protocol."""
    seq, ts, body = msgspec.msgpack.decode(encode_envelope(1, NOW, msg))
    assert m.MESSAGE_TYPES[body["type"]] is type(msg)


# ------------------------------------------------------------------ tampering


@settings(FAST, max_examples=200)
@given(msg=messages, data=st.data())
def test_any_single_byte_change_is_rejected(msg: Any, data: st.DataObject) -> None:
    tx, rx = pair()
    frame = tx.seal(msg, NOW)
    pos = data.draw(st.integers(min_value=0, max_value=len(frame) - 1), label="position")
    new = data.draw(st.integers(min_value=0, max_value=255).filter(lambda b: b != frame[pos]), label="new byte")
    bad = frame[:pos] + bytes([new]) + frame[pos + 1 :]
    with pytest.raises(ProtocolError) as info:
        rx.open(bad, NOW)
    assert isinstance(info.value, SignatureError | DecodeError)
    assert sum(rx.rejected.values()) == 1
    # The rejected copy consumed nothing: the genuine frame still opens.
    assert rx.recv_seq == 0
    assert rx.open(frame, NOW) == msg


@FAST
@given(msg=messages, data=st.data())
def test_truncated_frame_is_rejected(msg: Any, data: st.DataObject) -> None:
    tx, rx = pair()
    frame = tx.seal(msg, NOW)
    cut = data.draw(st.integers(min_value=0, max_value=len(frame) - 1), label="kept bytes")
    with pytest.raises(ProtocolError) as info:
        rx.open(frame[:cut], NOW)
    assert isinstance(info.value, SignatureError | DecodeError)


@pytest.mark.parametrize("size", [0, 1, TAG_SIZE - 1, TAG_SIZE])
def test_frame_too_short_to_carry_a_tag_is_a_decode_error(size: int) -> None:
    _, rx = pair()
    with pytest.raises(DecodeError):
        rx.open(b"\x00" * size, NOW)
    assert rx.rejected == {"malformed": 1}


def test_extra_trailing_bytes_are_rejected() -> None:
    _, rx = pair()
    with pytest.raises(SignatureError):
        rx.open(sample_frame() + b"\x00", NOW)


@FAST
@given(frame=st.binary(max_size=300))
def test_arbitrary_bytes_never_accepted_and_only_protocol_errors(frame: bytes) -> None:
    _, rx = pair()
    with pytest.raises(ProtocolError):
        rx.open(frame, NOW)


@FAST
@given(payload=st.binary(max_size=300))
def test_correctly_signed_garbage_raises_only_protocol_errors(payload: bytes) -> None:
    """Even a peer holding the key cannot crash the decoder: the result is a message or a
    ProtocolError, never another exception type."""
    _, rx = pair()
    try:
        rx.open(sign(payload), NOW)
    except ProtocolError:
        pass


def test_frame_sealed_with_another_key_is_rejected() -> None:
    other = Channel(derive_session_key("dtk_other_credential", "session-1"))
    _, rx = pair()
    with pytest.raises(SignatureError) as info:
        rx.open(other.seal(m.Drain("x", 1.0), NOW), NOW)
    assert type(info.value) is SignatureError
    assert rx.rejected == {"bad_signature": 1}


def test_frame_from_another_session_of_the_same_credential_is_rejected() -> None:
    other = Channel(derive_session_key("dtk_test_credential", "session-2"))
    _, rx = pair()
    with pytest.raises(SignatureError):
        rx.open(other.seal(m.Drain("x", 1.0), NOW), NOW)


# ------------------------------------------------------------------ replay and freshness


def test_replayed_frame_is_rejected() -> None:
    tx, rx = pair()
    frame = tx.seal(m.AuthRenew("tok"), NOW)
    assert rx.open(frame, NOW) == m.AuthRenew("tok")
    with pytest.raises(ReplayedMessage):
        rx.open(frame, NOW + 1)
    assert rx.rejected == {"replayed_sequence": 1}


def test_older_sequence_is_rejected_after_a_newer_one() -> None:
    tx, rx = pair()
    first = tx.seal(m.Drain("a", 1.0), NOW)
    second = tx.seal(m.Drain("b", 1.0), NOW)
    assert rx.open(second, NOW) == m.Drain("b", 1.0)
    with pytest.raises(ReplayedMessage):
        rx.open(first, NOW)
    assert rx.recv_seq == 2


def test_sequence_gaps_are_accepted() -> None:
    """Only order matters: a frame lost in between does not wedge the session."""
    tx, rx = pair()
    tx.seal(m.Drain("lost", 1.0), NOW)
    assert rx.open(tx.seal(m.Drain("next", 1.0), NOW), NOW) == m.Drain("next", 1.0)
    assert rx.recv_seq == 2


@pytest.mark.parametrize("offset", [-(SKEW + 0.001), SKEW + 0.001, -1e6, 1e6, float("inf"), float("-inf")])
def test_timestamp_outside_window_is_stale(offset: float) -> None:
    tx, rx = pair(max_skew_s=SKEW)
    frame = tx.seal(m.Drain("x", 1.0), NOW + offset)
    with pytest.raises(StaleMessage):
        rx.open(frame, NOW)
    assert rx.rejected == {"stale_timestamp": 1}
    assert rx.recv_seq == 0


@pytest.mark.parametrize("offset", [-SKEW, -SKEW + 0.001, 0.0, SKEW - 0.001, SKEW])
def test_timestamp_inside_window_is_accepted(offset: float) -> None:
    tx, rx = pair(max_skew_s=SKEW)
    assert rx.open(tx.seal(m.Drain("x", 1.0), NOW + offset), NOW) == m.Drain("x", 1.0)


def test_nan_timestamp_is_stale() -> None:
    tx, rx = pair()
    with pytest.raises(StaleMessage):
        rx.open(tx.seal(m.Drain("x", 1.0), float("nan")), NOW)


def test_stale_frame_does_not_advance_the_sequence() -> None:
    tx, rx = pair()
    late = tx.seal(m.Drain("late", 1.0), NOW - 10 * SKEW)
    fresh = tx.seal(m.Drain("fresh", 1.0), NOW)
    with pytest.raises(StaleMessage):
        rx.open(late, NOW)
    assert rx.open(fresh, NOW) == m.Drain("fresh", 1.0)


# ------------------------------------------------------------------ size limit


def test_frame_over_max_frame_rejected_before_hmac() -> None:
    """Garbage over the limit is FrameTooLarge, not SignatureError: no HMAC was computed."""
    rx = Channel(KEY, max_frame=1024)
    with pytest.raises(FrameTooLarge):
        rx.open(b"\xff" * 1025, NOW)
    assert rx.rejected == {"too_large": 1}


def test_frame_over_max_frame_never_reaches_hmac(monkeypatch: pytest.MonkeyPatch) -> None:
    from distributed_testing.protocol import signing

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("HMAC computed over an oversized frame")

    frame = sample_frame()
    rx = Channel(KEY, max_frame=len(frame) - 1)
    monkeypatch.setattr(signing.hmac, "new", boom)
    with pytest.raises(FrameTooLarge):
        rx.open(frame, NOW)


def test_frame_exactly_max_frame_is_accepted() -> None:
    frame = sample_frame()
    assert isinstance(Channel(KEY, max_frame=len(frame)).open(frame, NOW), m.Heartbeat)
    with pytest.raises(FrameTooLarge):
        Channel(KEY, max_frame=len(frame) - 1).open(frame, NOW)


# ------------------------------------------------------------------ decoding signed payloads


def test_unknown_type_tag_in_signed_payload_is_decode_error() -> None:
    payload = msgspec.msgpack.encode([1, NOW, {"type": "launch_missiles", "target": "x"}])
    _, rx = pair()
    with pytest.raises(DecodeError) as info:
        rx.open(sign(payload), NOW)
    assert isinstance(info.value.__cause__, msgspec.ValidationError | msgspec.DecodeError)
    assert rx.rejected == {"malformed": 1}
    assert rx.recv_seq == 0


@pytest.mark.parametrize(
    "body",
    [
        {"type": "drain", "reason": "x", "deadline_s": 1.0, "surprise": 1},  # unknown field
        {"type": "drain", "reason": "x"},  # missing field
        {"type": "drain", "reason": 5, "deadline_s": 1.0},  # wrong type
        {
            "type": "heartbeat",
            "state": "sleepy",
            "running": [],
            "cpu_percent": 0.0,
            "memory_percent": 0.0,
            "free_slots": 1,
        },  # value outside a Literal
        {"reason": "x", "deadline_s": 1.0},  # no tag at all
    ],
)
def test_malformed_signed_message_is_decode_error(body: dict[str, Any]) -> None:
    _, rx = pair()
    with pytest.raises(DecodeError):
        rx.open(sign(msgspec.msgpack.encode([1, NOW, body])), NOW)


def test_hand_built_payload_with_known_tag_is_accepted() -> None:
    """The negative test above is only meaningful if this hand-built framing is the real one."""
    payload = msgspec.msgpack.encode([1, NOW, {"type": "drain", "reason": "x", "deadline_s": 1.0}])
    assert Channel(KEY).open(sign(payload), NOW) == m.Drain("x", 1.0)


def test_signed_payload_that_is_not_msgpack_is_decode_error() -> None:
    with pytest.raises(DecodeError):
        Channel(KEY).open(sign(b"\xc1\xc1\xc1"), NOW)


# ------------------------------------------------------------------ counters and keys


def test_rejected_counter_counts_each_code() -> None:
    tx, rx = pair(max_frame=4096)
    good = tx.seal(m.Drain("a", 1.0), NOW)
    rx.open(good, NOW)
    attempts = [
        (good, ReplayedMessage),
        (good, ReplayedMessage),
        (tx.seal(m.Drain("b", 1.0), NOW + 10 * SKEW), StaleMessage),
        (b"x" * 5000, FrameTooLarge),
        (b"short", DecodeError),
        (b"\x00" * 64, SignatureError),
        (sign(msgspec.msgpack.encode([99, NOW, {"type": "nope"}])), DecodeError),
    ]
    for frame, exc in attempts:
        with pytest.raises(exc):
            rx.open(frame, NOW)
    assert rx.rejected == {
        "replayed_sequence": 2,
        "stale_timestamp": 1,
        "too_large": 1,
        "malformed": 2,
        "bad_signature": 1,
    }


def test_derive_session_key_is_deterministic_and_separates_inputs() -> None:
    k = derive_session_key("cred-a", "sess-1")
    assert k == derive_session_key("cred-a", "sess-1")
    assert len(k) == 32
    others = {
        derive_session_key("cred-b", "sess-1"),
        derive_session_key("cred-a", "sess-2"),
        derive_session_key("cred-a", "sess-1 "),
        derive_session_key("", "sess-1"),
    }
    assert k not in others
    assert len(others) == 4


# Real credentials are API keys (dtk_...) or JWTs: URL-safe base64 characters and dots. (HMAC zero-pads
# short keys, so credentials differing only by trailing NUL bytes would collide; none can occur.)
CREDENTIAL_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_."


@FAST
@given(
    a=st.tuples(st.text(CREDENTIAL_CHARS, min_size=1, max_size=40), st.text(CREDENTIAL_CHARS, max_size=30)),
    b=st.tuples(st.text(CREDENTIAL_CHARS, min_size=1, max_size=40), st.text(CREDENTIAL_CHARS, max_size=30)),
)
def test_derive_session_key_differs_for_different_inputs(a: tuple[str, str], b: tuple[str, str]) -> None:
    assume(a != b)
    assert derive_session_key(*a) != derive_session_key(*b)


def test_each_direction_keeps_its_own_sequence() -> None:
    """Both ends of a session share one key; each side's send and receive counters are independent."""
    coord, worker = pair()
    to_worker = coord.seal(m.Drain("x", 1.0), NOW)
    to_coord = worker.seal(m.Goodbye("bye"), NOW)
    assert worker.open(to_worker, NOW) == m.Drain("x", 1.0)
    assert coord.open(to_coord, NOW) == m.Goodbye("bye")
    assert (coord.send_seq, coord.recv_seq, worker.send_seq, worker.recv_seq) == (1, 1, 1, 1)


def test_a_batch_inside_a_batch_is_malformed() -> None:
    """A batch's messages are handled one by one as if each came alone: one cannot hide in another."""
    inner = {"type": "batch", "messages": [{"type": "confirm", "upto": 1}]}
    payload = msgspec.msgpack.encode([1, NOW, {"type": "batch", "messages": [inner]}])
    _, rx = pair()
    with pytest.raises(DecodeError, match="malformed"):
        rx.open(sign(payload), NOW)
    assert rx.open(sign(msgspec.msgpack.encode([2, NOW, inner])), NOW) == m.Batch([m.Confirm(1)])
