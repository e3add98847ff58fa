"""Fuzz the worker WebSocket endpoint of a real coordinator (DuckDB store, real sockets).

Frames: random bytes, text frames, truncated signed frames, frames signed with the session key
whose payload is not MessagePack, is a valid payload with a few bytes changed, or is MessagePack
of the wrong shape (unknown ``type`` tags, junk field values: NaN, 64-bit edges, binary and
extension types, odd map keys), well-formed messages with random content and skewed timestamps
or sequence numbers, messages only the coordinator may send, replays of earlier frames, frames
just over the frame limit (``too_large``) and over the WebSocket limit (the connection is
closed), a garbage ``auth_renew``, and any of these before ``register``.

The oracle is a mirror ``Channel`` holding the session key: it says which error each frame must
get (``bad_signature``, ``malformed``, ``stale_timestamp``, ...) and the test checks that exactly
those typed errors come back, in order, that the fifth violation closes the session with a fatal
``too_many_violations``, and otherwise that the session still works afterwards (a probe result is
acknowledged). Throughout, a second, healthy raw worker keeps receiving and completing a stream
of tasks on the same coordinator; after the run everything persisted checkpoints into DuckDB.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import math
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from fuzz_support import CASES, Background, background_cluster
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from distributed_testing.coordinator.store.base import ResultQuery
from distributed_testing.coordinator.ws import HANDLERS, SESSION_HEADER
from distributed_testing.errors import ProtocolError
from distributed_testing.protocol import messages as m
from distributed_testing.protocol.codec import encode_envelope
from distributed_testing.protocol.signing import Channel, derive_session_key
from distributed_testing.testing import Cluster, raw_worker, wait_for

pytestmark = pytest.mark.timeout(180)

SUITE = "WS"
MAX_FRAME = 64 * 1024  # CoordinatorConfig.max_frame_bytes (16 MiB by default)
WS_LIMIT = MAX_FRAME + 1023  # the largest frame aiohttp lets through (its limit is max_frame + 1024, exclusive)
MAX_VIOLATIONS = 5
FUZZ = settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck), database=None)
READ_TIMEOUT_S = 10.0


# ------------------------------------------------------------------ the healthy worker


@dataclass
class Healthy:
    """A raw worker that runs every task it is given (instantly) while the fuzzing goes on."""

    session_id: str = ""
    completed: int = 0  # tasks submitted by the traffic loop that succeeded on this worker
    failures: list[str] = field(default_factory=list)
    closed: str | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)


async def run_healthy(c: Cluster, key: str, h: Healthy, ready: asyncio.Event) -> None:
    async with raw_worker(c.base_url, key, "healthy", autoping=False, tags=["healthy"]) as (ws, reg):
        ch: Channel = ws._dt_channel  # type: ignore[attr-defined]
        lock = asyncio.Lock()

        async def send(msg: m.Message) -> None:
            async with lock:  # seal and send in one step: sequence numbers must arrive in order
                await ws.send_bytes(ch.seal(msg, time.time()))

        async def heartbeats() -> None:
            while True:
                await send(m.Heartbeat(state="ready", running=[], cpu_percent=1.0, memory_percent=1.0, free_slots=1))
                await asyncio.sleep(1.0)

        async def reader() -> None:
            while True:
                frame = await ws.receive()
                if frame.type == aiohttp.WSMsgType.PING:
                    await ws.pong(frame.data)
                elif frame.type == aiohttp.WSMsgType.BINARY:
                    msg = ch.open(frame.data, time.time())
                    if isinstance(msg, m.AssignTasks):
                        now = time.time()
                        await send(m.TaskStarted([m.TaskRef(a.task_id, a.attempt) for a in msg.tasks], now))
                        await send(m.Results([m.TaskResult(a.task_id, a.attempt, "succeeded", now, time.time(),
                                                           output={"ok": True}) for a in msg.tasks]))
                    elif isinstance(msg, m.ErrorMsg):
                        h.failures.append(f"healthy worker got an error: {msg}")
                else:
                    h.closed = f"{frame.type.name} {frame.data!r} {frame.extra!r}"
                    return

        h.session_id = reg.session_id
        tasks = [asyncio.create_task(heartbeats()), asyncio.create_task(reader()), asyncio.create_task(traffic(c, h))]
        ready.set()
        try:
            await asyncio.wait([asyncio.create_task(h.stop.wait()), *tasks], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def traffic(c: Cluster, h: Healthy) -> None:
    """Submit one task for the healthy worker at a time, for as long as the module runs."""
    n = 0
    try:
        while True:
            n += 1
            tid = f"healthy-{n}"
            await c.submit({"task_id": tid, "type": "custom", "config": {"name": "noop"},
                            "requirements": {"tags": ["healthy"]}})
            task = await c.wait(tid, timeout=20)
            if task["state"] == "succeeded" and task["outcome"]["worker_id"] == "healthy":
                h.completed += 1
            else:
                h.failures.append(f"{tid}: {task['state']} {task.get('outcome')}")
    except Exception as exc:
        h.failures.append(f"traffic stopped: {exc!r}")
        raise


@dataclass
class Env:
    bg: Background
    c: Cluster
    key: str
    healthy: Healthy

    def check_healthy(self, completed_before: int) -> None:
        """The healthy worker kept its one session, saw no error, and kept completing tasks."""

        async def progressed() -> None:
            await wait_for(lambda: self.healthy.completed > completed_before or bool(self.healthy.failures),
                           timeout=20, what="the healthy worker to complete another task")

        async def session_id() -> str | None:
            session = self.c.runtime.sessions.get("healthy")
            return None if session is None else session.session_id

        self.bg.run(progressed())
        h = self.healthy
        assert not h.failures, h.failures
        assert h.closed is None, h.closed
        assert self.bg.run(session_id()) == h.session_id  # the same session throughout


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp: Path = tmp_path_factory.mktemp("fuzz-ws")
    with background_cluster(tmp, workers=0, db_path=str(tmp / "coordinator.duckdb"), max_frame_bytes=MAX_FRAME,
                            max_violations=MAX_VIOLATIONS, worker_ttl_s=600.0,
                            auth_fail_limit=0) as (bg, c):  # fuzzed credentials are not to lock the address out
        key = bg.run(c.create_key("worker"))
        h = Healthy()
        holder: list[asyncio.Task[None]] = []

        async def start() -> None:
            ready = asyncio.Event()
            h.stop = asyncio.Event()
            holder.append(asyncio.create_task(run_healthy(c, key, h, ready)))
            await asyncio.wait([asyncio.create_task(ready.wait()), holder[0]], return_when=asyncio.FIRST_COMPLETED)
            assert ready.is_set(), holder[0].result()

        bg.run(start())
        yield Env(bg, c, key, h)

        async def stop() -> None:
            h.stop.set()
            await holder[0]

        bg.run(stop())


# ------------------------------------------------------------------ strategies

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
WIRE_INTS = st.one_of(st.integers(-5, 5), INT64, st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, -(2**63)]))
WIRE_FLOATS = st.one_of(st.floats(), st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e308]))
TEXT = st.text(max_size=12)
LEAVES = st.one_of(st.none(), st.booleans(), WIRE_INTS, WIRE_FLOATS, TEXT, st.binary(max_size=8),
                   st.builds(msgspec.msgpack.Ext, st.integers(-128, 127), st.binary(max_size=4)))
MAP_KEYS = st.one_of(TEXT, TEXT, st.integers(-3, 3), st.none(), st.booleans(), st.binary(max_size=3),
                     st.tuples(st.integers(0, 2)))
WIRE_VALUES = st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(MAP_KEYS, inner, max_size=3), max_leaves=8)
FREE_FORM = st.dictionaries(TEXT, WIRE_VALUES, max_size=3)
TASK_IDS = st.one_of(TEXT, st.sampled_from(["healthy-1", "", "x" * 300, "\x00", "seed"]))
REFS = st.builds(m.TaskRef, TASK_IDS, WIRE_INTS)
STATUSES = st.sampled_from(["succeeded", "failed", "timed_out", "cancelled", "error"])

W2C = st.one_of(
    st.builds(m.Heartbeat, st.sampled_from(["ready", "constrained", "draining"]), st.lists(REFS, max_size=2),
              WIRE_FLOATS, WIRE_FLOATS, WIRE_INTS, st.none() | TEXT, st.none() | WIRE_FLOATS),
    st.builds(m.TaskStarted, st.lists(REFS, max_size=2), WIRE_FLOATS),
    st.builds(m.TaskProgress, REFS, WIRE_FLOATS, TEXT),
    st.builds(m.Results, st.lists(st.builds(m.TaskResult, TASK_IDS, WIRE_INTS, STATUSES, WIRE_FLOATS, WIRE_FLOATS,
                                            FREE_FORM, st.none() | TEXT, TEXT), max_size=2)),
    st.builds(m.Goodbye, TEXT, st.lists(REFS, max_size=2)),
    st.builds(m.ErrorMsg, TEXT, TEXT, st.booleans()),
)
REGISTERS = st.builds(m.Register, TEXT.map(lambda s: f"fuzz-{s}"), TEXT, st.sampled_from([1, 1, 1, 0, 2, -1, 2**63]),
                      FREE_FORM, st.lists(TEXT, max_size=3), st.lists(TEXT, max_size=2), WIRE_INTS, WIRE_FLOATS,
                      st.lists(REFS, max_size=2), TEXT, st.none() | TEXT)
C2W = st.one_of(
    REGISTERS,
    st.builds(m.Registered, TEXT, TEXT, WIRE_FLOATS, WIRE_FLOATS),
    st.builds(m.AssignTasks, st.lists(st.builds(m.TaskAssignment, TASK_IDS, WIRE_INTS, TEXT, FREE_FORM), max_size=2)),
    st.builds(m.ResultAck, st.lists(REFS, max_size=2)),
    st.builds(m.Cancel, REFS, TEXT),
    st.builds(m.Drain, TEXT, WIRE_FLOATS),
)
TAGS = st.sampled_from(sorted(m.MESSAGE_TYPES)) | TEXT
FIELD_NAMES = st.sampled_from(sorted({f for cls in m.MESSAGE_TYPES.values() for f in cls.__struct_fields__})) | TEXT
SHAPED = st.fixed_dictionaries({"type": TAGS}, optional={}).flatmap(
    lambda base: st.dictionaries(FIELD_NAMES, WIRE_VALUES, max_size=4).map(lambda d: {**d, **base}))
SKEWS = st.sampled_from([0.0, 0.0, 0.0, 5.0, -5.0, 250.0, -250.0, 350.0, -350.0, 3600.0, -1e9, math.nan, math.inf])


@dataclass(frozen=True)
class Recipe:
    """How to build one frame once the session key is known."""

    kind: str
    arg: Any = None
    skew: float = 0.0
    seq: str = "next"  # next | same | zero | negative | jump


RECIPES = st.one_of(
    st.builds(Recipe, st.just("random"), st.binary(max_size=120)),
    st.builds(Recipe, st.just("text"), st.text(max_size=40)),
    st.builds(Recipe, st.just("truncated"), st.tuples(W2C, st.floats(0, 0.999))),
    st.builds(Recipe, st.just("signed_bytes"), st.binary(max_size=80)),
    st.builds(Recipe, st.just("signed_value"), st.one_of(
        WIRE_VALUES, st.tuples(WIRE_INTS, WIRE_FLOATS, SHAPED).map(list), SHAPED)),
    st.builds(Recipe, st.just("message"), W2C, SKEWS, st.sampled_from(["next"] * 6 + ["same", "zero", "negative", "jump"])),
    st.builds(Recipe, st.just("message"), C2W),
    st.builds(Recipe, st.just("mutated"), st.tuples(W2C | REGISTERS, st.lists(
        st.tuples(st.floats(0, 0.999), st.integers(0, 255)), min_size=1, max_size=3))),
    st.builds(Recipe, st.just("replay"), st.integers(0, 10)),
    st.builds(Recipe, st.just("oversized"), st.sampled_from([1, 512, 1024, 1025, 4096, MAX_FRAME])),
)


def sign(key: bytes, payload: bytes) -> bytes:
    return hmac.new(key, payload, hashlib.sha256).digest() + payload


class Builder:
    """Turns recipes into frames for one session, tracking our sending sequence number."""

    def __init__(self, ch: Channel) -> None:
        self.ch = ch
        self.sent: list[tuple[str, bytes | str]] = []

    def seal(self, msg: m.Message, skew: float = 0.0, seq_mode: str = "next") -> bytes:
        now = time.time() + skew
        if seq_mode == "next":
            return self.ch.seal(msg, now)
        seq = {"same": self.ch.send_seq, "zero": 0, "negative": -7, "jump": self.ch.send_seq + 2**40}[seq_mode]
        if seq_mode == "jump":
            self.ch.send_seq = seq
        return sign(self.ch.key, encode_envelope(seq, now, msg))

    def build(self, r: Recipe) -> tuple[str, bytes | str]:
        if r.kind == "random":
            frame: tuple[str, bytes | str] = ("bin", r.arg)
        elif r.kind == "text":
            frame = ("text", r.arg)
        elif r.kind == "truncated":
            whole = self.seal(r.arg[0])
            frame = ("bin", whole[: int(len(whole) * r.arg[1])])
        elif r.kind == "signed_bytes":
            frame = ("bin", sign(self.ch.key, r.arg))
        elif r.kind == "signed_value":
            frame = ("bin", sign(self.ch.key, msgspec.msgpack.encode(r.arg)))
        elif r.kind == "message":
            frame = ("bin", self.seal(r.arg, r.skew, r.seq))
        elif r.kind == "mutated":  # a well-formed payload with a few bytes changed, then signed
            payload = bytearray(self.seal(r.arg[0])[32:])
            for where, byte in r.arg[1]:
                payload[int(len(payload) * where)] = byte
            frame = ("bin", sign(self.ch.key, bytes(payload)))
        elif r.kind == "replay" and self.sent:
            frame = self.sent[r.arg % len(self.sent)]
        elif r.kind == "oversized":
            payload = encode_envelope(self.ch.send_seq + 1, time.time(), m.ErrorMsg("x", "y" * (MAX_FRAME + r.arg)))
            frame = ("bin", sign(self.ch.key, payload)[: MAX_FRAME + r.arg])
        else:
            frame = ("bin", b"\x00" * (r.arg % 40))
        self.sent.append(frame)
        return frame


# ------------------------------------------------------------------ the oracle


@dataclass(frozen=True)
class Expect:
    errors: tuple[tuple[str, bool], ...]  # (code, fatal) of each error message, in order
    # "open": the session works afterwards; "closed": the coordinator ends it; "limit": a frame
    # over the WebSocket size limit ends it (aiohttp closes with 1009; errors still queued for
    # the frames before it may be dropped)
    ends: str


def oracle(frames: list[tuple[str, bytes | str]], mirror: Channel, registered: bool) -> Expect:
    """What the coordinator must answer to ``frames`` (see the module docstring)."""
    errors: list[tuple[str, bool]] = []
    violations = 0
    for kind, data in frames:
        if kind == "bin" and len(data) > WS_LIMIT:
            return Expect(tuple(errors), "limit")
        code: str | None = None
        if kind == "text":
            code = "malformed"
        else:
            assert isinstance(data, bytes)
            try:
                msg = mirror.open(data, time.time())
            except ProtocolError as exc:
                code = exc.code
            else:
                if not registered:
                    if isinstance(msg, m.Register) and msg.protocol_version == m.PROTOCOL_VERSION:
                        registered = True
                        continue
                    code = "bad_register"
                elif isinstance(msg, m.AuthRenew):
                    return Expect((*errors, ("auth", True)), "closed")
                elif type(msg) not in HANDLERS:
                    code = "protocol_error"
        if code is None:
            continue
        if not registered:  # before register, any refusal is fatal
            return Expect((*errors, (code, True)), "closed")
        errors.append((code, False))
        violations += 1
        if violations >= MAX_VIOLATIONS:
            return Expect((*errors, ("too_many_violations", True)), "closed")
    return Expect(tuple(errors), "open")


# ------------------------------------------------------------------ driving a session


@contextlib.asynccontextmanager
async def handshake(c: Cluster, key: str) -> AsyncIterator[tuple[aiohttp.ClientWebSocketResponse, Channel]]:
    """An authenticated WebSocket that has not sent ``register`` yet."""
    async with aiohttp.ClientSession() as http:
        url = c.base_url.replace("http://", "ws://") + "/ws/worker"
        async with http.ws_connect(url, headers={"Authorization": f"Bearer {key}"}, autoping=False) as ws:
            session_id = ws._response.headers[SESSION_HEADER]
            yield ws, Channel(derive_session_key(key, session_id))


async def send_frames(ws: aiohttp.ClientWebSocketResponse, frames: list[tuple[str, bytes | str]]) -> None:
    for kind, data in frames:
        if ws.closed:
            return
        with contextlib.suppress(ConnectionError):  # the coordinator may already be closing
            if kind == "text":
                await ws.send_str(str(data))
            else:
                await ws.send_bytes(bytes(data))


async def replies(ws: aiohttp.ClientWebSocketResponse, ch: Channel, probe: m.TaskRef | None) -> tuple[list[tuple[str, bool]], str]:
    """Errors received, then "open" (the probe was acknowledged) or "closed"."""
    errors: list[tuple[str, bool]] = []
    while True:
        frame = await ws.receive(timeout=READ_TIMEOUT_S)
        if frame.type == aiohttp.WSMsgType.PING:
            await ws.pong(frame.data)
        elif frame.type == aiohttp.WSMsgType.BINARY:
            msg = ch.open(frame.data, time.time())
            if isinstance(msg, m.ErrorMsg) and msg.code.endswith("_refused") and not msg.fatal:
                continue  # a report on an attempt this worker was never given (the probe's made-up task, a
                # random result): the state machine's refusal, not a frame check this oracle models
            if isinstance(msg, m.ErrorMsg):
                errors.append((msg.code, msg.fatal))
            elif isinstance(msg, m.ResultAck) and probe is not None and probe in msg.tasks:
                return errors, "open"
        elif frame.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED,
                            aiohttp.WSMsgType.ERROR):
            return errors, "closed"
        else:
            raise AssertionError(f"unexpected frame from the coordinator: {frame}")


def probe_frame(ch: Channel, mirror: Channel) -> tuple[bytes, m.TaskRef]:
    """A valid result for a made-up task, sent after a fresh sequence number: it must be acked
    (refused, as no such task exists, but settled all the same)."""
    ref = m.TaskRef(f"probe-{uuid.uuid4().hex[:8]}", 1)
    ch.send_seq = max(ch.send_seq, mirror.recv_seq)
    now = time.time()
    return ch.seal(m.Results([m.TaskResult(ref.task_id, 1, "succeeded", now, now)]), now), ref


async def fuzz_session(c: Cluster, key: str, recipes: list[Recipe], register: bool) -> tuple[Expect, Expect]:
    """Run one session; return (expected, observed)."""
    if register:
        worker_id = f"fuzz-{uuid.uuid4().hex[:8]}"
        async with raw_worker(c.base_url, key, worker_id, autoping=False) as (ws, _):
            ch: Channel = ws._dt_channel  # type: ignore[attr-defined]
            return await _exchange(ws, ch, recipes, registered=True)
    async with handshake(c, key) as (ws, ch):
        return await _exchange(ws, ch, recipes, registered=False)


async def _exchange(ws: aiohttp.ClientWebSocketResponse, ch: Channel, recipes: list[Recipe],
                    registered: bool) -> tuple[Expect, Expect]:
    mirror = Channel(ch.key, max_frame=MAX_FRAME)
    mirror.recv_seq = ch.send_seq
    builder = Builder(ch)
    frames = [builder.build(r) for r in recipes]
    expected = oracle(frames, mirror, registered)
    await send_frames(ws, frames)
    probe = None
    if expected.ends == "open":
        frame, probe = probe_frame(ch, mirror)
        await ws.send_bytes(frame)
    errors, ends = await replies(ws, ch, probe)
    if ends == "closed":  # whatever the coordinator said after the fatal error does not matter
        errors = errors[: len(expected.errors)]
    return expected, Expect(tuple(errors), ends)


# ------------------------------------------------------------------ the fuzz tests


def run_case(env: Env, recipes: list[Recipe], register: bool) -> None:
    CASES[SUITE] += 1
    expected, observed = env.bg.run(fuzz_session(env.c, env.key, recipes, register))
    event(f"session {expected.ends}")  # --hypothesis-show-statistics shows what the cases reached
    for code, _ in expected.errors:
        event(f"error {code}")
    what = f"expected {expected}, observed {observed}; recipes={recipes!r:.3000}"
    if expected.ends == "limit":
        assert observed.ends == "closed" and observed.errors[: len(expected.errors)] == expected.errors[: len(observed.errors)], what
    else:
        assert observed == expected, what


@FUZZ
@given(recipes=st.lists(RECIPES, min_size=1, max_size=7))
def test_frames_after_register(env: Env, recipes: list[Recipe]) -> None:
    before = env.healthy.completed
    run_case(env, recipes, register=True)
    if CASES[SUITE] % 40 == 0:
        env.check_healthy(before)


@settings(FUZZ, max_examples=150)
@given(recipes=st.lists(st.one_of(RECIPES, st.builds(Recipe, st.just("message"), REGISTERS)), min_size=1, max_size=3))
def test_frames_before_register(env: Env, recipes: list[Recipe]) -> None:
    run_case(env, recipes, register=False)


@settings(FUZZ, max_examples=50)
@given(token=st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=200),
       prefix=st.lists(RECIPES, max_size=3))
def test_garbage_auth_renew_closes_the_session(env: Env, token: str, prefix: list[Recipe]) -> None:
    run_case(env, [*prefix, Recipe("message", m.AuthRenew(token))], register=True)


def test_after_the_run_the_healthy_worker_and_the_store_are_fine(env: Env) -> None:
    before = env.healthy.completed
    env.check_healthy(before)
    rt = env.c.runtime

    async def check_store() -> int:
        await rt.store.checkpoint()  # every record the fuzzing produced fits DuckDB
        rows = await rt.store.query_results(ResultQuery(limit=10_000))
        return len(rows)

    assert env.bg.run(check_store()) > 0

    async def rest() -> None:
        for path in ("/api/v1/workers", "/api/v1/results?limit=10000", "/api/v1/tasks?limit=10000", "/healthz"):
            async with env.c.http.get(env.c.base_url + path, headers={"Authorization": f"Bearer {env.c.admin_key}"}) as r:
                assert r.status == 200, (path, r.status, await r.text())
                msgspec.json.decode(await r.read())  # strict JSON, whatever the workers sent

    env.bg.run(rest())
    ids = env.bg.run(env.c.submit({"type": "custom", "config": {"name": "noop"}, "requirements": {"tags": ["healthy"]}}))
    assert env.bg.run(env.c.wait(ids[0]))["state"] == "succeeded"
