"""Gang tasks (multi-node DDP training): their part of the state machine, rendezvous ports,
combined results and the scaling-efficiency baseline. Pure: no I/O, no clock.

A ``training`` task is a gang of ``nodes`` members (its kind's ``gang_size``). Its placement, the
members of the current attempt, is the task's :class:`~.entities.Gang`. This module holds the rest:

- :class:`Gangs`: the gang part of :class:`~.state.CoordinatorState`: the gangs waiting and
  placed, reserved all-or-nothing in one dispatch round, ended for every member at once, and
  restored or rejoined after a restart or a member's reconnect (below).
- :class:`PortPool`: the coordinator-chosen rendezvous port, unique per master address among
  running gangs, rotating through the range so a retry gets a different port.
- :func:`success_row` / :func:`attempt_row`: the ONE result row stored per attempt (results
  are keyed by ``(task_id, attempt)``): node 0's output, a ``nodes`` summary and, on success, the
  scaling efficiency against a single-node baseline.
- :class:`Baselines`: the latest succeeded single-node run per (model, global batch, precision),
  rebuilt from task outcomes after a restart.

Gang tasks wait in their own small list and compete with the queue heads in the same order. A gang is reserved all-or-nothing in one dispatch round: its
``nodes`` distinct eligible workers each get one slot, or nothing is held. While it cannot be
placed, later tasks may use the free slots (backfill) until it has waited ``gang_max_wait_s``;
from then on its eligible workers take no new work of lower or equal priority until it fits, unless
fewer eligible workers are connected than it needs (then it holds nothing and says so). Any
member's failure, loss or hand-back ends the attempt for all members (the others get ``Cancel``),
and the gang is requeued whole or ends. Member results are held unacknowledged until the attempt's
single combined result row is saved.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

from ...protocol import messages as m
from ...tasks.states import ACTIVE
from .commands import Command, Notify, Save, Send
from .entities import Gang, Task, Worker
from .placement import WorkerView, pick_gang, shared_gpus, unmet
from .policy import Policy
from .rows import ResultRow

BaselineKey = tuple[str, int, str]  # model, global batch, precision


def scaling_efficiency(multi_node: Mapping[str, Any], single_node: Mapping[str, Any]) -> float:
    """Per-node throughput of ``multi_node`` relative to the single-node baseline (1.0 = linear).

    ``(multi.global_samples_per_s / multi.nnodes) / (single.global_samples_per_s / single.nnodes)``.
    Both must be results of the same model, global batch and precision.
    """
    for key in ("model", "global_batch", "precision"):
        if multi_node.get(key) != single_node.get(key):
            raise ValueError(f"results differ in {key!r}: {multi_node.get(key)!r} vs {single_node.get(key)!r}")
    base = float(single_node["global_samples_per_s"]) / int(single_node["nnodes"])
    if base <= 0:
        raise ValueError("single-node baseline has no throughput")
    return float(multi_node["global_samples_per_s"]) / int(multi_node["nnodes"]) / base


class PortPool:
    """Rendezvous ports in ``[lo, hi]``, unique per master address among running gangs. Each
    address has a cursor that moves past every port handed out, so a retried attempt (whose
    rank 0 may have failed to bind its port) gets the next free one."""

    def __init__(self, lo: int, hi: int) -> None:
        if not 0 < lo <= hi < 65536:
            raise ValueError(f"gang port range {lo}-{hi} is not within 1..65535")
        self.lo, self.hi = lo, hi
        self._used: dict[str, set[int]] = {}
        self._next: dict[str, int] = {}

    def take(self, addr: str) -> int | None:
        """A free port for ``addr`` (None: every port of the range is held by a running gang)."""
        used = self._used.setdefault(addr, set())
        size = self.hi - self.lo + 1
        start = self._next.get(addr, self.lo) - self.lo
        for i in range(size):
            port = self.lo + (start + i) % size
            if port not in used:
                used.add(port)
                self._next[addr] = self.lo + (port - self.lo + 1) % size
                return port
        return None

    def hold(self, addr: str, port: int) -> None:
        """Mark a port in use (restore)."""
        self._used.setdefault(addr, set()).add(port)

    def release(self, addr: str, port: int) -> None:
        used = self._used.get(addr)
        if used is not None:
            used.discard(port)
            if not used:
                del self._used[addr]

    def in_use(self, addr: str) -> frozenset[int]:
        return frozenset(self._used.get(addr, ()))


# ------------------------------------------------------------------ results


def training_summary(output: Mapping[str, Any]) -> dict[str, Any] | None:
    """The fields of node 0's ``output["metrics"]`` that scaling efficiency compares, or None when
    the document lacks them (the worker's output is data, never trusted to be well formed)."""
    metrics = output.get("metrics")
    if not isinstance(metrics, Mapping):
        return None
    try:
        summary: dict[str, Any] = {
            "model": str(metrics["model"]), "global_batch": int(metrics["global_batch"]),
            "precision": str(metrics["precision"]), "nnodes": int(metrics["nnodes"]),
            "global_samples_per_s": float(metrics["global_samples_per_s"])}
    except (KeyError, TypeError, ValueError):
        return None
    return summary if summary["nnodes"] > 0 and math.isfinite(summary["global_samples_per_s"]) else None


def baseline_key(summary: Mapping[str, Any]) -> BaselineKey:
    return (str(summary["model"]), int(summary["global_batch"]), str(summary["precision"]))


class Baselines:
    """The latest succeeded single-node training run per (model, global batch, precision)."""

    def __init__(self) -> None:
        self._by_key: dict[BaselineKey, dict[str, Any]] = {}

    def record(self, task_id: str, attempt: int, summary: Mapping[str, Any], at: float) -> None:
        if summary.get("nnodes") != 1:
            return
        key = baseline_key(summary)
        old = self._by_key.get(key)
        if old is None or at >= old["at"]:
            self._by_key[key] = {"task_id": task_id, "attempt": attempt, "at": at, **summary}

    def lookup(self, summary: Mapping[str, Any]) -> dict[str, Any] | None:
        return self._by_key.get(baseline_key(summary))

    def scaling(self, summary: Mapping[str, Any] | None) -> tuple[float | None, dict[str, Any] | str]:
        """(scaling efficiency, baseline used or the reason there is none) for a run's summary."""
        if summary is None:
            return None, "node 0 reported no training metrics (metrics.global_samples_per_s)"
        what = (f"model {summary['model']!r}, batch_size {summary['global_batch']}, "
                f"precision {summary['precision']!r}")
        if summary["nnodes"] == 1:
            return None, f"this single-node run is the baseline for multi-node runs of {what}"
        base = self.lookup(summary)
        if base is None:
            return None, f"no single-node baseline: run the same task with nodes=1 ({what}) to get one"
        try:
            eff = scaling_efficiency(summary, base)
        except (ValueError, ZeroDivisionError) as exc:
            return None, f"baseline {base['task_id']} unusable: {exc}"
        return round(eff, 6), {k: base[k] for k in ("task_id", "attempt", "global_samples_per_s", "nnodes")}


def nodes_summary(gang: Gang, notes: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One entry per node rank: who ran it, where, for how long and how it ended. A member
    without a result gets status None and ``notes``' word on why."""
    out: list[dict[str, Any]] = []
    for rank, wid in enumerate(gang.members):
        r = gang.held.get(wid)
        entry: dict[str, Any] = {"node_rank": rank, "worker_id": wid,
                                 "address": gang.addresses[rank] if rank < len(gang.addresses) else ""}
        if r is None:
            entry.update(status=None, wall_s=None, error=(notes or {}).get(wid, "no result"))
        else:
            wall = r.output.get("wall_s")
            entry.update(status=r.status, error=r.error,
                         wall_s=float(wall) if isinstance(wall, (int, float)) and not isinstance(wall, bool)
                         else round(r.finished_at - r.started_at, 6))
        out.append(entry)
    return out


def _span(gang: Gang, default: float) -> tuple[float, float]:
    if not gang.held:
        return gang.dispatched_at or default, default
    return (min(r.started_at for r in gang.held.values()), max(r.finished_at for r in gang.held.values()))


def success_row(task_id: str, attempt: int, gang: Gang, baselines: Baselines,
                now: float) -> tuple[ResultRow, dict[str, Any]]:
    """The attempt's one result row when every member succeeded, and the task outcome's extra
    fields (members, throughput, scaling efficiency, the summary a later baseline lookup needs)."""
    rank0 = gang.held[gang.members[0]]
    summary = training_summary(rank0.output)
    eff, baseline = baselines.scaling(summary)
    output = dict(rank0.output)
    if summary is not None:
        output.update(model=summary["model"], precision=summary["precision"], global_batch=summary["global_batch"],
                      global_samples_per_s=summary["global_samples_per_s"])
    output.update(nodes=nodes_summary(gang), scaling_efficiency=eff, scaling_baseline=baseline)
    started, finished = _span(gang, now)
    row = ResultRow(task_id=task_id, attempt=attempt, worker_id=gang.members[0], status="succeeded",
                    started_at=started, finished_at=finished, received_at=now, output=output, task_type="training")
    extra = {"members": list(gang.members), "global_samples_per_s": summary["global_samples_per_s"] if summary else None,
             "scaling_efficiency": eff, "scaling_baseline": baseline, "training": summary}
    return row, extra


def attempt_row(task_id: str, attempt: int, gang: Gang, status: str, cause: str, culprit: str | None,
                notes: Mapping[str, str], now: float) -> ResultRow:
    """The attempt's one result row when it did not succeed: the culprit's own output (when it
    reported one) with the ``nodes`` summary; ``error`` is the cause."""
    r = gang.held.get(culprit or "")
    output = {**(r.output if r is not None else {}), "nodes": nodes_summary(gang, notes)}
    started, finished = _span(gang, now)
    return ResultRow(task_id=task_id, attempt=attempt, worker_id=culprit or (gang.members[0] if gang.members else ""),
                     status=status, started_at=started, finished_at=finished, received_at=now, output=output,
                     error=cause, task_type="training")


class Host(Protocol):
    """What :class:`Gangs` needs of the state machine that owns it (``CoordinatorState``)."""

    policy: Policy
    workers: dict[str, Worker]

    def touch(self, worker_id: str) -> None: ...
    def transition(self, t: Task, new: str, cause: str, now: float, outcome: dict[str, Any] | None = None) -> None: ...
    def requeue(self, t: Task, cause: str, now: float, *, count: bool) -> list[Command]: ...
    def free_slot(self, t: Task) -> None: ...


class Gangs:
    """The gang tasks of one state machine: ``pending`` (ready to dispatch; they wait here, not
    in the requirement queues), ``active`` (assigned or running), their rendezvous ports and the
    single-node ``baselines`` that scaling efficiency is measured against."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.pending: dict[str, Task] = {}
        self.active: dict[str, Task] = {}
        self.ports = PortPool(*host.policy.gang_port_range)
        self.baselines = Baselines()

    def enqueue(self, t: Task, now: float) -> None:
        """``t`` is ready to dispatch from ``now`` (the starvation bound counts from here)."""
        assert t.gang is not None
        t.gang.queued_at, t.gang.protecting = now, False
        self.pending[t.task_id] = t

    def order(self) -> list[Task]:
        """Pending gangs in dispatch order (higher priority first, then FIFO)."""
        for tid in [tid for tid, t in self.pending.items() if t.state != "pending"]:
            del self.pending[tid]
        return sorted(self.pending.values(), key=lambda t: (-t.spec.priority, t.seq))

    def place(self, t: Task, workers: list[WorkerView], now: float) -> list[Command] | None:
        """Reserve one slot on each of ``nodes`` distinct workers and send each its node rank, or
        change nothing (None) when they are not all free now."""
        g = t.gang
        assert g is not None
        chosen = pick_gang(t.key, g.nodes, workers)
        if chosen is None:
            return None
        all_cuda, note = all("cuda" in w.capabilities for w in chosen), ""
        if all_cuda and (shared := shared_gpus(chosen)) and (backend := _backend(t)) != "gloo":
            # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): members that do not
            # share one, else (backend auto) gloo, which runs there; an explicit nccl is sent as
            # asked and fails naming the shared GPU (worker/executors/training.py)
            apart = pick_gang(t.key, g.nodes, workers, distinct_gpus=True)
            if apart is not None:
                chosen = apart
            elif backend == "auto":
                all_cuda = False
                note = f"; backend gloo: the members share GPU {', '.join(shared)}"
        addresses = [self.host.workers[w.worker_id].address for w in chosen]
        port = self.ports.take(addresses[0])
        if port is None:
            return None  # every port of the range is in use on that address; wait for a gang to end
        t.attempt += 1
        g.place([w.worker_id for w in chosen], addresses, port, all_cuda, now)
        t.worker_id, t.slot = chosen[0].worker_id, t.task_id
        for w in chosen:
            w.hold(t.task_id, exclusive=True)
            if w.available_memory_mb is not None and t.key[3]:
                w.available_memory_mb -= t.key[3]
        ranks = ", ".join(f"{wid} (rank {r})" for r, wid in enumerate(g.members))
        self.host.transition(t, "assigned", f"dispatched to gang {ranks}, rendezvous {g.master_addr}:{port}{note}", now)
        t.history[-1]["gang"] = g.record()
        del self.pending[t.task_id]
        self.active[t.task_id] = t
        return [Save(t.row()), *(Send(wid, m.AssignTasks([t.assignment(g.assignment(rank))]))
                                 for rank, wid in enumerate(g.members))]

    def starving(self, t: Task, now: float) -> bool:
        """Past ``gang_max_wait_s`` and placeable in principle (enough eligible workers connected
        and accepting): its eligible workers then take no new lower or equal priority work."""
        g = t.gang
        assert g is not None
        g.protecting = now - g.queued_at >= self.host.policy.gang_max_wait_s and sum(
            1 for w in self.host.workers.values()
            if w.connected and w.view.accepting and w.view.max_concurrent > 0 and not unmet(t.key, w.view)) >= g.nodes
        return g.protecting

    def result(self, t: Task, worker_id: str, r: m.TaskResult, now: float, acked: list[m.TaskRef]) -> list[Command]:
        """A member's result. Held without an ack until the attempt's row is saved; a result of an
        attempt the worker held but that is over is stored and acknowledged (appended to ``acked``)."""
        g = t.gang
        assert g is not None
        if t.state not in ACTIVE or r.attempt != t.attempt or worker_id not in g.members:
            acked.append(m.TaskRef(r.task_id, r.attempt))
            return [Save(ResultRow(
                task_id=r.task_id, attempt=r.attempt, worker_id=worker_id, status=r.status, started_at=r.started_at,
                finished_at=r.finished_at, received_at=now, output=r.output, error=r.error, task_type=t.type))]
        w = self.host.workers.get(worker_id)
        if w is not None:
            w.view.release(t.task_id)  # this node is done
            self.host.touch(worker_id)
        g.held[worker_id] = r
        g.awaiting.pop(worker_id, None)
        if r.status != "succeeded":
            rank = g.members.index(worker_id)
            retry = r.status in ("error", "cancelled") and r.output.get("retryable") is not False
            return self.end(t, now, status="error" if r.status == "cancelled" else r.status,
                            cause=f"node {rank} ({worker_id}) {r.status}: {r.error or 'no reason given'}",
                            culprit=worker_id, retry=retry)
        if len(g.held) < len(g.members):
            return []
        row, extra = success_row(t.task_id, t.attempt, g, self.baselines, now)
        acks = self.acks(t)
        outcome = {"status": "succeeded", "attempt": t.attempt, "worker_id": g.members[0], "error": None,
                   "duration_s": round(row.finished_at - row.started_at, 6), **extra}
        self.host.transition(t, "succeeded", f"all {g.nodes} node(s) succeeded", now, outcome=outcome)
        if extra["training"] is not None:
            self.baselines.record(t.task_id, t.attempt, extra["training"], now)
        self.host.free_slot(t)
        return [Save(row), Save(t.row()), *acks, Notify((t.task_id,))]

    def end(self, t: Task, now: float, *, status: str, cause: str, culprit: str | None, retry: bool,
            count: bool = True) -> list[Command]:
        """End the current attempt of gang ``t`` for every member: save its one result row,
        ``Cancel`` the members still running, acknowledge the held results, free every slot, then
        requeue the whole gang (``retry`` and retries left; ``count=False`` never uses one) or end
        the task as ``status``."""
        g = t.gang
        assert g is not None
        stop = [w for w in g.members if w not in g.held and w != culprit]
        notes = {w: f"stopped: {cause}" for w in stop}
        if culprit is not None and culprit not in g.held:
            notes[culprit] = cause
        cmds: list[Command] = [Save(attempt_row(t.task_id, t.attempt, g, status, cause, culprit, notes, now))]
        cmds += [Send(w, m.Cancel(t.ref(), f"gang attempt {t.attempt} ended: {cause}")) for w in stop]
        acks = self.acks(t)
        if retry and (not count or t.retries_used < t.spec.max_retries):
            return cmds + self.host.requeue(t, cause, now, count=count) + acks
        outcome = {"status": status, "attempt": t.attempt, "worker_id": culprit or t.worker_id, "error": cause,
                   "members": list(g.members)}
        self.host.transition(t, status, cause, now, outcome=outcome)
        self.host.free_slot(t)
        return [*cmds, Save(t.row()), *acks, Notify((t.task_id,))]

    @staticmethod
    def acks(t: Task) -> list[Command]:
        assert t.gang is not None
        return [Send(w, m.ResultAck([m.TaskRef(r.task_id, r.attempt)])) for w, r in t.gang.held.items()]

    def release(self, t: Task) -> None:
        """Free every member's slot and the rendezvous port; the attempt's members are forgotten."""
        g = t.gang
        assert g is not None
        for wid in g.members:
            w = self.host.workers.get(wid)
            if w is not None:
                w.view.release(t.task_id)
                self.host.touch(wid)
        if g.master_port:
            self.ports.release(g.master_addr, g.master_port)
        g.clear()
        t.slot = ""
        self.active.pop(t.task_id, None)

    def member_lost(self, worker_id: str, cause: str, now: float) -> list[Command]:
        cmds: list[Command] = []
        for t in list(self.active.values()):
            g = t.gang
            assert g is not None
            if worker_id in g.members and worker_id not in g.held:
                cmds += self.end(t, now, status="error", cause=f"node {g.members.index(worker_id)}: {cause}",
                                 culprit=worker_id, retry=True)
        return cmds

    def deadlines(self, now: float) -> list[Command]:
        """Fail attempts whose member re-registered without the task and sent no result in time."""
        cmds: list[Command] = []
        for t in list(self.active.values()):
            g = t.gang
            assert g is not None
            late = [w for w, deadline in g.awaiting.items() if deadline <= now]
            if late and t.task_id in self.active:
                cmds += self.end(t, now, status="error", culprit=late[0], retry=True,
                                 cause=f"node {g.members.index(late[0])} ({late[0]}) re-registered without "
                                       f"the task and sent no result within {self.host.policy.worker_grace_s:g}s")
        return cmds

    def restore(self, t: Task, now: float) -> None:
        """After a restart: an active gang keeps its members (each must re-announce the attempt
        within the grace period) and port."""
        g = t.gang
        assert g is not None
        if t.state in ACTIVE:
            g.restore(t.history, t.attempt, t.worker_id, now)
            t.slot = t.task_id
            if g.master_port:
                self.ports.hold(g.master_addr, g.master_port)
            self.active[t.task_id] = t

    def rejoined(self, t: Task, w: Worker, announced: dict[str, int], now: float) -> None:
        """A gang member re-registered: it keeps its slot if it still runs the attempt. If it does
        not, its result may be on the way (a worker re-sends unacknowledged results right after
        registering), so it has ``worker_grace_s`` for that before the attempt fails."""
        g = t.gang
        assert g is not None
        if w.worker_id not in g.members or w.worker_id in g.held:
            return
        if announced.get(t.task_id) == t.attempt:
            w.view.hold(t.task_id, exclusive=True)
            g.awaiting.pop(w.worker_id, None)
        else:
            g.awaiting.setdefault(w.worker_id, now + self.host.policy.worker_grace_s)


def _backend(t: Task) -> str:
    """The training config's ``backend`` ("auto" when absent or not a string: the worker's check
    refuses anything else before it launches)."""
    backend = t.spec.config.get("backend", "auto")
    return backend if isinstance(backend, str) else "auto"
