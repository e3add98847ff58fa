"""A pool of long-lived custom-handler child processes, driven from the event loop.

Why real child interpreters (``python -m ...pool_child``) rather than ``multiprocessing``: each child
is exec'd fresh with ``start_new_session=True``, so its process group exists before any handler
code runs and one ``killpg`` stops it and everything it spawned; nothing of the worker's state
(event loop, sockets, threads, a CUDA context) is inherited the way ``fork`` would; and the
stdin/stdout pipes are plain asyncio streams, so waiting for a reply never blocks the loop.

Each child serves one request at a time. A chain (:meth:`HandlerPool.chain`) hands one child several
requests in one write and reads their replies as they come, one per request, each under its own
timeout. A child whose task timed out, broke its memory limit,
was cancelled or died is killed (whole process group) and replaced in the background; the pool
keeps ``size`` children alive.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import sys
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec

import distributed_testing
from distributed_testing.errors import ExecutionError
from distributed_testing.process.childenv import child_environ
from distributed_testing.process.childout import unread
from distributed_testing.worker import confine
from distributed_testing.worker.confine import Confinement
from distributed_testing.worker.executors.pool_child import (
    HEADER,
    MAX_FRAME,
    Hello,
    Reply,
    Request,
    Skip,
    frame,
)
from distributed_testing.worker.executors.proc import (
    OutputTail,
    describe_exit,
    exited,
    finish_relay,
    kill_process_group,
)
from distributed_testing.worker.executors.supervise import MemoryWatch, run_limited
from distributed_testing.worker.sandbox import gpu_devices

logger = logging.getLogger(__name__)

_PACKAGE_PARENT = str(Path(distributed_testing.__file__).resolve().parent.parent)
_ENCODER = msgspec.msgpack.Encoder()
_REPLY_DECODER = msgspec.msgpack.Decoder(Reply)
_HELLO_DECODER = msgspec.msgpack.Decoder(Hello)
# after a reply, how long the worker waits at most for the child's output before it to be read
_SETTLE_POLLS, _SETTLE_POLL_S = 40, 0.005


@dataclass(frozen=True)
class PoolResult:
    """How one request ended. ``reply`` is set only for ``kind == "reply"``."""

    kind: Literal["reply", "timed_out", "memory", "died", "skipped", "cancelled"]
    child_pid: int
    reply: Reply | None = None
    returncode: int | None = None
    stderr_tail: str = ""
    memory_error: str | None = None


class _Child:
    """One running pool child and its pipes."""

    def __init__(self, proc: asyncio.subprocess.Process, hello: Hello, tail: OutputTail, drain: asyncio.Task[None],
                 scratch: Path | None = None, seen: tuple[object, ...] = ()):
        self.proc = proc
        self.pid = proc.pid
        self.handlers = hello.handlers
        self.stderr_tail = tail
        self.scratch = scratch  # a confined child's own writable directory, emptied after each task
        self.seen = seen  # the confinement's watched files when it started (Confinement.identity)
        self.work_dir = None if scratch is None else str(scratch / "work")  # each request's work_dir there
        self._drain = drain

    async def request(self, payload: bytes) -> Reply | None:
        """Send one encoded request and return the reply, or None if the child closed its stdout."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(payload)
        try:
            await self.proc.stdin.drain()
            data = await _read_frame(self.proc.stdout)
        except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError):
            return None
        try:
            return _REPLY_DECODER.decode(data)
        except msgspec.DecodeError as exc:
            raise ExecutionError(f"pool child {self.pid} sent a malformed reply: {exc}") from exc

    async def settle(self) -> None:
        """After a reply: wait (briefly) until the worker has read what the child wrote before it,
        so the request's output ends in its own stream, not the next one's (process/childout.py).
        A request that wrote nothing more costs one ``ioctl``."""
        fd, polls = _stderr_fd(self.proc), 0
        while fd >= 0 and unread(fd) > 0 and polls < _SETTLE_POLLS:
            await asyncio.sleep(_SETTLE_POLL_S)
            polls += 1
        if polls or len(getattr(self.proc.stderr, "_buffer", b"")):
            await asyncio.sleep(0)  # the stderr reader takes what the loop has read

    async def next_reply(self) -> Reply | None:
        """The next reply, or None if the child closed its stdout (it died)."""
        assert self.proc.stdout is not None
        try:
            data = await _read_frame(self.proc.stdout)
        except (asyncio.IncompleteReadError, ConnectionResetError):
            return None
        try:
            return _REPLY_DECODER.decode(data)
        except msgspec.DecodeError as exc:
            raise ExecutionError(f"pool child {self.pid} sent a malformed reply: {exc}") from exc

    async def reap(self) -> int:
        """Kill the child's process group, wait for it and its stderr pipe; return its exit code."""
        kill_process_group(self.pid)
        code = await self.proc.wait()
        await finish_relay(self._drain, f"pool child {self.pid}")
        # in a thread: a task may have left a large tree there, and the loop carries the heartbeats
        await asyncio.to_thread(confine.remove, self.scratch)
        return code


