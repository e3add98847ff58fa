"""The worker's bookkeeping: events in, instructions out. Pure: no awaits, no clock, no sockets.

What a worker knows about its attempts lives here, and only here: which attempts it holds (and in
which run, a batch sharing one), which runs have started and which wait for a slot (the
coordinator may send tasks ahead of the worker's slots: pipelining), which assignments are still *provisional* (sent before the
coordinator's record was durable, see ``AssignTasks.provisional``), the ``started``
announcements and results waiting to go out, the results sent before their confirm, and the
attempts abandoned because their session ended first. ``worker/agent.py`` is the shell: it feeds the
events below and executes the instructions they return, in order.

Events (one method each): ``assign``, ``announce`` (a task ran past the ``started`` delay),
``finished``, ``run_ended`` (a run's coroutine is over: its slot is free), ``flush`` (the end of
the loop iteration a ``FlushSoon`` asked for), ``hold_expired``, ``registered``, ``ack``,
``confirm``, ``cancel``, ``take_back``, ``session_ended``, ``hand_back`` / ``handed_back`` (a
drain's leftovers), ``closing`` (the worker stops); of a chain (``Start.chained``): ``began`` (its
child reported on an attempt), ``skipped`` (its child skipped one: it never began), ``unstarted``
(the chain stopped before these). Time is passed in where a message carries it.

Instructions: :class:`Send` a message; :class:`Start` / :class:`Kill` a run (one executor call,
started only while fewer than ``slots`` runs are under way, in the order assigned; a killed run
reports nothing unless its attempt was cancelled by the coordinator, see ``cancel``; a chain's
one attempt: ``Kill.task_id``); :class:`Withdraw` a chained attempt that has not begun (a
take-back); :class:`Keep` a result in the result store until acknowledged, :class:`Forget` the
acknowledged ones, :class:`Settle` (record as acknowledged) the ones acknowledged before they were kept, :class:`ResendKept` everything kept (after registering); :class:`RecordStarted`
/ :class:`RecordFinished` running attempts in the result store (for ``--recover``); :class:`FlushSoon`
(call ``flush`` once the current loop iteration is done, so everything finished meanwhile goes in
one message); :class:`ArmHold` / :class:`DisarmHold` the result hold (``hold_expired`` after it);
:class:`Warn`: log a warning (this module logs nothing itself).

Contracts kept here (docs/protocol.md, "Provisional assignments"):

* an unconfirmed attempt's ``started`` is held until its confirm, and its result is sent at once
  but kept for a re-send only once confirmed (or settled by an ack, which proves it durable);
* a session that ends before the confirm abandons its unconfirmed attempts: they are killed, their
  results dropped, and they are named in the next ``register`` (``abandoned``);
* a newer attempt of a task supersedes the one running here, which is stopped and reports nothing;
* only one ``results`` message waits for its ack at a time: results finished meanwhile are held
  and sent together when the ack comes or the hold ends;
* a run waiting for a slot has not started: a ``take_back`` drops it (it never starts here, and
  the answer says so, so the coordinator may give the task to another worker as a new attempt);
  a run that has started is never dropped by a ``take_back``, and its result is reported as usual;
  an attempt waiting in a chain is answered only once its child skipped it (``dropped``) or began
  it (``kept``), so it never runs here after the coordinator was told it would not.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ...protocol import messages as m

Key = tuple[str, int]  # (task id, attempt)
# A chain (``Start.chained``) holds at most this many tasks, and about this many seconds of them by
# the type's ``pace``: a task queued behind a chain member that runs long waits at most that member
# out (it counts as started, so a ``take_back`` keeps it), and chains form only of tasks known short.
CHAIN_MAX = 32
CHAIN_BUDGET_S = 0.005


@dataclass(frozen=True, slots=True)
class Send:
    msg: m.Message


@dataclass(frozen=True, slots=True)
class Start:
    """Run these assignments as run ``run``: one executor call (a batch when ``batched``; a chain
    when ``chained``: queued tasks handed to one pool child in one exchange, run one after another
    in this one slot, each with its own result and limits)."""

    run: int
    assignments: tuple[m.TaskAssignment, ...]
    batched: bool = False
    chained: bool = False


@dataclass(frozen=True, slots=True)
class Kill:
    """Stop run ``run`` (its children with it); with ``task_id``, a chain's one attempt only (not
    begun: skipped; running: its child is killed, and what had not begun comes back as
    ``unstarted``)."""

    run: int
    task_id: str | None = None


@dataclass(frozen=True, slots=True)
class Withdraw:
    """Ask chain ``run``'s child to skip ``task_id``'s attempt if it has not begun (a take-back):
    never kills. The chain then reports it ``skipped`` or runs it as usual."""

    run: int
    task_id: str


@dataclass(frozen=True, slots=True)
class Keep:
    """Write ``result`` to the result store: it is re-sent after a reconnect until acknowledged."""

    result: m.TaskResult


@dataclass(frozen=True, slots=True)
class Forget:
    """The coordinator has these results on disk: drop them from the result store."""

    refs: list[m.TaskRef]


@dataclass(frozen=True, slots=True)
class Settle:
    """These results were acknowledged before they were kept (their confirm came with or after the
    ack): write them to the result store's history as acknowledged, never to be re-sent."""

    results: list[m.TaskResult]


