"""Which worker may run a task. Pure: no I/O, no clock.

A worker is eligible for a task when it has every requested hardware kind among its *detected*
capabilities, every requested tag, at least ``min_memory_gb`` of memory, and, when the worker
reports the memory it offers to new tasks (``--memory-buffer``), at least the task's
``max_memory_mb`` of it, and, for a task whose ``model`` is ``package.module:callable``, allows
that module (``--allow-model-modules``, reported at registration), and, for a task with a
``bundle`` (shipped code), was started with ``--accept-bundles``, and, for a training task with
a bundle, gives shipped code a network its ranks meet on (``Register.task_network``: ``host`` for
ranks on several machines, any but ``none`` for one; a worker that does not report it is not
judged). Among eligible
workers with a free slot, the one with the most free slots wins (ties: lowest worker id), which
spreads load without starving any worker.

A worker that pipelines (``--pipeline-depth``) may also take a *pipelined* task (custom, test)
when none has a free slot: it holds it ahead of its slots and runs it once the tasks before it
finish (:func:`pick_ahead`; ``WorkerView.ahead_room`` says how many more it may hold now). A task
that must run alone (benchmark, training) goes only to a free slot, and no task is queued behind one.

A gang task (multi-node training) needs ``nodes`` *distinct* eligible workers, each with a free
slot, at once: :func:`pick_gang` returns all of them or nothing, ordered the same way (the first
is node rank 0).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...protocol import messages as m
from ...tasks import spec as specs
from ...tasks.spec import Requirements
from ...tasks.usercode import ALLOW_MODEL_MODULES_FLAG, model_module, module_allowed

# (hardware, tags, min memory GB, max_memory_mb, user model module or "", custom handler or "",
#  runs shipped code (a bundle), the task network its shipped ranks need ("", "loopback", "host"))
ReqKey = tuple[tuple[str, ...], tuple[str, ...], float, int, str, str, bool, str]
NO_REQUIREMENTS: ReqKey = ((), (), 0.0, 0, "", "", False, "")
ACCEPT_BUNDLES_FLAG = "--accept-bundles"
TASK_NETWORK_FLAG = "--task-network"
# the task networks (worker flag --task-network) that serve ranks needing each: loopback meets on
# one machine, host across machines too; none serves no rendezvous at all
SERVES = {"loopback": ("loopback", "host"), "host": ("host",)}


def ranks_network(bundle: bool, nodes: int) -> str:
    """The task network a training task's ranks need (``nodes``: its gang size; 0 for any other
    kind): with shipped code, ``host`` for several nodes, ``loopback`` for one; "" otherwise
    (the operator's own code keeps the host's network)."""
    if not bundle or nodes <= 0:
        return ""
    return "host" if nodes > 1 else "loopback"


def requirement_key(req: Requirements, implied_hardware: tuple[str, ...] = (), max_memory_mb: int | None = None,
                    model_module: str | None = None, handler: str | None = None, bundle: bool = False,
                    network: str = "") -> ReqKey:
    """Tasks with equal keys are interchangeable for placement (one queue per key).
    ``implied_hardware`` adds what the task's config needs (its kind's ``hardware``, :mod:`~distributed_testing.tasks.kinds`);
    ``max_memory_mb`` is the task's memory limit (0: none); ``model_module`` the module a user
    model imports (:func:`~distributed_testing.tasks.usercode.model_module`; None: none);
    ``handler`` the custom handler the task calls (its kind's ``handler``; None: none); ``bundle``
    whether it runs shipped code (only ``--accept-bundles`` workers take it); ``network`` the task
    network its shipped ranks need (:func:`ranks_network`)."""
    # most tasks name no hardware and no tags: () without building sets (made for every task)
    hardware = tuple(sorted(set(req.hardware) | set(implied_hardware))) if req.hardware or implied_hardware else ()
    tags = tuple(sorted(set(req.tags))) if req.tags else ()
    return (hardware, tags, req.min_memory_gb or 0.0, max_memory_mb or 0, model_module or "", handler or "", bundle,
            network)


@dataclass
class WorkerView:
    """What placement needs to know about one worker."""

    worker_id: str
    capabilities: frozenset[str]
    tags: frozenset[str]
    memory_gb: float
    max_concurrent: int
    running: set[str] = field(default_factory=set)
    accepting: bool = True
    available_memory_mb: float | None = None  # offered to new tasks, from heartbeats; None: not reported
    model_modules: tuple[str, ...] = ()  # --allow-model-modules prefixes, from the registration
    handlers: frozenset[str] | None = None  # custom handler names, from the registration; None: not reported
    accept_bundles: bool = False  # --accept-bundles: runs tasks with shipped code, from the registration
    task_network: str | None = None  # the network its shipped code gets, from the registration; None: not reported
    gpus: frozenset[str] = frozenset()  # the UUIDs of the CUDA devices it uses, from the registration's hardware
    # Pipelining (coordinator/core/pipeline.py): how many tasks it may hold beyond its slots now, and
    # which held slots stop anything from being queued behind them: tasks that must run alone
    # (``exclusive``), and pipelined tasks that ran past the worker's started delay (``started``).
    window: int = 0
    started: set[str] = field(default_factory=set)
    exclusive: set[str] = field(default_factory=set)

    @property
    def free_slots(self) -> int:
        return max(0, self.max_concurrent - len(self.running)) if self.accepting else 0

    @property
    def ahead_room(self) -> int:
        """How many more pipelined tasks it may hold beyond its slots now (0 while it holds a task
        that must run alone, or every slot runs a task that announced itself started)."""
        if self.window <= 0 or not self.accepting or self.exclusive or len(self.started) >= self.max_concurrent:
            return 0
        return max(0, self.max_concurrent + self.window - len(self.running))

    @property
    def stuck(self) -> bool:
        """It holds tasks ahead of its slots while every slot runs a long or exclusive task (they
        wait for an unknown time), or while it takes no new work (constrained, draining): those
        tasks are candidates for a take-back."""
        return len(self.running) > self.max_concurrent and (
            not self.accepting or len(self.started) + len(self.exclusive) >= self.max_concurrent)

    def hold(self, slot: str, *, exclusive: bool = False, started: bool = False) -> None:
        self.running.add(slot)
        if exclusive:
            self.exclusive.add(slot)
        elif started:
            self.started.add(slot)

    def release(self, slot: str) -> None:
        self.running.discard(slot)
        self.started.discard(slot)
        self.exclusive.discard(slot)

    def release_all(self) -> None:
        self.running.clear()
        self.started.clear()
        self.exclusive.clear()


def unmet(key: ReqKey, w: WorkerView) -> list[str]:
    """Human-readable list of what ``w`` lacks for requirements ``key`` (empty: eligible)."""
    hardware, tags, min_mem, max_mem_mb, module, handler, bundle, network = key
    missing = [f"hardware {h}" for h in hardware if h not in w.capabilities]
    if bundle and not w.accept_bundles:
        missing.append(f"permission to run shipped code (a bundle; worker flag {ACCEPT_BUNDLES_FLAG})")
    elif not meets_network(network, w):
        missing.append(f"{_network_need(network)} (it runs shipped code with {TASK_NETWORK_FLAG} {w.task_network})")
    missing += [f"tag {t}" for t in tags if t not in w.tags]
    if min_mem and w.memory_gb < min_mem:
        missing.append(f"{min_mem:g} GB memory (has {w.memory_gb:.1f})")
    if max_mem_mb and w.available_memory_mb is not None and w.available_memory_mb < max_mem_mb:
        missing.append(f"{max_mem_mb} MB memory for the task (offers {w.available_memory_mb:.0f} MB after its memory buffer)")
    if module and not module_allowed(module, w.model_modules):
        missing.append(f"permission to import model module {module} (worker flag {ALLOW_MODEL_MODULES_FLAG})")
    if handler and w.handlers is not None and handler not in w.handlers:
        missing.append(f"custom handler {handler!r} (it has {', '.join(sorted(w.handlers)) or 'none'})")
    return missing


def meets_network(network: str, w: WorkerView) -> bool:
    """Whether ``w``'s shipped code gets a network that serves ranks needing ``network`` (a worker
    that does not report its network is not judged: it refuses what it cannot run)."""
    return not network or w.task_network is None or w.task_network in SERVES.get(network, ())


def _network_need(network: str) -> str:
    if network == "host":
        return (f"a task network its ranks on several machines meet on (worker flag {TASK_NETWORK_FLAG} host, "
                "or --sandbox none)")
    return f"a task network for its ranks' rendezvous (worker flag {TASK_NETWORK_FLAG} loopback or host)"


def pick_worker(key: ReqKey, workers: Iterable[WorkerView]) -> WorkerView | None:
    best: WorkerView | None = None
    for w in workers:
        if w.free_slots <= 0 or unmet(key, w):
            continue
        if best is None or (w.free_slots, best.worker_id) > (best.free_slots, w.worker_id):
            best = w
    return best


def pick_ahead(key: ReqKey, workers: Iterable[WorkerView]) -> WorkerView | None:
    """The eligible worker with the most ``ahead_room`` (ties: lowest id) for a pipelined task that
    found no free slot, or None."""
    best: WorkerView | None = None
    best_room = 0
    for w in workers:
        room = w.ahead_room
        if room <= 0 or unmet(key, w):
            continue
        if best is None or (room, best.worker_id) > (best_room, w.worker_id):
            best, best_room = w, room
    return best


def pick_gang(key: ReqKey, nodes: int, workers: Iterable[WorkerView], *,
              distinct_gpus: bool = False) -> list[WorkerView] | None:
    """``nodes`` distinct eligible workers with a free slot, best first (most free slots, then
    lowest id; the first is node rank 0), or None when fewer are available: never a part.
    ``distinct_gpus``: also no two of them report the same GPU (:func:`shared_gpus`), for an
    NCCL gang, which refuses two ranks on one device; taken in that order, skipping a worker whose
    GPUs a better one already has."""
    fit = [w for w in workers if w.free_slots > 0 and not unmet(key, w)]
    if len(fit) < nodes:
        return None
    fit.sort(key=lambda w: (-w.free_slots, w.worker_id))
    if not distinct_gpus:
        return fit[:nodes]
    chosen: list[WorkerView] = []
    taken: set[str] = set()
    for w in fit:
        if not w.gpus & taken:
            chosen.append(w)
            taken |= w.gpus
            if len(chosen) == nodes:
                return chosen
    return None


def shared_gpus(workers: Iterable[WorkerView]) -> list[str]:
    """The GPUs (UUIDs) that more than one of ``workers`` reports, sorted: several workers started
    on one machine without ``CUDA_VISIBLE_DEVICES`` each see all of its GPUs."""
    seen: set[str] = set()
    shared: set[str] = set()
    for w in workers:
        shared |= w.gpus & seen
        seen |= w.gpus
    return sorted(shared)


def registered_view(reg: m.Register) -> WorkerView:
    """What placement knows of a worker from its registration."""
    return WorkerView(reg.worker_id, frozenset(reg.capabilities), frozenset(reg.tags), reg.memory_gb,
                      reg.max_concurrent, model_modules=tuple(reg.model_modules),
                      handlers=None if reg.handlers is None else frozenset(reg.handlers),
                      accept_bundles=reg.accept_bundles, gpus=reported_gpus(reg.hardware),
                      task_network=reg.task_network)


def reported_gpus(hardware: Mapping[str, Any]) -> frozenset[str]:
    """The CUDA device UUIDs in a worker's registered ``hardware`` (``devices.cuda.uuids``, as
    ``worker/hardware.py`` reports them); anything malformed counts as none (the report is the
    worker's word, not to be trusted with more)."""
    devices = hardware.get("devices")
    cuda = devices.get("cuda") if isinstance(devices, Mapping) else None
    uuids = cuda.get("uuids") if isinstance(cuda, Mapping) else None
    if not isinstance(uuids, list) or len(uuids) > MAX_GPUS:
        return frozenset()
    return frozenset(u for u in uuids if isinstance(u, str) and 0 < len(u) <= 64)


MAX_GPUS = 256  # more UUIDs than any machine has GPUs: a report is ignored


def describe(key: ReqKey) -> str:
    """The requirements of ``key`` in words, for pending reasons ("" when there are none)."""
    hardware, tags, min_mem, max_mem_mb, module, handler, bundle, network = key
    parts = [f"hardware {'+'.join(hardware)}"] if hardware else []
    parts += [f"a worker with {ACCEPT_BUNDLES_FLAG}"] if bundle else []
    parts += [_network_need(network)] if network else []
    parts += [f"tags {'+'.join(tags)}"] if tags else []
    parts += [f"{min_mem:g} GB memory"] if min_mem else []
    parts += [f"{max_mem_mb} MB for the task"] if max_mem_mb else []
    parts += [f"model module {module} allowed"] if module else []
    parts += [f"custom handler {handler}"] if handler else []
    return ", ".join(parts)


def model_module_refusal(model: str, module: str, workers: Iterable[WorkerView]) -> str | None:
    """Why a task importing ``module`` (for user model ``model``) is refused at submit: no
    connected worker allows it (None when one does)."""
    if any(module_allowed(module, w.model_modules) for w in workers):
        return None
    return (f"model {model!r}: no connected worker allows module {module!r}; a worker's operator allows it "
            f"with the worker flag {ALLOW_MODEL_MODULES_FLAG} {module} (or DT_ALLOW_MODEL_MODULES)")


def handler_refusal(handler: str, workers: Iterable[WorkerView]) -> str | None:
    """Why a task calling custom handler ``handler`` is refused at submit under ``--strict``: no
    connected worker has it (None when one does, or one does not report its handlers)."""
    ws = list(workers)
    if any(w.handlers is None or handler in w.handlers for w in ws):
        return None
    known = sorted(set().union(*(w.handlers or () for w in ws)))
    return (f"no connected worker has custom handler {handler!r} (connected workers have: "
            f"{', '.join(known) or 'none'}); the coordinator runs with --strict, so the task is refused "
            "instead of waiting for one")


def unrunnable(prepared: list[specs.TaskSpec], known: Container[str], connected: Iterable[WorkerView], *,
               strict: bool) -> list[dict[str, str]]:
    """The errors (field, error) of new tasks among ``prepared`` (ids not in ``known``) whose
    user model imports a module no ``connected`` worker allows (placement would never find them a
    worker), with ``strict`` of those calling a custom handler no connected worker has, and of
    training tasks with a bundle whose ranks no connected worker lets meet (:func:`network_refusal`).
    A bundle's model module and handler are the worker's to check."""
    errors: list[dict[str, str]] = []
    for i, s in enumerate(prepared):
        if s.task_id in known:
            continue
        at = f"[{i}]." if len(prepared) > 1 else ""
        where = at + "config."
        kind, config = specs.kind_of(s), specs.config_dict(s)
        if s.bundle is not None:
            nodes = kind.gang_size(kind.decode(config))
            reason = network_refusal(ranks_network(True, nodes), nodes, connected)
            if reason is not None:
                errors.append({"field": where + "nodes" if nodes > 1 else at + "bundle", "error": reason})
            continue
        module = model_module(kind.imports_model, config)
        reason = None if module is None else model_module_refusal(config["model"], module, connected)
        if reason is not None:
            errors.append({"field": where + "model", "error": reason})
        handler = kind.handler(kind.decode(config)) if strict else None
        reason = None if handler is None else handler_refusal(handler, connected)
        if reason is not None:
            errors.append({"field": where + kind.handler_field, "error": reason})
    return errors


def network_refusal(network: str, nodes: int, workers: Iterable[WorkerView]) -> str | None:
    """Why a training task with shipped code on ``nodes`` nodes, whose ranks need ``network``
    (:func:`ranks_network`), is refused at submit: workers that run shipped code are connected,
    each reports its task network, and none gives the ranks one to meet on. None when one does or
    does not report it, or when no worker that runs shipped code is connected (the task waits; its
    pending reason names the flag)."""
    shipped = [w for w in workers if w.accept_bundles]
    if not network or not shipped or any(meets_network(network, w) for w in shipped):
        return None
    seen = ", ".join(f"{w.worker_id} with {TASK_NETWORK_FLAG} {w.task_network}" for w in shipped[:5])
    more = f" and {len(shipped) - 5} more" if len(shipped) > 5 else ""
    if network == "host":
        need, fix = f"on {nodes} nodes needs its ranks to reach each other across machines", "host (or --sandbox none)"
    else:
        need, fix = "needs a network for its ranks' rendezvous", "loopback or host"
    return (f"a training task with a bundle {need}, and no connected worker that runs shipped code gives them one "
            f"({seen}{more}); a worker's operator allows it with the worker flag {TASK_NETWORK_FLAG} {fix}")


def gang_pending_reason(key: ReqKey, nodes: int, workers: Iterable[WorkerView]) -> str:
    """Why a gang of ``nodes`` workers with requirements ``key`` is not placed on ``workers``."""
    ws = list(workers)
    eligible = [w for w in ws if not unmet(key, w)]
    need = f"needs {nodes} worker(s)" + (f" matching {describe(key)}" if describe(key) else "")
    if len(eligible) < nodes:
        return f"{need}, {len(eligible)} connected"
    accepting = [w for w in eligible if w.accepting and w.max_concurrent > 0]
    if len(accepting) < nodes:
        return f"{need}, {len(eligible)} connected but only {len(accepting)} accepting work (others constrained or draining)"
    free = sum(1 for w in accepting if w.free_slots > 0)
    return f"{need} with a free slot at once; {free} of {len(accepting)} have one now"


def pending_reason(key: ReqKey, workers: Iterable[WorkerView]) -> str:
    """Why a task with requirements ``key`` is not running on any of ``workers``."""
    ws = list(workers)
    if not ws:
        return "no worker is connected"
    eligible = [w for w in ws if not unmet(key, w)]
    if not eligible:
        lacks = "; ".join(f"{w.worker_id} lacks {', '.join(unmet(key, w))}" for w in ws[:5])
        return f"no connected worker satisfies the requirements ({lacks})"
    accepting = [w for w in eligible if w.accepting]
    if not accepting:
        return f"all {len(eligible)} eligible worker(s) are constrained or draining"
    return f"waiting for a free slot on {len(accepting)} eligible worker(s)"


def _static_fit(key: ReqKey, w: WorkerView) -> bool:
    """``unmet`` without its one changing input (the memory a worker offers, from heartbeats):
    what a worker registered with decides this once per session."""
    hardware, tags, min_mem, _, module, handler, bundle, network = key
    return ((w.accept_bundles or not bundle) and meets_network(network, w)
            and (not hardware or all(h in w.capabilities for h in hardware))
            and (not tags or all(t in w.tags for t in tags))
            and not (min_mem and w.memory_gb < min_mem)
            and not (module and not module_allowed(module, w.model_modules))
            and not (handler and w.handlers is not None and handler not in w.handlers))


def fits(key: ReqKey, w: WorkerView) -> bool:
    """``not unmet(key, w)``, without wording what is missing (placement asks it at every pick)."""
    max_mem_mb = key[3]
    return _static_fit(key, w) and not (
        max_mem_mb and w.available_memory_mb is not None and w.available_memory_mb < max_mem_mb)


class PlacementIndex:
    """The connected workers, kept ordered so that :meth:`pick_worker` and :meth:`pick_ahead`
    return what :func:`pick_worker` and :func:`pick_ahead` return over all of them, in
    O(log n) per choice instead of a scan of the fleet.

    Per requirement key (built on its first query), two heaps of ``(-free_slots, worker_id)``
    and ``(-ahead_room, worker_id)`` over the workers that meet the key's fixed requirements.
    An entry records the value it was pushed with; one whose worker's value has changed since is
    dropped when it reaches the top (and pushed again with the current value), so a *decrease*
    needs no notice. An *increase* (a slot released, a worker accepting again, a deeper window, a
    heartbeat offering more memory) must be announced with :meth:`touch`, which pushes the
    worker's current values into every key's heaps at the next query."""

    def __init__(self) -> None:
        self._views: dict[str, WorkerView] = {}
        self._free: dict[ReqKey, list[tuple[int, str]]] = {}
        self._room: dict[ReqKey, list[tuple[int, str]]] = {}
        self._touched: set[str] = set()

    def __len__(self) -> int:
        return len(self._views)

    def add(self, view: WorkerView) -> None:
        """``view`` is connected now (replacing any earlier view of its worker id)."""
        self._views[view.worker_id] = view
        self._touched.add(view.worker_id)

    def remove(self, worker_id: str) -> None:
        """The worker is gone: its entries are dropped as they reach the top."""
        self._views.pop(worker_id, None)
        self._touched.discard(worker_id)

    def views(self) -> Iterable[WorkerView]:
        """The connected workers (a live view: do not add or remove while iterating)."""
        return self._views.values()

    def touch(self, worker_id: str) -> None:
        """The worker's free slots, ahead room or offered memory may have grown."""
        if worker_id in self._views:
            self._touched.add(worker_id)

    def pick_worker(self, key: ReqKey) -> WorkerView | None:
        """As :func:`pick_worker` over every connected worker."""
        return self._pick(key, self._free, _free_slots)

    def pick_ahead(self, key: ReqKey) -> WorkerView | None:
        """As :func:`pick_ahead` over every connected worker."""
        return self._pick(key, self._room, _ahead_room)

    def _pick(self, key: ReqKey, heaps: dict[ReqKey, list[tuple[int, str]]],
              value: Callable[[WorkerView], int]) -> WorkerView | None:
        self._flush()
        heap = heaps.get(key)
        if heap is None:
            heap = heaps[key] = [(-n, w.worker_id) for w in self._views.values()
                                 if _static_fit(key, w) and (n := value(w)) > 0]
            heapq.heapify(heap)
        while heap:
            neg, wid = heap[0]
            w = self._views.get(wid)
            if w is None:
                heapq.heappop(heap)
                continue
            n = value(w)
            if n == -neg:
                if fits(key, w):
                    return w
                heapq.heappop(heap)  # offers too little memory now; a heartbeat offering more touches it
            elif n > 0:  # its value changed since the entry was pushed: the entry again, with the value now
                heapq.heapreplace(heap, (-n, wid))
            else:
                heapq.heappop(heap)
        return None

    def _flush(self) -> None:
        if not self._touched:
            return
        for wid in self._touched:
            w = self._views[wid]
            free, room = w.free_slots, w.ahead_room
            for heaps, n in ((self._free, free), (self._room, room)):
                if n <= 0:
                    continue
                for key, heap in heaps.items():
                    if _static_fit(key, w):
                        heapq.heappush(heap, (-n, wid))
        self._touched.clear()
        limit = 4 * len(self._views) + 64
        for heaps in (self._free, self._room):
            for key in [k for k, h in heaps.items() if len(h) > limit]:
                del heaps[key]  # mostly stale entries: rebuilt on the next query of the key


def _free_slots(w: WorkerView) -> int:
    return w.free_slots


def _ahead_room(w: WorkerView) -> int:
    return w.ahead_room