def _stderr_fd(proc: asyncio.subprocess.Process) -> int:
    """The worker's end of ``proc``'s stderr pipe; -1 when it cannot be told."""
    try:
        return int(proc._transport.get_pipe_transport(2).get_extra_info("pipe").fileno())  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):
        return -1


class ChainControl:
    """Stops one request of a running chain (:meth:`HandlerPool.chain`): a task cancelled in it."""

    def __init__(self) -> None:
        self.current = 0  # the request whose reply is awaited: running, or about to
        self.killed = False
        self.early: set[int] = set()  # stopped before the chain had its child: skipped from the start
        self._child: _Child | None = None
        self._seqs: list[int] = []
        self._over = False

    def bind(self, child: _Child, seqs: list[int]) -> None:
        self._child, self._seqs = child, seqs

    def unbind(self) -> None:
        self._child, self._over = None, True

    def skip(self, index: int) -> None:
        """Request ``index`` must not begin: the child answers it ``skipped`` if it has not begun,
        else it runs as usual (never killed)."""
        child = self._child
        if child is None and not self._over:  # still waiting for its child: it never begins
            self.early.add(index)
        elif child is not None and index >= self.current and child.proc.stdin is not None \
                and not child.proc.stdin.is_closing():
            child.proc.stdin.write(frame(_ENCODER.encode(Skip([self._seqs[index]]))))

    def withdraw(self, index: int) -> None:
        """Request ``index`` must not run (on): replied already, nothing to do; awaited now, its
        child is killed (its result: ``cancelled``); not begun, the child skips it."""
        child = self._child
        if child is None or index < self.current:
            if child is None and not self._over:
                self.early.add(index)
            return
        if index == self.current:
            self.killed = True
            kill_process_group(child.pid)
        else:
            self.skip(index)


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    if size > MAX_FRAME:
        raise ExecutionError(f"pool child sent a frame of {size} bytes (limit {MAX_FRAME})")
    return await reader.readexactly(size)


