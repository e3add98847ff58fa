"""The worker WebSocket endpoint: authenticate at the handshake, then decode → handle → execute.

One reader per connection dispatches by message type through ``HANDLERS`` (each message of a
``batch`` frame in turn, as if it had come alone); one writer drains the session's outbound queue:
what it finds queued at once goes out as one signed ``batch`` frame to a worker that reads them
(``register.batches``), each message in its own frame to one that does not (a ``confirm``
directly followed by a ``result_ack`` goes out as one ``result_ack`` carrying ``confirm_upto``).
A rejected message is answered with an ``error`` message and counted; ``max_violations``
rejections close the connection. Nothing a peer sends can crash the coordinator or touch another
worker's session.

A worker speaks only for itself (:mod:`.identity`): a ``register`` of a worker id bound to another
key is answered with a fatal ``worker_id_taken`` error (counted as ``refused_register``) and the
owner's session stays open; a result, ``started`` or ``progress`` about an attempt the worker was
never given is refused by the state machine (``refused_result`` / ``_started`` / ``_progress``), and
``output`` for any but the task's current attempt on its own worker by ``tasklogs`` (``refused_output``).
A report on a task that finished and left memory is answered as if it had not: its row is read
back from the store first (``Runtime.load_tasks``), the one await a frame may take.

Liveness: the coordinator owns the contract and the worker does the pinging. ``registered`` tells
the worker its heartbeat interval and TTL (:meth:`.state.Policy.liveness`: the interval it asked
for in ``register``, or this coordinator's default); a register asking for more than
``--max-heartbeat-interval`` is refused with a fatal ``heartbeat_interval`` error (counted as
``refused_heartbeat_interval``). This endpoint never pings: it answers the worker's pings, and
every frame it receives (message, ping or pong) tells the state machine the worker is alive
(``state.seen``); ``state.tick`` alone declares a silent worker dead, after its TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable

import msgspec
from aiohttp import WSMsgType, web

from ..errors import AuthError, DTError, PermissionDenied, ProtocolError, StoreError, ValidationError
from ..protocol import messages as m
from ..protocol.signing import SESSION_HEADER, Channel, derive_session_key
from ..security import auth as sa
from ..security import roles
from .core.commands import Command
from .group import NotLeader
from .runtime import RUNTIME, Runtime, Session

log = logging.getLogger(__name__)
REGISTER_TIMEOUT_S = 10.0

Handler = Callable[[Runtime, Session, m.Message, float], list[Command]]


def _heartbeat(rt: Runtime, s: Session, msg: m.Message, now: float) -> list[Command]:
    assert isinstance(msg, m.Heartbeat)
    return rt.state.heartbeat(s.worker_id, msg, now)


def _started(rt: Runtime, s: Session, msg: m.Message, now: float) -> list[Command]:
    assert isinstance(msg, m.TaskStarted)
    return rt.state.started(s.worker_id, msg, now)


def _progress(rt: Runtime, s: Session, msg: m.Message, now: float) -> list[Command]:
    assert isinstance(msg, m.TaskProgress)
    log.debug("progress %s %.0f%% %s", msg.task.task_id, msg.fraction * 100, msg.message)
    return rt.state.progress(s.worker_id, msg, now)


def _output(rt: Runtime, s: Session, msg: m.Message, now: float) -> list[Command]:
    assert isinstance(msg, m.TaskOutput)
    return rt.logs.receive(rt.state.tasks, s.worker_id, msg)


def _reports(rt: Runtime, s: Session, msg: m.Message, now: float) -> list[Command]:
    assert isinstance(msg, m.TaskReports)
    return rt.reports.receive(rt.state.tasks, s.worker_id, msg)


def _results(rt: Runtime, s: Session, msg: m.Message, now: float) -> list[Command]:
    assert isinstance(msg, m.Results)
    rt.stats["results"] += len(msg.results)
    return rt.state.results(s.worker_id, msg, now)


def _taken_back(rt: Runtime, s: Session, msg: m.Message, now: float) -> list[Command]:
    assert isinstance(msg, m.TakenBack)
    return rt.state.taken_back(s.worker_id, msg, now)


def _goodbye(rt: Runtime, s: Session, msg: m.Message, now: float) -> list[Command]:
    assert isinstance(msg, m.Goodbye)
    return rt.state.goodbye(s.worker_id, msg, now)


def _auth_renew(rt: Runtime, s: Session, msg: m.Message, now: float) -> list[Command]:
    assert isinstance(msg, m.AuthRenew)
    p = rt.authenticate(msg.token)
    if p.key_id != s.key_id:
        raise AuthError("renewed token belongs to a different key")
    s.token_exp = p.token_exp
    return []


def _peer_error(rt: Runtime, s: Session, msg: m.Message, now: float) -> list[Command]:
    assert isinstance(msg, m.ErrorMsg)
    log.warning("worker %s rejected our message: %s (%s)", s.worker_id, msg.code, msg.detail)
    return []


def _named_tasks(msg: m.Message) -> list[str]:
    """The task ids a worker's report names (they must be in memory for the state machine)."""
    if isinstance(msg, m.Results):
        return [r.task_id for r in msg.results]
    if isinstance(msg, m.TaskStarted):
        return [r.task_id for r in msg.tasks]
    if isinstance(msg, m.TaskProgress):
        return [msg.task.task_id]
    return []