@dataclass(frozen=True, slots=True)
class ResendKept:
    """Send every result the result store keeps (just registered: they were never acknowledged)."""


@dataclass(frozen=True, slots=True)
class RecordStarted:
    refs: list[m.TaskRef]


@dataclass(frozen=True, slots=True)
class RecordFinished:
    refs: list[m.TaskRef]


@dataclass(frozen=True, slots=True)
class FlushSoon:
    """Call ``flush`` once the current loop iteration is done."""


@dataclass(frozen=True, slots=True)
class ArmHold:
    """Call ``hold_expired`` after the result hold (``runs.RESULT_HOLD_S``) unless disarmed."""


@dataclass(frozen=True, slots=True)
class DisarmHold:
    pass


@dataclass(frozen=True, slots=True)
class Warn:
    """Log ``text`` as a warning (something the operator should know; it changes nothing here)."""

    text: str


Instruction = (Send | Start | Kill | Withdraw | Keep | Forget | Settle | ResendKept | RecordStarted | RecordFinished | FlushSoon | ArmHold
               | DisarmHold | Warn)


@dataclass(slots=True)
class Attempt:
    """An attempt running here: its assignment, the run it belongs to, and the coordinator's
    cancel reason once it asked (a run stopped with a reason reports ``cancelled``)."""

    assignment: m.TaskAssignment
    run: int
    cancel_reason: str | None = None


