"""The pure ``CoordinatorState`` driven by hand, for the unit tests beside this module: each event
goes in with ``now`` passed in, the commands come out, and every ``Save`` among them is kept in a
journal (what a store would hold). As the runtime does once records are durable (here at once),
the tasks a call finished are retired (``state.retire``), so a small ``Policy.finished_cache``
makes them leave memory; ``snapshot`` is what a store gives at start (the active tasks) and
``stored`` the rows a store reads back for ``state.load``. Imported as ``from sim import ...`` (pytest puts this folder on
``sys.path``, as for the ``*_support`` modules elsewhere under tests/)."""

from __future__ import annotations

from collections import Counter
from typing import Any, TypeVar

from distributed_testing.coordinator.core.commands import Command, Save, Send
from distributed_testing.coordinator.core.policy import Policy
from distributed_testing.coordinator.core.rows import Snapshot, TaskRow, WorkerRow
from distributed_testing.coordinator.core.state import CoordinatorState
from distributed_testing.coordinator.store.base import TERMINAL
from distributed_testing.protocol import messages as m
from distributed_testing.tasks import spec as specs

T0 = 1_000.0

R = TypeVar("R")


def sent(cmds: list[Command], kind: type) -> list[tuple[str, Any]]:
    """(worker, message) for every message of ``kind`` in ``cmds``, in order."""
    return [(c.worker_id, c.msg) for c in cmds if isinstance(c, Send) and isinstance(c.msg, kind)]


def saved(cmds: list[Command], kind: type[R]) -> list[R]:
    """Every record of ``kind`` (``TaskRow``, ``ResultRow``, ...) that ``cmds`` save, in order."""
    return [c.record for c in cmds if isinstance(c, Save) and isinstance(c.record, kind)]


class Sim:
    """The state machine plus a journal of every Save it asked for (what a store would hold)."""

    def __init__(self, policy: Policy) -> None:
        self.state = CoordinatorState(policy)
        self.journal: list[Any] = []
        self.sessions: dict[str, str] = {}
        self._n = 0

    def run(self, cmds: list[Command]) -> list[Command]:
        """Journal the saves among ``cmds`` (the result of any event), retire the tasks they
        finished, and return them."""
        records = [c.record for c in cmds if isinstance(c, Save)]
        self.journal += records
        self.state.retire(r.task_id for r in records if isinstance(r, TaskRow) and r.state in TERMINAL)
        self.check_invariants()
        return cmds

    def check_invariants(self) -> None:
        """Called after every event; a subclass asserts what must hold between any two."""

    def submit(self, *items: specs.TaskSpec, now: float = T0) -> tuple[list[dict[str, Any]], list[Command]]:
        accepted, cmds = self.state.submit(list(items), now)
        return accepted, self.run(cmds)

    def register(self, reg: m.Register, now: float = T0, key_id: str | None = None) -> list[Command]:
        """A session of ``key_id`` (default: the worker's own key, ``key-<worker id>``) registers."""
        self._n += 1
        self.sessions[reg.worker_id] = f"s{self._n}"
        key = key_id or f"key-{reg.worker_id}"
        return self.run(self.state.register(reg, self.sessions[reg.worker_id], now, key_id=key))

    def disconnect(self, worker_id: str, now: float) -> list[Command]:
        return self.run(self.state.disconnect(worker_id, self.sessions[worker_id], now))

    def started(self, worker_id: str, task_id: str, attempt: int, now: float = T0) -> list[Command]:
        return self.run(self.state.started(worker_id, m.TaskStarted([m.TaskRef(task_id, attempt)], now), now))

    def results(self, worker_id: str, msg: m.Results, now: float = T0) -> list[Command]:
        return self.run(self.state.results(worker_id, msg, now))

    def cancel(self, task_id: str, now: float = T0) -> list[Command]:
        return self.run(self.state.cancel(task_id, now))

    def tick(self, now: float) -> list[Command]:
        return self.run(self.state.tick(now))

    def heartbeat(
        self, worker_id: str, state: str = "ready", now: float = T0, reason: str | None = None
    ) -> list[Command]:
        hb = m.Heartbeat(state, [], 1.0, 1.0, 1, reason)
        return self.run(self.state.heartbeat(worker_id, hb, now))

    def task(self, task_id: str) -> Any:
        """The task, read back from the journal when it has left memory (as the runtime would)."""
        self.state.load(self.stored(self.state.missing([task_id])))
        return self.state.get(task_id)

    def rows(self) -> dict[str, TaskRow]:
        """The last saved row of every task."""
        return {r.task_id: r for r in self.journal if isinstance(r, TaskRow)}

    def stored(self, task_ids: list[str]) -> list[TaskRow]:
        """What ``Store.get_tasks(task_ids)`` returns."""
        rows = self.rows()
        return [rows[t] for t in task_ids if t in rows]

    def running(self, worker_id: str) -> set[str]:
        """The tasks the coordinator counts against ``worker_id``'s slots."""
        return set(self.state.workers[worker_id].view.running)

    def snapshot(self) -> Snapshot:
        """What a store's ``open`` returns (``Snapshot``'s contract): the last saved row of every
        active task in ``seq`` order, every worker, the count of tasks by state, the largest seq."""
        tasks = self.rows()
        workers: dict[str, WorkerRow] = {r.worker_id: r for r in self.journal if isinstance(r, WorkerRow)}
        active = sorted((r for r in tasks.values() if r.state not in TERMINAL), key=lambda r: r.seq)
        return Snapshot(tasks=active, workers=list(workers.values()),
                        task_counts=dict(Counter(r.state for r in tasks.values())),
                        max_seq=max((r.seq for r in tasks.values()), default=0))