HANDLERS: dict[type[m.Message], Handler] = {
    m.Heartbeat: _heartbeat,
    m.TaskStarted: _started,
    m.TaskProgress: _progress,
    m.TaskOutput: _output,
    m.TaskReports: _reports,
    m.Results: _results,
    m.TakenBack: _taken_back,
    m.Goodbye: _goodbye,
    m.AuthRenew: _auth_renew,
    m.ErrorMsg: _peer_error,
}


async def worker_endpoint(request: web.Request) -> web.StreamResponse:
    rt = request.app[RUNTIME]
    credential = sa.parse_authorization_header(request.headers.get("Authorization", ""))
    principal = rt.authenticate(credential)
    roles.require(principal.role, roles.Permission.WORKER_CONNECT)
    session_id = secrets.token_urlsafe(16)
    # No heartbeat= and no autoping: pings are the worker's, answered in _serve, where they count as
    # signs of life (aiohttp's own heartbeat was a second death rule with its own timeout).
    ws = web.WebSocketResponse(max_msg_size=rt.config.max_frame_bytes + 1024, compress=False, autoping=False)
    ws.headers[SESSION_HEADER] = session_id
    await ws.prepare(request)
    channel = Channel(derive_session_key(credential, session_id), max_frame=rt.config.max_frame_bytes,
                      max_skew_s=rt.config.max_clock_skew_s)
    session = Session(session_id=session_id, worker_id="", key_id=principal.key_id, channel=channel,
                      token_exp=principal.token_exp)
    writer = asyncio.create_task(_writer(rt, ws, session), name=f"ws-writer-{session_id}")
    try:
        reg = await _await_register(rt, ws, session)
        if reg is not None:
            if not reg.address:  # where gang peers reach it: the address this connection came from
                reg = msgspec.structs.replace(reg, address=request.remote or "")
            await _serve(rt, ws, session, reg)
    finally:
        session.close(session.closing or "connection closed")
        await writer
        if session.worker_id and rt.sessions.get(session.worker_id) is session:
            del rt.sessions[session.worker_id]
            with contextlib.suppress(StoreError, NotLeader):  # fatal (reported by rt.persist), or demoted
                rt.execute(rt.state.disconnect(session.worker_id, session_id, rt.clock()))
        await ws.close()
    return ws