@dataclass(slots=True)
class WorkerState:
    """``batch_types``: the task types whose executor runs a batch in one call; a batched
    assignment of another type runs task by task. ``slots``: runs under way at once
    (``--max-concurrent-tasks``); later ones wait in ``queued``, in the order assigned."""

    batch_types: frozenset[str] = frozenset()
    slots: int = 1
    chain_types: frozenset[str] = frozenset()  # task types whose executor runs a chain (``Start.chained``)
    running: dict[str, Attempt] = field(default_factory=dict)  # every attempt held here, by task id
    queued: dict[int, Start] = field(default_factory=dict)  # runs waiting for a slot, in order (not started)
    active: set[int] = field(default_factory=set)  # runs started and not ended
    closed: bool = False  # the worker stops: nothing more starts
    # Provisional attempts, by key: their number (confirmed by a ``confirm`` with upto >= it),
    # their held ``started`` announcements, and their results sent but not yet kept.
    unconfirmed: dict[Key, int] = field(default_factory=dict)
    quiet_started: set[Key] = field(default_factory=set)
    unlogged: dict[Key, m.TaskResult] = field(default_factory=dict)
    abandoned: list[m.TaskRef] = field(default_factory=list)  # told to the coordinator in the next ``register``
    started_buf: list[m.TaskRef] = field(default_factory=list)
    result_buf: list[m.TaskResult] = field(default_factory=list)
    unacked_sent: set[Key] = field(default_factory=set)  # the last ``results`` message, until acked
    holding: bool = False  # a hold is armed (ArmHold given, not yet expired or disarmed)
    flush_due: bool = False  # a FlushSoon was given and its ``flush`` has not come yet
    runs: int = 0  # runs started so far (run ids)
    chains: set[int] = field(default_factory=set)  # active runs that are chains
    withdrawing: set[Key] = field(default_factory=set)  # chained attempts asked back, the answer not yet known
    # per task type (a custom task's: per handler, ``pace_key``): a duration estimate (seconds) that
    # rises at once with a long task and decays slowly; a chain holds about CHAIN_BUDGET_S of such
    # tasks (none until one has finished)
    pace: dict[str, float] = field(default_factory=dict)

    # ------------------------------------------------------------------ queries

    def attempt(self, task_id: str, attempt: int) -> Attempt | None:
        """What runs here for this attempt (None when this task runs another attempt, or none)."""
        r = self.running.get(task_id)
        return r if r is not None and r.assignment.attempt == attempt else None

    def running_refs(self) -> list[m.TaskRef]:
        return [m.TaskRef(tid, r.assignment.attempt) for tid, r in self.running.items()]

    # ------------------------------------------------------------------- events

    def assign(self, msg: m.AssignTasks) -> list[Instruction]:
        """Start the attempts newer than what runs here (an older attempt of the same task is
        killed: the coordinator gave up on it); attempts already running, or older, are ignored."""
        fresh = [a for a in msg.tasks
                 if a.task_id not in self.running or self.running[a.task_id].assignment.attempt < a.attempt]
        out: list[Instruction] = []
        for a in fresh:
            old = self.running.get(a.task_id)
            if old is not None:
                out.append(Warn(f"task {a.task_id}: attempt {a.attempt} supersedes attempt {old.assignment.attempt} "
                                "still running here; stopping that one"))
                out += self._drop(a.task_id)
            if msg.provisional:
                self.unconfirmed[(a.task_id, a.attempt)] = msg.provisional
        if not fresh:
            return out
        if msg.batch_id and len(fresh) > 1 and len({a.type for a in fresh}) == 1 and fresh[0].type in self.batch_types:
            self._queue(fresh, batched=True)
        else:
            for a in fresh:
                self._queue([a])
        return out + self._admit()

    def _queue(self, group: list[m.TaskAssignment], batched: bool = False) -> None:
        self.runs += 1
        for a in group:
            self.running[a.task_id] = Attempt(a, self.runs)
        self.queued[self.runs] = Start(self.runs, tuple(group), batched)

    def _admit(self) -> list[Instruction]:
        """Start queued runs, oldest first, while a slot is free; a run of one chainable task takes
        the chainable runs queued right behind it along (``_chain``)."""
        out: list[Instruction] = []
        while self.queued and len(self.active) < self.slots and not self.closed:
            run = next(iter(self.queued))
            start = self.queued.pop(run)
            if self.chain_types and (longer := self._chain(start)) is not None:
                start = longer
                self.chains.add(run)
            out.append(start)
            self.active.add(run)
        return out

    def _chain(self, start: Start) -> Start | None:
        """``start`` with the queued runs behind it that can share its pool child, in order: each
        one task of a chainable type (no bundle, no gang) with the same type and memory limit. How
        many: what ``pace`` says fits in CHAIN_BUDGET_S (at most CHAIN_MAX), and no more than
        this slot's share of the queue (the other free slots get theirs). None: no chain."""
        first = start.assignments[0]
        if start.batched or len(start.assignments) != 1 or not _chainable(first, self.chain_types):
            return None
        estimate = self.pace.get(pace_key(first))
        if estimate is None:
            return None
        free = self.slots - len(self.active)
        limit = min(CHAIN_MAX, int(CHAIN_BUDGET_S / max(estimate, 1e-6)), -(-(len(self.queued) + 1) // free))
        group = [first]
        for nxt in self.queued.values():
            if len(group) >= limit:
                break
            a = nxt.assignments[0]
            if (nxt.batched or len(nxt.assignments) != 1 or pace_key(a) != pace_key(first)
                    or a.max_memory_mb != first.max_memory_mb or not _chainable(a, self.chain_types)):
                break
            group.append(a)
        if len(group) == 1:
            return None
        for a in group[1:]:
            del self.queued[self.running[a.task_id].run]
            self.running[a.task_id].run = start.run
        return Start(start.run, tuple(group), chained=True)

    def unstarted(self, run: int, refs: list[m.TaskRef]) -> list[Instruction]:
        """These attempts of chain ``run`` never began (the chain stopped before them: a timeout,
        a cancel or a crash of the one before): they wait again at the front of the queue, in
        order, each its own run (admitted when ``run`` ends)."""
        front: dict[int, Start] = {}
        out: list[Instruction] = []
        for ref in refs:
            r = self.attempt(ref.task_id, ref.attempt)
            if r is None or r.run != run:
                continue
            if (ref.task_id, ref.attempt) in self.withdrawing:  # asked back, and it never began: dropped
                self.withdrawing.discard((ref.task_id, ref.attempt))
                del self.running[ref.task_id]
                self.unconfirmed.pop((ref.task_id, ref.attempt), None)
                self.quiet_started.discard((ref.task_id, ref.attempt))
                out.append(Send(m.TakenBack([ref], [])))
                continue
            self.runs += 1
            r.run = self.runs
            front[self.runs] = Start(self.runs, (r.assignment,))
        if front:
            self.queued = {**front, **self.queued}
        return out

    def _drop(self, task_id: str) -> list[Instruction]:
        """Stop holding ``task_id``'s attempt: a queued one leaves its run (never started), a
        started run is killed once no other attempt shares it. It reports nothing."""
        r = self.running.pop(task_id)
        start = self.queued.get(r.run)
        if start is not None:
            rest = tuple(a for a in start.assignments if a.task_id != task_id)
            if rest:
                self.queued[r.run] = replace(start, assignments=rest)
            else:
                del self.queued[r.run]
            return []
        if r.run in self.chains:  # the chain runs on without it
            return [Kill(r.run, task_id)]
        if any(o.run == r.run for o in self.running.values()):  # a batch runs on
            return []
        return [Kill(r.run)]

    def run_ended(self, run: int) -> list[Instruction]:
        """Run ``run`` is over (finished, killed or failed): its slot goes to the next queued run."""
        self.active.discard(run)
        self.chains.discard(run)
        return self._admit()

    def take_back(self, msg: m.TakeBack) -> list[Instruction]:
        """The coordinator wants these attempts back if they have not started: each still waiting
        for a slot is dropped (never started here, so nothing is ever reported for it); the answer
        lists the rest as kept (started here, finished, or not held: their results stand)."""
        dropped: list[m.TaskRef] = []
        kept: list[m.TaskRef] = []
        withdraw: list[Instruction] = []
        for ref in msg.tasks:
            r = self.attempt(ref.task_id, ref.attempt)
            key = (ref.task_id, ref.attempt)
            if r is not None and r.run in self.queued:
                self._forget_unbegun(ref)
                dropped.append(ref)
            elif r is not None and r.run in self.chains and key not in self.withdrawing:
                self.withdrawing.add(key)  # answered once the chain's child says whether it began it
                withdraw.append(Withdraw(r.run, ref.task_id))
            else:
                kept.append(ref)
        return ([Send(m.TakenBack(dropped, kept))] if dropped or kept or not withdraw else []) + withdraw

    def _forget_unbegun(self, ref: m.TaskRef) -> None:
        self._drop(ref.task_id)
        key = (ref.task_id, ref.attempt)
        self.unconfirmed.pop(key, None)
        self.quiet_started.discard(key)

    def skipped(self, run: int, ref: m.TaskRef, now: float) -> list[Instruction]:
        """Chain ``run``'s child skipped this attempt: it never began. Asked back, it is dropped
        (the answer: ``dropped``); cancelled, it reports ``cancelled``; else it waits again."""
        key = (ref.task_id, ref.attempt)
        r = self.attempt(ref.task_id, ref.attempt)
        if r is None:
            self.withdrawing.discard(key)
            return []
        if key in self.withdrawing:
            self.withdrawing.discard(key)
            if r.cancel_reason is None:
                del self.running[ref.task_id]
                self.unconfirmed.pop(key, None)
                self.quiet_started.discard(key)
                return [Send(m.TakenBack([ref], []))]
            out: list[Instruction] = [Send(m.TakenBack([], [ref]))]
        else:
            out = []
        if r.cancel_reason is not None:
            return out + self.finished(m.TaskResult(task_id=ref.task_id, attempt=ref.attempt, status="cancelled",
                                                    started_at=now, finished_at=now, error=r.cancel_reason))
        return out + self.unstarted(run, [ref])

    def began(self, ref: m.TaskRef) -> list[Instruction]:
        """A chained attempt began (its chain reported on it): if it was asked back, the answer is
        ``kept``."""
        key = (ref.task_id, ref.attempt)
        if key not in self.withdrawing:
            return []
        self.withdrawing.discard(key)
        return [Send(m.TakenBack([], [ref]))]

    def closing(self) -> None:
        """The worker stops: no queued run starts any more (the attempts stay held, so they are
        recorded as interrupted like the running ones)."""
        self.closed = True
        self.queued.clear()

    def announce(self, ref: m.TaskRef) -> list[Instruction]:
        """``ref`` is running past the ``started`` delay (a batch: at once): announce it, unless
        it stopped meanwhile (it never started, as far as anyone knows) or is unconfirmed (then
        announced by its confirm)."""
        if self.attempt(ref.task_id, ref.attempt) is None:
            return []
        if (ref.task_id, ref.attempt) in self.unconfirmed:
            self.quiet_started.add((ref.task_id, ref.attempt))
            return []
        self.started_buf.append(ref)
        return self._flush_soon()

    def finished(self, result: m.TaskResult) -> list[Instruction]:
        """An attempt's run ended with ``result``: sent at once, and kept in the result store unless
        unconfirmed (the coordinator journals a result after its assignment, so it is durable
        only once the assignment is: kept only once confirmed, never re-sent unconfirmed).
        Nothing is reported for an attempt no longer running here (abandoned, superseded or
        handed back)."""
        key = (result.task_id, result.attempt)
        if self.attempt(*key) is None:
            return []
        done = self.running.pop(result.task_id)
        if done.assignment.type in self.chain_types:
            self._observe(pace_key(done.assignment), result.finished_at - result.started_at)
        self.result_buf.append(result)
        out = self._flush_soon()
        if key in self.unconfirmed:
            self.unlogged[key] = result
            return out
        ref = m.TaskRef(*key)
        out += [RecordFinished([ref]), Keep(result)]
        return out

    def _observe(self, key: str, seconds: float) -> None:
        """A task of ``key`` (``pace_key``) took ``seconds``: a longer one than the estimate
        replaces it at once (chains shrink before the next admission), a shorter one moves it a
        fifth of the way."""
        seconds = max(0.0, seconds)
        old = self.pace.get(key)
        self.pace[key] = seconds if old is None or seconds > old else old + (seconds - old) * 0.2

    def flush(self, now: float) -> list[Instruction]:
        """Send the ``started`` announcements and results gathered since the last flush; results
        wait (a hold is armed) while the previous ``results`` message is unacknowledged."""
        self.flush_due = False
        out: list[Instruction] = []
        if self.started_buf:
            out += [Send(m.TaskStarted(self.started_buf, now)), RecordStarted(self.started_buf)]
            self.started_buf = []
        if self.result_buf:
            if self.unacked_sent:
                if not self.holding:
                    self.holding = True
                    out.append(ArmHold())
                return out
            out += self._end_hold()
            self.unacked_sent = {(r.task_id, r.attempt) for r in self.result_buf}
            out.append(Send(m.Results(self.result_buf)))
            self.result_buf = []
        return out

    def hold_expired(self, now: float) -> list[Instruction]:
        """The ack did not come within the hold (the coordinator is slow, or holds a gang
        member's ack until the whole gang reports): send what waits anyway."""
        self.holding = False
        self.unacked_sent.clear()
        return self.flush(now)

    def registered(self) -> list[Instruction]:
        """A session is established: the abandoned attempts are told (in its ``register``), every
        kept result is re-sent, and the results waiting in the buffer go with them (each is kept)."""
        self.abandoned = []
        out = self._end_hold()
        self.result_buf = []
        out.append(ResendKept())
        return out

    def ack(self, msg: m.ResultAck) -> list[Instruction]:
        """These results are durable at the coordinator, and so are their assignments: an
        unlogged one is settled (never kept for a re-send, only recorded in the result store's
        history as acknowledged); then ``confirm_upto`` applies."""
        settled: list[m.TaskResult] = []
        for r in msg.tasks if self.unlogged else ():
            key = (r.task_id, r.attempt)
            if (done := self.unlogged.pop(key, None)) is not None:
                settled.append(done)
                self.unconfirmed.pop(key, None)
                self.quiet_started.discard(key)
        out: list[Instruction] = [Settle(settled)] if settled else []
        if msg.confirm_upto:
            out += self.confirm(msg.confirm_upto)
        out.append(Forget(msg.tasks))
        if self.unacked_sent:
            self.unacked_sent.difference_update((r.task_id, r.attempt) for r in msg.tasks)
            if not self.unacked_sent and self.result_buf:
                out += self._flush_soon()
        return out

    def confirm(self, upto: int) -> list[Instruction]:
        """Provisional assignments up to ``upto`` are on the coordinator's disk: announce the ones
        still running, and keep the results already sent until acknowledged."""
        out: list[Instruction] = []
        for key, n in list(self.unconfirmed.items()):
            if n > upto:
                continue
            del self.unconfirmed[key]
            if key in self.quiet_started:
                self.quiet_started.discard(key)
                out += self.announce(m.TaskRef(*key))
            sent = self.unlogged.pop(key, None)
            if sent is not None:
                out.append(Keep(sent))
        return out

    def cancel(self, msg: m.Cancel, now: float) -> list[Instruction]:
        """The coordinator cancels this attempt: its run is killed and reports ``cancelled``; one
        still waiting for a slot never starts and reports ``cancelled`` at once."""
        r = self.attempt(msg.task.task_id, msg.task.attempt)
        if r is None:
            return []
        r.cancel_reason = msg.reason
        if r.run not in self.queued:
            return [Kill(r.run, msg.task.task_id) if r.run in self.chains else Kill(r.run)]
        start = self.queued[r.run]
        rest = tuple(a for a in start.assignments if a.task_id != msg.task.task_id)
        if rest:
            self.queued[r.run] = replace(start, assignments=rest)
        else:
            del self.queued[r.run]
        return self.finished(m.TaskResult(task_id=msg.task.task_id, attempt=msg.task.attempt, status="cancelled",
                                          started_at=now, finished_at=now, error=msg.reason))

    def session_ended(self) -> list[Instruction]:
        """The session ended before these provisional assignments were confirmed: the coordinator
        may have lost them in a crash, so they are stopped and their results dropped, never sent
        again (if it did not lose them, it either has the result already or finds the attempt
        missing when this worker registers again and requeues it)."""
        self.withdrawing.clear()  # asked on that session: the next register says what is still held
        if not self.unconfirmed:
            return []
        out: list[Instruction] = [Warn(f"session ended before {len(self.unconfirmed)} provisional assignment(s) were "
                                       f"confirmed; abandoning them: {', '.join(f'{t}#{a}' for t, a in self.unconfirmed)}")]
        for task_id, attempt in self.unconfirmed:
            self.abandoned.append(m.TaskRef(task_id, attempt))
            if self.attempt(task_id, attempt) is not None:
                for kill in self._drop(task_id):  # so the killed run reports nothing
                    if kill not in out:
                        out.append(kill)
        self.result_buf = [r for r in self.result_buf if (r.task_id, r.attempt) not in self.unlogged]
        self.unconfirmed.clear()
        self.unlogged.clear()
        self.quiet_started.clear()
        return out

    def hand_back(self) -> tuple[list[m.TaskRef], list[Kill]]:
        """A drain's deadline passed: the attempts still running, and the kills that stop them.
        They stay running here (a cancelled one may still report) until ``handed_back``."""
        refs = self.running_refs()
        self.queued.clear()  # never to start: handed back with the rest
        return refs, [Kill(run) for run in dict.fromkeys(r.run for r in self.running.values()) if run in self.active]

    def handed_back(self, refs: list[m.TaskRef]) -> list[Instruction]:
        """Their runs have stopped: forget them (stopped on purpose, so not a crash to recover)."""
        for ref in refs:
            if self.attempt(ref.task_id, ref.attempt) is not None:
                del self.running[ref.task_id]
        return [RecordFinished(refs)] if refs else []

    # ------------------------------------------------------------------ helpers

    def _flush_soon(self) -> list[Instruction]:
        if self.flush_due:
            return []
        self.flush_due = True
        return [FlushSoon()]

    def _end_hold(self) -> list[Instruction]:
        self.unacked_sent.clear()
        if not self.holding:
            return []
        self.holding = False
        return [DisarmHold()]


def pace_key(a: m.TaskAssignment) -> str:
    """What a duration estimate (``pace``) and a chain's members share: the task type, and for a
    custom task its handler (``config.name``), since one handler's pace says nothing of another's:
    60 no-ops must not chain behind a ``sleep`` of 120 s, where a take-back could not move them."""
    name = a.config.get("name") if a.type == "custom" else None
    return f"{a.type}:{name}" if isinstance(name, str) else a.type


def _chainable(a: m.TaskAssignment, types: frozenset[str]) -> bool:
    return a.type in types and a.bundle is None and a.gang is None
