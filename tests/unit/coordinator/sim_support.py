"""The pure ``CoordinatorState`` driven by hand, for the unit tests beside this module: each event
goes in with ``now`` passed in, the commands come out, and every ``Save`` among them is kept in a
journal (what a store would hold). Imported as ``from sim import ...`` (pytest puts this folder on
``sys.path``, as for the ``*_support`` modules elsewhere under tests/)."""

from __future__ import annotations

from typing import Any, TypeVar

from distributed_testing.coordinator.state import Command, CoordinatorState, Policy, Save, Send
from distributed_testing.coordinator.store.base import Snapshot, TaskRow, WorkerRow
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
        """Journal the saves among ``cmds`` (the result of any event) and return them."""
        self.journal += [c.record for c in cmds if isinstance(c, Save)]
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
        return self.state.get(task_id)

    def running(self, worker_id: str) -> set[str]:
        """The tasks the coordinator counts against ``worker_id``'s slots."""
        return set(self.state.workers[worker_id].view.running)

    def snapshot(self) -> Snapshot:
        """Last saved row per task / worker, as a store would return them."""
        tasks: dict[str, TaskRow] = {}
        workers: dict[str, WorkerRow] = {}
        for r in self.journal:
            if isinstance(r, TaskRow):
                tasks[r.task_id] = r
            elif isinstance(r, WorkerRow):
                workers[r.worker_id] = r
        return Snapshot(tasks=list(tasks.values()), workers=list(workers.values()))