async def _await_register(rt: Runtime, ws: web.WebSocketResponse, s: Session) -> m.Register | None:
    deadline = asyncio.get_running_loop().time() + REGISTER_TIMEOUT_S
    try:
        while (raw := await ws.receive(timeout=max(0.0, deadline - asyncio.get_running_loop().time()))).type in (
                WSMsgType.PING, WSMsgType.PONG):
            if raw.type == WSMsgType.PING:
                await ws.pong(raw.data)
    except TimeoutError:
        s.close("no register message within 10s")
        return None
    if raw.type != WSMsgType.BINARY:
        s.send(m.ErrorMsg("malformed", "expected a binary signed register frame", fatal=True))
        return None
    try:
        msg = s.channel.open(raw.data, rt.clock())
    except ProtocolError as exc:
        s.send(m.ErrorMsg(exc.code, str(exc), fatal=True))
        return None
    if not isinstance(msg, m.Register) or msg.protocol_version != m.PROTOCOL_VERSION:
        s.send(m.ErrorMsg("bad_register", f"first message must be register with protocol_version "
                          f"{m.PROTOCOL_VERSION}", fatal=True))
        return None
    return msg


async def _serve(rt: Runtime, ws: web.WebSocketResponse, s: Session, reg: m.Register) -> None:
    now = rt.clock()
    try:  # first: a refused id must not close the session that owns it
        cmds = rt.state.register(reg, s.session_id, now, key_id=s.key_id)
    except PermissionDenied as exc:
        rt.stats["refused_register"] += 1
        log.warning("refused register of worker id %r by key %s: %s", reg.worker_id, s.key_id, exc)
        s.send(m.ErrorMsg("worker_id_taken", str(exc), fatal=True))
        return
    except ValidationError as exc:
        rt.stats["refused_heartbeat_interval"] += 1
        detail = "; ".join(e["error"] for e in exc.errors)
        log.warning("refused register of worker %r: %s", reg.worker_id, detail)
        s.send(m.ErrorMsg("heartbeat_interval", detail, fatal=True))
        return
    s.worker_id = reg.worker_id
    s.batches = reg.batches
    old = rt.sessions.get(reg.worker_id)
    if old is not None:
        old.close("replaced by a new session")
    rt.sessions[reg.worker_id] = s
    live = rt.state.workers[reg.worker_id].liveness
    s.send(m.Registered(worker_id=reg.worker_id, session_id=s.session_id, heartbeat_interval_s=live.interval_s,
                        server_time=now, worker_ttl_s=live.ttl_s, batches=reg.batches,
                        reports=reg.reports))  # only to a worker that said it: an older one refuses them
    try:
        rt.execute(cmds)
    except NotLeader:
        s.close("this coordinator is no longer the leader")
        return
    log.info("worker %s (%s) registered: %s tags=%s; heartbeat every %gs, TTL %gs", reg.worker_id, reg.name,
             reg.capabilities, reg.tags, live.interval_s, live.ttl_s)
    violations = 0
    async for raw in ws:
        if s.closing:
            break
        if not rt.leading():
            s.close("this coordinator is no longer the leader")
            break
        if raw.type == WSMsgType.ERROR:  # the transport broke: the session is over
            log.info("worker %s: connection lost: %s", s.worker_id, ws.exception() or raw.data)
            break
        rt.state.seen(s.worker_id, s.session_id, rt.clock())
        if raw.type == WSMsgType.PING:
            await ws.pong(raw.data)
        elif raw.type == WSMsgType.PONG:
            pass  # unasked for, but a sign of life all the same
        elif raw.type != WSMsgType.BINARY:
            violations += _reject(rt, s, "malformed", f"unexpected {raw.type.name} frame")
        else:
            violations += await _handle_frame(rt, s, raw.data)
        if violations >= rt.config.max_violations:
            s.send(m.ErrorMsg("too_many_violations", f"{violations} rejected messages; closing", fatal=True))
            s.closing = "too many protocol violations"
            break


async def _handle_frame(rt: Runtime, s: Session, data: bytes) -> int:
    """One received frame: a message, or a batch of them handled one by one; the rejections."""
    try:
        msg = s.channel.open(data, rt.clock())
    except ProtocolError as exc:
        return _reject(rt, s, exc.code, str(exc))
    if not isinstance(msg, m.Batch):
        return await _handle_message(rt, s, msg)
    rejected = 0
    for one in msg.messages:
        if s.closing:
            break
        rejected += await _handle_message(rt, s, one)
    return rejected


