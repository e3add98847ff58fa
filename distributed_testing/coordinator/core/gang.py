"""Gang tasks (multi-node DDP training): per-attempt bookkeeping, rendezvous ports, combined
results and the scaling-efficiency baseline. Pure: no I/O, no clock.

A ``training`` task is a gang of ``nodes`` members (its kind's ``gang_size``). :class:`~.state.CoordinatorState` reserves the members all-or-nothing in one dispatch
round; this module holds what the state machine needs around that:

- :class:`Gang`: the members of the current attempt by node rank, the rendezvous address and
  port, and the member results held (unacknowledged) until the attempt's row is saved.
- :class:`PortPool`: the coordinator-chosen rendezvous port, unique per master address among
  running gangs, rotating through the range so a retry gets a different port.
- :func:`success_row` / :func:`attempt_row`: the ONE result row stored per attempt (results
  are keyed by ``(task_id, attempt)``): node 0's output, a ``nodes`` summary and, on success, the
  scaling efficiency against a single-node baseline.
- :class:`Baselines`: the latest succeeded single-node run per (model, global batch, precision),
  rebuilt from task outcomes after a restart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...protocol import messages as m
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


@dataclass(slots=True)
class Gang:
    """One gang task's placement. ``members`` is empty while the task is pending."""

    nodes: int
    members: list[str] = field(default_factory=list)  # worker ids by node rank, current attempt
    addresses: list[str] = field(default_factory=list)  # their Register.address, by node rank
    master_addr: str = ""
    master_port: int = 0
    all_cuda: bool = False
    dispatched_at: float = 0.0
    held: dict[str, m.TaskResult] = field(default_factory=dict)  # member -> its result, not yet acked
    awaiting: dict[str, float] = field(default_factory=dict)  # member -> deadline for its re-sent result
    queued_at: float = 0.0  # when it last became dispatchable; the starvation bound counts from here
    protecting: bool = False  # past gang_max_wait_s: its eligible workers take no new lower work

    def place(self, members: list[str], addresses: list[str], port: int, all_cuda: bool, now: float) -> None:
        self.members, self.addresses = list(members), list(addresses)
        self.master_addr, self.master_port, self.all_cuda = addresses[0], port, all_cuda
        self.dispatched_at, self.protecting = now, False
        self.held.clear()
        self.awaiting.clear()

    def clear(self) -> None:
        """The attempt is over: forget its members and held results."""
        self.members, self.addresses = [], []
        self.master_addr, self.master_port = "", 0
        self.held.clear()
        self.awaiting.clear()

    def assignment(self, rank: int) -> m.GangAssignment:
        return m.GangAssignment(node_rank=rank, nnodes=self.nodes, master_addr=self.master_addr,
                                master_port=self.master_port, all_cuda=self.all_cuda, members=list(self.members))

    def record(self) -> dict[str, Any]:
        """What the dispatch history entry keeps, so a restarted coordinator knows the members."""
        return {"members": list(self.members), "addresses": list(self.addresses), "master_addr": self.master_addr,
                "master_port": self.master_port, "all_cuda": self.all_cuda}

    def restore(self, history: list[dict[str, Any]], attempt: int, fallback_worker: str | None, at: float) -> None:
        """Rebuild the members of ``attempt`` from the dispatch entry of the task's history."""
        for h in reversed(history):
            rec = h.get("gang")
            if h.get("to") == "assigned" and h.get("attempt") == attempt and isinstance(rec, dict):
                self.members = [str(w) for w in rec.get("members", [])]
                self.addresses = [str(a) for a in rec.get("addresses", [])] or [""] * len(self.members)
                self.master_addr, self.master_port = str(rec.get("master_addr", "")), int(rec.get("master_port", 0))
                self.all_cuda, self.dispatched_at = bool(rec.get("all_cuda", False)), float(h.get("at", at))
                return
        self.members = [fallback_worker] if fallback_worker else []
        self.addresses, self.dispatched_at = [""] * len(self.members), at

    def view(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "members": list(self.members), "master_addr": self.master_addr or None,
                "master_port": self.master_port or None, "all_cuda": self.all_cuda if self.members else None,
                "reported": sorted(self.held), "waiting_past_bound": self.protecting}


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