class HandlerPool:
    """``size`` long-lived pool children; :meth:`call` runs one request on a free child.

    ``handlers`` maps extra handler names to ``"module:function"`` specs; ``pythonpath`` entries
    are prepended to the children's ``PYTHONPATH`` (after this package's own location).
    ``command``, ``env`` and ``cwd``, when given, replace the child's command line (see
    :meth:`child_argv`), environment and working directory: a shipped handler's one-off pool runs
    its child inside the sandbox (``custom.py``).

    With ``confinement`` (the operator's handlers, :mod:`distributed_testing.worker.confine`) each
    child is started inside it once, with a scratch directory of its own (the only place it can
    write, with ``writable``: the handlers' cache directory) and the GPU device
    nodes bound in (a handler may use the GPU, as unconfined). Each request gets
    its ``work`` directory as ``work_dir``, and the child empties the scratch directory and its
    ``/dev/shm`` (the rest of its ``/dev`` is read-only) after each reply (while the worker reads the reply, not before it), so a task finds no file of the one
    before it and no child sees another child's files. (What a handler keeps in the child's memory
    stays, as in any warm pool: these are the operator's handlers.)
    """

    def __init__(
        self,
        size: int,
        *,
        handlers: Mapping[str, str] | None = None,
        pythonpath: Sequence[Path] = (),
        use_entry_points: bool = True,
        start_timeout_s: float = 60.0,
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        confinement: Confinement | None = None,
        writable: Sequence[Path] = (),
    ) -> None:
        if size < 1:
            raise ValueError(f"pool size must be at least 1, got {size}")
        self.size = size
        self._argv = list(command) if command is not None else self.child_argv(handlers or {}, use_entry_points)
        self._env = dict(env) if env is not None else self._child_env(pythonpath)
        self._cwd = cwd
        self._confine = confinement
        self._writable = list(writable)
        self._start_timeout_s = start_timeout_s
        self._idle: list[_Child] = []
        self._children: set[_Child] = set()
        self._live = 0
        self._sem = asyncio.Semaphore(size)
        self._background: set[asyncio.Task[None]] = set()
        self._seq = itertools.count(1)
        self._closed = False

    @staticmethod
    def child_argv(handlers: Mapping[str, str], use_entry_points: bool) -> list[str]:
        argv = [sys.executable, "-m", "distributed_testing.worker.executors.pool_child"]
        argv += ["--log-level", str(logger.getEffectiveLevel())]
        for name, spec in handlers.items():
            argv += ["--handler", f"{name}={spec}"]
        if not use_entry_points:
            argv.append("--no-entry-points")
        return argv

    @staticmethod
    def _child_env(pythonpath: Sequence[Path]) -> dict[str, str]:
        env = child_environ()  # the worker's environment without its credentials
        parts = [_PACKAGE_PARENT, *(str(p) for p in pythonpath)]
        if env.get("PYTHONPATH"):
            parts.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(parts)
        return env

    @property
    def pids(self) -> list[int]:
        """PIDs of the children alive now (for monitoring and tests)."""
        return sorted(c.pid for c in self._children)

    async def start(self) -> None:
        """Start ``size`` children; ExecutionError (with the child's stderr) if any fails to start."""
        results = await asyncio.gather(*(self._spawn() for _ in range(self.size)), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        for child in results:
            if isinstance(child, _Child):
                self._idle.append(child)
        if failures:
            await self.close()
            raise failures[0]

    async def _spawn(self) -> _Child:
        self._live += 1
        try:
            return await self._spawn_unaccounted()
        except BaseException:
            self._live -= 1
            raise

    async def _spawn_unaccounted(self) -> _Child:
        argv, env, scratch = self._argv, self._env, None
        seen: tuple[object, ...] = ()
        if self._confine is not None:
            seen = self._confine.identity()  # before the command: a change after it restarts the child
            scratch = self._confine.scratch("pool")
            (scratch / "work").mkdir()
            env = self._confine.environ(env, scratch)
            argv = self._confine.wrap(argv, rw=[scratch, *self._writable], devices=gpu_devices())
        try:
            return await self._start_child(argv, env, scratch, seen)
        except BaseException:
            confine.remove(scratch)
            raise

    async def _start_child(self, argv: list[str], env: dict[str, str], scratch: Path | None,
                           seen: tuple[object, ...]) -> _Child:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env=env,
            cwd=self._cwd,
        )
        assert proc.stdout is not None and proc.stderr is not None
        tail = OutputTail()
        drain = asyncio.create_task(tail.drain(proc.stderr, log_prefix=f"pool child {proc.pid}:"))
        try:
            async with asyncio.timeout(self._start_timeout_s):
                hello = _HELLO_DECODER.decode(await _read_frame(proc.stdout))
        except (TimeoutError, asyncio.IncompleteReadError, msgspec.DecodeError) as exc:
            kill_process_group(proc.pid)
            code = await proc.wait()
            await asyncio.wait({drain}, timeout=5.0)
            raise ExecutionError(
                f"custom handler pool child {proc.pid} failed to start ({describe_exit(code)}): {tail.text()[-2000:]}"
            ) from exc
        except BaseException:
            kill_process_group(proc.pid)
            raise
        child = _Child(proc, hello, tail, drain, scratch, seen)
        self._children.add(child)
        logger.debug("pool child %d started with handlers %s", child.pid, child.handlers)
        return child

    async def call(self, request: Request, *, timeout_s: float | None, max_memory_mb: int | None,
                   output: Callable[[bytes], None] | None = None) -> PoolResult:
        """Run ``request`` on a free child under the given limits; what the child writes meanwhile
        also goes to ``output`` (the task's output stream).

        Waits for a free child when all ``size`` are busy. On timeout, memory overrun, cancellation
        or child death the child's process group is killed and a replacement is started.
        """
        if self._closed:
            raise ExecutionError("custom handler pool is closed")
        seq = next(self._seq)
        async with self._sem:
            child = await self._checkout()
            if child.work_dir is not None:  # the child empties its scratch after its reply (pool_child.empty_scratch)
                request = msgspec.structs.replace(request, seq=seq, work_dir=child.work_dir, clean_scratch=True)
            else:
                request = msgspec.structs.replace(request, seq=seq)
            payload = frame(_ENCODER.encode(request))
            try:
                child.stderr_tail.sink = output
                result = await self._call_on(child, payload, seq, timeout_s, max_memory_mb)
                if output is not None and result.kind == "reply":
                    await child.settle()
            except BaseException:
                self._discard(child)
                raise
            finally:
                child.stderr_tail.sink = None
            if result.kind == "reply":
                self._release(child)
            else:
                self._discard(child)
            return result

    async def _checkout(self) -> _Child:
        """An idle child that is still running, or a newly started one. A confined child started
        before a key or token file hidden by name was replaced (it could read the new one) is
        replaced first."""
        while self._idle:
            child = self._idle.pop()
            if exited(child.proc):
                rc = child.proc.returncode  # None while the loop has not noticed yet
                logger.warning("pool child %d exited while idle%s", child.pid, "" if rc is None else f" ({describe_exit(rc)})")
                self._discard(child)
            elif self._confine is not None and child.seen != self._confine.identity():
                logger.info("pool child %d: a key or token file hidden by name was replaced since it started (it "
                            "could read the new one); starting another", child.pid)
                self._discard(child, replace=False)
            else:
                return child
        return await self._spawn()

    async def _call_on(
        self, child: _Child, payload: bytes, seq: int, timeout_s: float | None, max_memory_mb: int | None
    ) -> PoolResult:
        watch = MemoryWatch(child.pid, max_memory_mb) if max_memory_mb else None
        return await self._reply(child, child.request(payload), seq, timeout_s, watch)

    async def chain(self, requests: Sequence[Request], control: ChainControl, *,
                    timeouts: Sequence[float | None], max_memory_mb: int | None,
                    outputs: Sequence[Callable[[bytes], None] | None] = ()) -> AsyncGenerator[tuple[int, PoolResult], None]:
        """Run ``requests`` on one free child, handed over in one write; yield ``(index, result)``
        for each as its reply comes, in order. Request ``i`` runs under ``timeouts[i]`` (counted
        from the reply before it) and the memory limit. A request that does not end in a reply
        (timeout, memory, death, or ``control`` killed it: ``cancelled``) is the last yielded: its
        child is killed and replaced, and the requests after it never began (the caller runs them
        again). ``control.skip(i)``: request ``i`` is ``skipped`` if it has not begun, else runs;
        ``control.withdraw(i)``: skipped too, or its child killed if it is the one running. What
        the child writes goes to ``outputs[i]`` from the reply before request ``i`` until the worker
        has read what came before its reply (``_Child.settle``); the child is already running the
        next one meanwhile, so what that one writes at once may land in the one before's output.
        Use it with ``contextlib.aclosing``."""
        if self._closed:
            raise ExecutionError("custom handler pool is closed")
        async with self._sem:
            child = await self._checkout()
            seqs = [next(self._seq) for _ in requests]
            scratch = {} if child.work_dir is None else {"work_dir": child.work_dir, "clean_scratch": True}
            payload = b"".join(frame(_ENCODER.encode(msgspec.structs.replace(r, seq=seq, **scratch)))
                               for r, seq in zip(requests, seqs, strict=True))
            if control.early:  # in the same write: the child reads them before it begins the first
                payload += frame(_ENCODER.encode(Skip([seqs[i] for i in sorted(control.early)])))
            watch = MemoryWatch(child.pid, max_memory_mb) if max_memory_mb else None
            control.bind(child, seqs)
            ended = False
            try:
                assert child.proc.stdin is not None
                child.proc.stdin.write(payload)
                await child.proc.stdin.drain()
                for i, seq in enumerate(seqs):
                    control.current = i
                    output = outputs[i] if outputs else None
                    child.stderr_tail.sink = output
                    result = await self._reply(child, child.next_reply(), seq, timeouts[i], watch, control)
                    if output is not None and result.kind == "reply":
                        await child.settle()
                    ended = result.kind not in ("reply", "skipped")
                    yield i, result
                    if ended:
                        break
            except BaseException:
                self._discard(child)
                raise
            finally:
                control.unbind()
                child.stderr_tail.sink = None
            if ended:
                self._discard(child)
            else:
                self._release(child)

    @staticmethod
    async def _reply(child: _Child, waiting: Awaitable[Any], seq: int, timeout_s: float | None,
                     watch: MemoryWatch | None, control: ChainControl | None = None) -> PoolResult:
        """The child's reply to request ``seq`` (``waiting`` reads it), or why none came: it timed
        out, went over its memory, or the child ended (``cancelled`` when a chain's ``control``
        killed it). The stderr kept for a death is what the child wrote from here on: the tasks
        before this one wrote what came before."""
        mark = child.stderr_tail.total_bytes
        limited = await run_limited(waiting, timeout_s=timeout_s, watch=watch)
        if limited.verdict == "timed_out":
            return PoolResult("timed_out", child.pid)
        if limited.verdict == "memory":
            assert watch is not None
            return PoolResult("memory", child.pid, memory_error=watch.describe_exceeded())
        reply = limited.value
        if reply is None:
            code = await child.reap()
            kind: Literal["died", "cancelled"] = "cancelled" if control is not None and control.killed else "died"
            return PoolResult(kind, child.pid, returncode=code, stderr_tail=child.stderr_tail.text(since=mark))
        if reply.seq != seq:
            raise ExecutionError(f"pool child {child.pid} answered request {reply.seq}, expected {seq}")
        return PoolResult("skipped" if reply.kind == "skipped" else "reply", child.pid, reply=reply)

    def _release(self, child: _Child) -> None:
        if self._closed or self._live > self.size:
            self._discard(child, replace=False)
        else:
            self._idle.append(child)

    def _discard(self, child: _Child, *, replace: bool = True) -> None:
        """Kill ``child`` now; reap it (and start a replacement) in an owned background task.

        Idempotent per child: a child already discarded is left alone.
        """
        if child not in self._children:
            return
        kill_process_group(child.pid)
        self._children.discard(child)
        self._live -= 1
        task = asyncio.create_task(self._reap_and_replace(child, replace and not self._closed))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _reap_and_replace(self, child: _Child, replace: bool) -> None:
        code = await child.reap()
        logger.debug("pool child %d reaped (%s)", child.pid, describe_exit(code))
        if not replace or self._closed or self._live >= self.size:
            return
        try:
            new = await self._spawn()
        except (ExecutionError, OSError):
            logger.exception("could not replace pool child %d; the next task will try again", child.pid)
            return
        if self._closed:
            self._discard(new, replace=False)
        else:
            self._idle.append(new)

    async def close(self) -> None:
        """Kill every child (whole process groups) and wait for them. Idempotent.

        A request still running gets a ``died`` result; stop tasks before closing the pool.
        """
        self._closed = True
        for child in list(self._children):
            self._discard(child, replace=False)
        self._idle.clear()
        while self._background:
            await asyncio.gather(*self._background)