async def _handle_message(rt: Runtime, s: Session, msg: m.Message) -> int:
    now = rt.clock()
    try:
        handler = HANDLERS.get(type(msg))
        if handler is None:
            raise ProtocolError(f"{type(msg).__name__} is not accepted from a worker")
        named = _named_tasks(msg)
        if named and rt.state.missing(named):  # finished and left memory: read back from the store
            await rt.load_tasks(named)
            now = rt.clock()
        rt.execute(handler(rt, s, msg, now))
        return 0
    except ProtocolError as exc:
        return _reject(rt, s, exc.code, str(exc))
    except AuthError as exc:
        s.send(m.ErrorMsg("auth", str(exc), fatal=True))
        s.close(str(exc))
        return 0
    except StoreError as exc:  # fatal (rt.persist reported it): the worker keeps its results for the restart
        s.close(f"the coordinator could not persist: {exc}")
        return 0
    except NotLeader:  # the lease ran out: the worker takes its results to the next leader
        s.close("this coordinator is no longer the leader")
        return 0
    except (DTError, KeyError) as exc:
        log.warning("worker %s message rejected: %s", s.worker_id, exc)
        return _reject(rt, s, "rejected", str(exc))


def _reject(rt: Runtime, s: Session, code: str, detail: str) -> int:
    rt.stats[f"rejected_{code}"] += 1
    log.warning("worker %s: rejected frame (%s): %s", s.worker_id or "?", code, detail)
    s.send(m.ErrorMsg(code, detail))
    return 1


async def _writer(rt: Runtime, ws: web.WebSocketResponse, s: Session) -> None:
    q = s.outbox
    ending = False
    while not ending and (first := await q.get()) is not None:
        queued: list[m.Message] = [first]
        while not q.empty():  # what is queued now goes together
            if (nxt := q.get_nowait()) is None:
                ending = True
                break
            queued.append(nxt)
        if ws.closed:
            continue
        if not rt.leading():  # the fence on the way out: a replaced leader sends nothing more
            s.closing = s.closing or "this coordinator is no longer the leader"
            break
        try:
            for frame in _frames(s, _with_confirms(queued), rt.clock(), rt.config.max_frame_bytes):
                await ws.send_bytes(frame)
        except (ConnectionError, RuntimeError) as exc:
            log.info("worker %s: send failed (%s); closing", s.worker_id, exc)
            s.closing = s.closing or f"send failed: {exc}"
            break
    if not ws.closed:
        await ws.close(message=(s.closing or "").encode()[:120])


def _with_confirms(msgs: list[m.Message]) -> list[m.Message]:
    """A ``confirm`` directly followed by a ``result_ack`` without one becomes that ack carrying
    ``confirm_upto`` (both were due at once: one message)."""
    out: list[m.Message] = []
    for msg in msgs:
        prev = out[-1] if out else None
        if isinstance(msg, m.ResultAck) and not msg.confirm_upto and isinstance(prev, m.Confirm):
            out[-1] = msgspec.structs.replace(msg, confirm_upto=prev.upto)
        else:
            out.append(msg)
    return out


def _frames(s: Session, msgs: list[m.Message], now: float, limit: int) -> list[bytes]:
    """``msgs`` sealed: one ``batch`` frame when the worker reads them and it fits in ``limit``
    bytes (else halves, down to single messages), else one frame each."""
    if len(msgs) == 1 or not s.batches:
        return [s.channel.seal(msg, now) for msg in msgs]
    frame = s.channel.seal(m.Batch(msgs), now)  # type: ignore[arg-type]
    if len(frame) <= limit:
        return [frame]
    half = len(msgs) // 2
    return [*_frames(s, msgs[:half], now, limit), *_frames(s, msgs[half:], now, limit)]


__all__ = ["worker_endpoint", "HANDLERS", "SESSION_HEADER", "PermissionDenied"]
