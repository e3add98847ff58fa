"""The worker's run side: it executes the instructions of the pure ``core.state.WorkerState``
(``apply``, a table by instruction type) and runs the tasks they start.

A run is one executor call (a batch shares one) in an asyncio task of its own, its child
processes under it; ``Kill`` cancels that task. A task still running after ``STARTED_DELAY_S`` is
announced; its result goes to the state (``finished``), which sends it at once and keeps it in the
result store until acknowledged. The result hold and the end-of-iteration flush are loop timers.
``WorkerAgent`` (``agent.py``) owns one ``Runs`` and feeds the state the coordinator's messages;
it never touches a run itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from ..config import WorkerConfig
from ..errors import ExecutionError
from ..protocol import messages as m
from ..tasks.log import LOG_KEY
from .auth import Credentials
from .bundles import ShippedCode
from .coordinators import Candidates
from .core.output import MAX_ERROR_CHARS, MAX_PROGRESS_CHARS, bound, cut, large
from .core.state import (
    ArmHold,
    DisarmHold,
    FlushSoon,
    Forget,
    Instruction,
    Keep,
    Kill,
    RecordFinished,
    RecordStarted,
    ResendKept,
    Send,
    Settle,
    Start,
    Warn,
    Withdraw,
    WorkerState,
)
from .executors.base import ExecOutcome, Executor, TaskContext
from .executors.pool import ChainControl
from .result_store import ResultStore
from .tasklogs import OutputStreams, ReportStreams

log = logging.getLogger(__name__)
# A task still running after this long is announced with ``started``; shorter ones are announced
# only by their result, which saves a message and a durable write per short task.
STARTED_DELAY_S = 0.025
# Results finished while the previous ``results`` message still waits for its ack are held and
# sent together when the ack arrives, for at most this long. An idle worker sends at once; a
# busy one sends one message per coordinator round trip, carrying everything finished meanwhile,
# so message, signing, dispatch and fsync costs are shared by many tasks. Measured with
# benchmarks/dispatch.py (2 workers x 32 slots): 1.8 tasks per message without the hold, 11
# with it, and 1,945 -> 2,861 tasks/s.
RESULT_HOLD_S = 0.005
# A cancelled run is waited for this long at most. A training run waits for its launch thread,
# which stops the local ranks (training.launch: up to STOP_GRACE_S plus two 5 s waits); a run still
# going after this is logged and left behind, so a stopping worker never waits on it for ever.
RUN_STOP_S = 30.0


class Runs:
    """The runs under way (by the state's run id) and the timers of the result hold and flush.

    ``send`` queues a message for the current session; ``registered`` is set while a session is
    established; ``candidates.current`` is the coordinator a task's bundle is fetched from;
    ``interface`` is the NIC training ranks bind (the agent sets it at each connect)."""

    def __init__(self, config: WorkerConfig, state: WorkerState, executors: dict[str, Executor],
                 result_store: ResultStore,
                 *, send: Callable[[m.Message], None], registered: asyncio.Event, candidates: Candidates,
                 credentials: Credentials, shipped: ShippedCode, clock: Callable[[], float]) -> None:
        self.config = config
        self.state = state
        self.executors = executors
        self.result_store = result_store
        self.send = send
        self.registered = registered
        self.candidates = candidates
        self.credentials = credentials
        self.shipped = shipped
        self.clock = clock
        self.interface: str | None = config.interface
        self.tasks: dict[int, asyncio.Task[None]] = {}  # by run id (state.Start)
        self._hold: asyncio.TimerHandle | None = None  # ends a result hold (RESULT_HOLD_S)
        self.chains: dict[int, tuple[ChainControl, dict[str, int]]] = {}  # chain runs: control, index by task id
        # what running attempts write, streamed as ``output`` messages and kept for their results
        self.outputs = OutputStreams(send, registered.is_set,
                                     lambda ref: self.state.attempt(ref.task_id, ref.attempt) is not None)
        # each test's reports as it ends, to a coordinator that keeps them (registered.reports)
        self.reports_kept = False
        self.reports = ReportStreams(send, lambda: registered.is_set() and self.reports_kept,
                                     lambda ref: self.state.attempt(ref.task_id, ref.attempt) is not None,
                                     lambda: self.reports_kept)

    # --------------------------------------------------------------- executing

    def apply(self, instructions: Sequence[Instruction]) -> list[asyncio.Future[None]]:
        """Execute the state's instructions in order; returns the result store writes' futures (an
        async caller awaits them before it goes on, as the result store's durability point)."""
        writes: list[asyncio.Future[None]] = []
        for ins in instructions:
            if (fut := _INSTRUCTIONS[type(ins)](self, ins)) is not None:
                writes.append(fut)
        return writes

    async def apply_all(self, instructions: list[Instruction]) -> None:
        for write in self.apply(instructions):
            await write

    def busy(self) -> set[asyncio.Task[None]]:
        """The runs not yet over."""
        return {t for t in self.tasks.values() if not t.done()}

    def of(self, kills: Sequence[Kill]) -> list[asyncio.Task[None]]:
        """The runs these kills stop (those still under way)."""
        return [self.tasks[k.run] for k in kills if k.run in self.tasks]

    async def stop_all(self) -> None:
        """The worker stops: no queued run starts any more, every run is cancelled and awaited
        (``stopped``), and their running records are closed (stopped on purpose, not a crash)."""
        self.state.closing()  # a cancelled run's slot must not start a queued one now
        runs = list(self.tasks.values())
        for t in runs:
            t.cancel()
        await self.stopped(runs, "while the worker stopped")
        self.result_store.running_finished(self.state.running_refs())

    @staticmethod
    async def stopped(runs: Sequence[asyncio.Task[None]], when: str) -> None:
        """Wait for these runs (cancelled or killed) to end, for at most ``RUN_STOP_S``; an error
        one ended with, or one still running then, is logged."""
        if not runs:
            return
        done, stuck = await asyncio.wait(runs, timeout=RUN_STOP_S)
        for t in done:
            if not t.cancelled() and (exc := t.exception()) is not None:
                log.error("%s failed %s: %r", t.get_name(), when, exc)
        if stuck:
            log.error("%s still running %gs after being stopped %s; not waiting for them any longer",
                      ", ".join(sorted(t.get_name() for t in stuck)), RUN_STOP_S, when)

    def _do_send(self, ins: Instruction) -> None:
        assert isinstance(ins, Send)
        self.send(ins.msg)

    def _do_start(self, ins: Instruction) -> None:
        assert isinstance(ins, Start)
        first = ins.assignments[0]
        if ins.batched:
            coro, name = self._execute_batch(list(ins.assignments)), f"batch-{first.task_id}"
        elif ins.chained:
            coro, name = self._execute_chain(ins.run, list(ins.assignments)), f"chain-{first.task_id}"
        else:
            coro, name = self._execute(first), f"task-{first.task_id}"
        task = asyncio.create_task(coro, name=name)
        self.tasks[ins.run] = task
        task.add_done_callback(functools.partial(self._run_ended, ins.run))

    def _run_ended(self, run: int, task: asyncio.Task[None]) -> None:
        """A run's task is over: its slot goes to the next queued run. One that ended with an
        exception (a fault of ours, past the guards of ``_run_executor``) is logged, and its
        attempts that are still held report an error, so no slot or attempt stays taken."""
        self.tasks.pop(run, None)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("%s failed: %r", task.get_name(), exc, exc_info=exc)
            now = self.clock()
            for tid, r in list(self.state.running.items()):
                if r.run == run:
                    self.apply(self.state.finished(m.TaskResult(
                        task_id=tid, attempt=r.assignment.attempt, status="error", started_at=now, finished_at=now,
                        output={"retryable": False}, error=_failed(exc), worker_id=self.config.worker_id)))
        self.apply(self.state.run_ended(run))

    def _do_kill(self, ins: Instruction) -> None:
        assert isinstance(ins, Kill)
        chain = self.chains.get(ins.run)
        if ins.task_id is not None and chain is not None:
            control, order = chain
            if (index := order.get(ins.task_id)) is not None:
                control.withdraw(index)
        elif (task := self.tasks.get(ins.run)) is not None:
            task.cancel()

    def _do_withdraw(self, ins: Instruction) -> None:
        assert isinstance(ins, Withdraw)
        if (chain := self.chains.get(ins.run)) is not None and (index := chain[1].get(ins.task_id)) is not None:
            chain[0].skip(index)

    def _do_keep(self, ins: Instruction) -> asyncio.Future[None]:
        assert isinstance(ins, Keep)
        return self.result_store.add(ins.result)

    def _do_forget(self, ins: Instruction) -> None:
        assert isinstance(ins, Forget)
        self.result_store.ack(ins.refs)

    def _do_settle(self, ins: Instruction) -> asyncio.Future[None]:
        assert isinstance(ins, Settle)
        return self.result_store.settled(ins.results)

    def _do_resend_kept(self, ins: Instruction) -> asyncio.Future[None]:
        """Re-send what the result store keeps; the returned future completes once it is queued."""
        async def resend() -> None:
            unsent = await self.result_store.unacked()
            if unsent:
                log.info("re-sending %d unacknowledged results", len(unsent))
                self.send(m.Results(unsent))
        return asyncio.ensure_future(resend())

    def _do_record_started(self, ins: Instruction) -> None:
        assert isinstance(ins, RecordStarted)
        self.result_store.running_started(ins.refs)

    def _do_record_finished(self, ins: Instruction) -> None:
        assert isinstance(ins, RecordFinished)
        self.result_store.running_finished(ins.refs)

    def _do_flush_soon(self, _ins: Instruction) -> None:
        asyncio.get_running_loop().call_soon(self._flush)

    def _do_arm_hold(self, _ins: Instruction) -> None:
        self._hold = asyncio.get_running_loop().call_later(RESULT_HOLD_S, self._hold_expired)

    def _do_disarm_hold(self, _ins: Instruction) -> None:
        if self._hold is not None:
            self._hold.cancel()
            self._hold = None

    def _do_warn(self, ins: Instruction) -> None:
        assert isinstance(ins, Warn)
        log.warning("%s", ins.text)

    def _flush(self) -> None:
        self.apply(self.state.flush(self.clock()))

    def _hold_expired(self) -> None:
        self._hold = None
        self.apply(self.state.hold_expired(self.clock()))

    # ----------------------------------------------------------------- running

    async def _execute(self, a: m.TaskAssignment) -> None:
        """One task; started by the state only once a slot is free (``state.Start``)."""
        ref = m.TaskRef(a.task_id, a.attempt)
        announce = asyncio.get_running_loop().call_later(STARTED_DELAY_S, self._announce_started, ref)
        try:
            outcome = await self._run_executor(a)
        finally:
            announce.cancel()
        await self._report(a, outcome)

    async def _execute_batch(self, batch: list[m.TaskAssignment]) -> None:
        """Several tasks in one executor call (one model load); one slot for the whole batch."""
        ex = self.executors[batch[0].type]
        for a in batch:
            self._announce_started(m.TaskRef(a.task_id, a.attempt))
        ctxs = [self._context(a) for a in batch]
        try:
            outcomes = await ex.run_batch(ctxs)  # type: ignore[attr-defined]
        except ExecutionError as exc:
            outcomes = [ExecOutcome("error", error=str(exc)) for _ in batch]
        except asyncio.CancelledError:
            cancelled = [a.task_id for a in batch if (r := self.state.running.get(a.task_id)) and r.cancel_reason]
            if not cancelled:
                raise
            outcomes = [self._batch_cancel_outcome(a, cancelled) for a in batch]
        except Exception as exc:  # as in _run_executor: the batch's tasks end in error, the worker goes on
            log.exception("batch %s failed on this worker", batch[0].task_id)
            outcomes = [ExecOutcome("error", output={"retryable": False}, error=_failed(exc)) for _ in batch]
        for a, outcome in zip(batch, outcomes, strict=True):
            await self._report(a, outcome)

    async def _execute_chain(self, run: int, chain: list[m.TaskAssignment]) -> None:
        """Tasks queued for one slot, handed to one pool child in one exchange (``state.Start.chained``);
        each is announced once it has run ``STARTED_DELAY_S`` and reported as it ends. Those the chain
        never began (it stopped at a timeout, a cancel or a crash) go back to the queue; a chain the
        executor refuses runs task by task."""
        ex = self.executors[chain[0].type]
        control = ChainControl()
        self.chains[run] = (control, {a.task_id: i for i, a in enumerate(chain)})
        loop = asyncio.get_running_loop()
        done = 0
        announce = loop.call_later(STARTED_DELAY_S, self._announce_started, m.TaskRef(chain[0].task_id, chain[0].attempt))
        try:
            async with contextlib.aclosing(ex.run_chain([self._context(a) for a in chain], control)) as outcomes:  # type: ignore[attr-defined]
                async for i, outcome in outcomes:
                    announce.cancel()
                    if i + 1 < len(chain):
                        nxt = chain[i + 1]
                        announce = loop.call_later(STARTED_DELAY_S, self._announce_started, m.TaskRef(nxt.task_id, nxt.attempt))
                    done = i + 1
                    ref = m.TaskRef(chain[i].task_id, chain[i].attempt)
                    if outcome is None:  # skipped by the child: it never began
                        self.apply(self.state.skipped(run, ref, self.clock()))
                        continue
                    self.apply(self.state.began(ref))
                    r = self.state.running.get(chain[i].task_id)
                    if outcome.status != "cancelled" and r is not None and r.cancel_reason:
                        outcome = ExecOutcome("cancelled", error=r.cancel_reason, started_at=outcome.started_at)
                    elif outcome.status == "cancelled" and r is not None and r.cancel_reason:
                        outcome.error = r.cancel_reason
                    await self._report(chain[i], outcome)
        except ExecutionError:  # refused before anything ran: one by one
            for a in chain[done:]:
                if self.state.attempt(a.task_id, a.attempt) is not None:
                    await self._report(a, await self._run_executor(a))
            done = len(chain)
        except asyncio.CancelledError:  # the whole run was stopped: what was cancelled says so
            for a in chain[done:]:
                if (r := self.state.attempt(a.task_id, a.attempt)) is not None and r.cancel_reason:
                    await self._report(a, ExecOutcome("cancelled", error=r.cancel_reason))
            raise
        finally:
            announce.cancel()
            self.chains.pop(run, None)
        self.apply(self.state.unstarted(run, [m.TaskRef(a.task_id, a.attempt) for a in chain[done:]]))

    def _batch_cancel_outcome(self, a: m.TaskAssignment, cancelled: list[str]) -> ExecOutcome:
        r = self.state.running.get(a.task_id)
        if r is not None and r.cancel_reason:
            return ExecOutcome("cancelled", error=r.cancel_reason)
        return ExecOutcome("error", output={"retryable": True},
                           error=f"stopped because {', '.join(cancelled)} in the same batch was cancelled")

    async def _report(self, a: m.TaskAssignment, outcome: ExecOutcome) -> None:
        """Sent at once. Written to the result store too (no fsync of its own: see result_store_duckdb), so an
        unacked result is re-sent after a reconnect; the coordinator acks only after its fsync.

        The outcome is checked here, where the task's output enters the worker (``core.output.bound``):
        one a frame cannot carry, or too large for one, is reported as the task's error instead."""
        plain = outcome.output
        self.reports.finish(m.TaskRef(a.task_id, a.attempt))
        if (kept := self.outputs.finish(m.TaskRef(a.task_id, a.attempt))) is not None:
            outcome.output = {**plain, LOG_KEY: kept}  # what it wrote, bounded (tasks/log.py)
        status, output, error = await _bounded(outcome.status, outcome.output, outcome.error)
        if output is not outcome.output and kept is not None:  # too large with its kept output: without it
            status, output, error = await _bounded(outcome.status, plain, outcome.error)
            outcome.output = plain
            if output is plain:
                log.warning("task %s (attempt %d): its kept output (%d bytes) was left out of its result, which "
                            "would be too large with it", a.task_id, a.attempt, kept["bytes"])
        if output is not outcome.output:
            log.warning("task %s (attempt %d): %s", a.task_id, a.attempt, (error or "")[:500])
        # positional, in TaskResult's field order (one per task; keywords cost 3 times as much)
        result = m.TaskResult(a.task_id, a.attempt, status, outcome.started_at, outcome.finished_at, output, error,
                              self.config.worker_id)
        await self.apply_all(self.state.finished(result))

    def _context(self, a: m.TaskAssignment) -> TaskContext:
        return TaskContext(task_id=a.task_id, attempt=a.attempt, type=a.type, config=a.config,
                           timeout_s=a.timeout_s or self.config.task_timeout_s, max_memory_mb=a.max_memory_mb,
                           test_root=self.config.test_root, cache=a.cache, gang=a.gang, interface=self.interface,
                           allow_model_modules=self.config.allow_model_modules,
                           allow_test_options=self.config.allow_test_options,
                           progress=functools.partial(self._progress, m.TaskRef(a.task_id, a.attempt)),
                           output=self.outputs.sink(m.TaskRef(a.task_id, a.attempt)),
                           reports=self.reports.sink(m.TaskRef(a.task_id, a.attempt)))

    def _progress(self, ref: m.TaskRef, fraction: float, message: str) -> None:
        """An executor's progress report (called on the loop) as a ``progress`` message."""
        if self.state.attempt(ref.task_id, ref.attempt) is not None and self.registered.is_set():
            self.send(m.TaskProgress(ref, fraction, cut(message, MAX_PROGRESS_CHARS)))

    def _announce_started(self, ref: m.TaskRef) -> None:
        self.apply(self.state.announce(ref))

    async def _run_executor(self, a: m.TaskAssignment) -> ExecOutcome:
        started = self.clock()
        ex = self.executors.get(a.type)
        if ex is None:
            return ExecOutcome("error", error=f"this worker has no executor for task type {a.type!r}",
                               started_at=started, finished_at=self.clock())
        try:
            if a.bundle is None:
                return await ex.run(self._context(a))
            session_key = getattr(ex, "session_key", None)  # a test run's session (executors/test_session.py)
            if session_key is not None and (key := session_key(a)) is not None:
                served: ExecOutcome = await ex.serve(  # type: ignore[attr-defined]
                    self._context(a), key, functools.partial(self._shipped, a))
                return served
            cred = await self.credentials.current()
            async with self.shipped.task(a.type, a.task_id, self.candidates.current, cred, a.bundle,
                                         a.python) as shipped:
                out = await ex.run(dataclasses.replace(self._context(a), **shipped))
            if "python_env" in shipped:  # its environment's digest, build time and whether it was cached
                out.output.setdefault("python_env", shipped["python_env"])
            return out
        except ExecutionError as exc:
            return ExecOutcome("error", error=str(exc), started_at=started, finished_at=self.clock())
        except asyncio.CancelledError:
            r = self.state.running.get(a.task_id)
            if r is None or r.cancel_reason is None:
                raise
            return ExecOutcome("cancelled", error=r.cancel_reason, started_at=started, finished_at=self.clock())
        except Exception as exc:  # preparing the task (its bundle's tree, say) or running it broke: its error
            log.exception("task %s (attempt %d) failed on this worker", a.task_id, a.attempt)
            return ExecOutcome("error", output={"retryable": False}, error=_failed(exc), started_at=started,
                               finished_at=self.clock())

    @contextlib.asynccontextmanager
    async def _shipped(self, a: m.TaskAssignment) -> AsyncIterator[dict[str, Any]]:
        """The shipped fields of bundle task ``a`` (``ShippedCode.task``), held while the block runs."""
        assert a.bundle is not None
        cred = await self.credentials.current()
        cfg = a.config if isinstance(a.config, dict) else {}
        keeps = cfg.get("write_bytecode") is not False  # the session writes byte code: kept for the next
        async with self.shipped.task(a.type, a.task_id, self.candidates.current, cred, a.bundle, a.python,
                                     session_of=(a.submitted_by or "") if keeps else None) as fields:
            yield fields

    # ---------------------------------------------------------------- recovery

    async def recovery_report(self) -> None:
        """At start: what an earlier run left behind. With ``recover`` the tasks that were
        running when it died are reported as retryable errors (sent after registration)."""
        interrupted = await self.result_store.take_interrupted()
        names = ", ".join(f"{r.task_id} (attempt {r.attempt})" for r in interrupted)
        if not self.config.recover:
            if interrupted:
                log.warning("%d task(s) were running when this worker last died: %s; not reported "
                            "(start with --recover to report them)", len(interrupted), names)
            return
        unacked = await self.result_store.unacked()
        now = self.clock()
        for r in interrupted:
            await self.result_store.add(m.TaskResult(
                task_id=r.task_id, attempt=r.attempt, status="error", started_at=r.started_at, finished_at=now,
                output={"retryable": True}, error="interrupted by a worker crash", worker_id=self.config.worker_id))
        log.warning("recovery: %d unacknowledged result(s) to re-send; %d task(s) interrupted by a worker crash%s",
                    len(unacked), len(interrupted), f" (reported as errors): {names}" if interrupted else "")


async def _bounded(status: m.ResultStatus, output: dict[str, Any], error: str | None
                   ) -> tuple[m.ResultStatus, dict[str, Any], str | None]:
    """``core.output.bound``, in a thread when the output is large."""
    return await asyncio.to_thread(bound, status, output, error) if large(output) else bound(status, output, error)


def _failed(exc: BaseException) -> str:
    """The error of a task this worker failed to prepare or run: what broke, in one line."""
    return cut(f"the worker failed to prepare or run the task: {type(exc).__name__}: {exc}", MAX_ERROR_CHARS)


_INSTRUCTIONS: dict[type[Any], Callable[[Runs, Instruction], asyncio.Future[None] | None]] = {
    Send: Runs._do_send,
    Start: Runs._do_start,
    Kill: Runs._do_kill,
    Withdraw: Runs._do_withdraw,
    Keep: Runs._do_keep,
    Settle: Runs._do_settle,
    Forget: Runs._do_forget,
    ResendKept: Runs._do_resend_kept,
    RecordStarted: Runs._do_record_started,
    RecordFinished: Runs._do_record_finished,
    FlushSoon: Runs._do_flush_soon,
    ArmHold: Runs._do_arm_hold,
    DisarmHold: Runs._do_disarm_hold,
    Warn: Runs._do_warn,
}
