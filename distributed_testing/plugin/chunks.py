"""How a plugin run's selected tests are cut into chunks, one ``test`` task each
(:func:`plan_chunks`; the rules are in ``pytest_plugin``'s docstring, "Spread by test").

Chunks are cut anywhere in collection order, unless pytest-xdist's ``--dist`` asked for groups
(:func:`dist_scope`): ``loadscope`` keeps a class's tests (a module's functions) in one chunk,
``loadfile`` a module's, ``loadgroup`` those of one ``xdist_group`` mark, gathered where its
first test is, as xdist sends each such group to one of its workers. A group is cut only where
its tests' reports would not fit one task's result.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ..tasks.pytest_args import TREE_MARK

CHUNKS_PER_SLOT = 4
SESSION_CHUNKS_PER_SLOT = 8  # a shipped run's chunk costs a command to a pytest session, not a pytest start
MIN_CHUNK_TESTS = 500
UNKNOWN_DURATION_S = 0.05
# A chunk's result carries every test's reports, and a result may carry at most MAX_OUTPUT_BYTES
# (worker/core/output.py, 8 MiB) or the worker refuses it and every test of the chunk not yet
# reported live becomes an error. A test's entry costs about RESULT_BYTES_PER_TEST plus
# RESULT_BYTES_PER_ID_BYTE per byte of its node id, which its three reports repeat (their node id,
# location and keywords); measured on packaging's 57,000 tests: 560 + 12.8 per byte. A chunk is cut
# to at most MAX_CHUNK_RESULT_BYTES of such estimates, a quarter of the limit: room for the
# tracebacks and captured output of tests that fail.
RESULT_BYTES_PER_TEST = 700
RESULT_BYTES_PER_ID_BYTE = 13
MAX_CHUNK_RESULT_BYTES = 2 * 1024 * 1024


@dataclass
class Chunk:
    """One test task: tests with one requirement, run by one pytest process."""

    requirements: dict[str, Any]
    items: list[pytest.Item] = field(default_factory=list)
    remote_ids: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    cost: float = 0.0  # its tests' estimated seconds


def requirements_of(item: pytest.Item) -> dict[str, Any]:
    """The ``dt`` marker as a task's ``requirements`` (empty without the marker)."""
    marker = item.get_closest_marker("dt")
    if marker is None:
        return {}
    unknown = set(marker.kwargs) - {"hardware", "tags"}
    if marker.args or unknown:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.dt takes hardware= and tags= only, "
                                f"got {list(marker.args) + sorted(unknown)}")
    hardware = marker.kwargs.get("hardware")
    tags = marker.kwargs.get("tags", ())
    req: dict[str, Any] = {}
    if hardware:
        req["hardware"] = [hardware] if isinstance(hardware, str) else list(hardware)
    if tags:
        req["tags"] = [tags] if isinstance(tags, str) else list(tags)
    return req


def remote_id(item: pytest.Item, root: Path) -> str:
    """The item's node id relative to ``root`` (the worker's test root)."""
    try:
        rel = item.path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError as exc:
        raise pytest.UsageError(f"{item.nodeid}: {item.path} is not under --dt-test-root {root}") from exc
    _, sep, rest = item.nodeid.partition("::")
    return rel + sep + rest


Scope = Callable[[pytest.Item], str | None]


def dist_scope(dist: str | None) -> Scope | None:
    """The group of a test that pytest-xdist's ``--dist`` mode ``dist`` sends to one worker (its
    ``LoadScopeScheduling``, ``LoadFileScheduling``, ``LoadGroupScheduling``), None for a test
    of no group; None for the modes that group nothing."""
    if dist == "loadscope":
        return lambda item: item.nodeid.rsplit("::", 1)[0]
    if dist == "loadfile":
        return lambda item: item.nodeid.split("::", 1)[0]
    if dist == "loadgroup":
        def group(item: pytest.Item) -> str | None:
            names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
            return "@" + "_".join(sorted(names)) if names else None
        return group
    return None


def _gathered(items: list[pytest.Item], scope: Scope) -> list[tuple[pytest.Item, str | None]]:
    """``items`` with their groups, each group's tests moved to where its first one is."""
    keyed = [(i, item, scope(item)) for i, item in enumerate(items)]
    first: dict[str, int] = {}
    for i, _, key in keyed:
        if key is not None:
            first.setdefault(key, i)
    return [(item, key) for _, item, key in sorted(keyed, key=lambda t: t[0] if t[2] is None else first[t[2]])]


def plan_chunks(items: Iterable[pytest.Item], root: Path, slots: int, history: dict[str, float],
                partial: set[str], *, sessions: bool = False, scope: Scope | None = None) -> list[Chunk]:
    """Cut ``items`` into chunks (see the module docstring). ``partial``: module paths (relative to
    ``root``) some of whose tests were deselected here, so they are always sent as node ids.
    ``sessions``: the workers' pytest sessions serve the chunks (a shipped tree), so a chunk
    costs no pytest start: :data:`SESSION_CHUNKS_PER_SLOT` per slot, sent as node ids. Chunks
    keep collection order (the coordinator hands a run's tasks out first come, first served), so
    each session runs its tests in the order pytest collected them, as each pytest-xdist worker
    does: sent the slowest first, a session ran a later module before an earlier one, and a suite
    whose later module changes what an earlier one reads (freezegun's ``test_utils``, six's
    ``test_lazy``) failed where it passes locally. ``scope``: the group of each test
    (:func:`dist_scope`), which no chunk boundary cuts."""
    keyed = _gathered(list(items), scope) if scope is not None else [(item, None) for item in items]
    keys = {id(item): key for item, key in keyed}
    groups: dict[str, list[tuple[pytest.Item, str, dict[str, Any]]]] = {}
    for item, _ in keyed:
        req = requirements_of(item)
        groups.setdefault(repr(sorted(req.items())), []).append((item, remote_id(item, root), req))
    flat = [rid for g in groups.values() for _, rid, _ in g]
    known = [history[r] for r in flat if r in history]
    default = sorted(known)[len(known) // 2] if known else UNKNOWN_DURATION_S
    with_history = len(known) >= 0.9 * len(flat)
    # without history, smaller chunks let fast slots take more, but each costs a pytest start-up
    total_chunks = slots if with_history else min(slots * CHUNKS_PER_SLOT, max(slots, len(flat) // MIN_CHUNK_TESTS))
    if sessions:
        total_chunks = max(1, min(len(flat), slots * SESSION_CHUNKS_PER_SLOT))
    cost = {r: max(history.get(r, default), 1e-3) for r in flat}
    grand = sum(cost.values())
    per_module: dict[str, int] = {}
    for rid in flat:
        per_module[rid.partition("::")[0]] = per_module.get(rid.partition("::")[0], 0) + 1
    chunks: list[Chunk] = []
    for g in groups.values():
        share = sum(cost[rid] for _, rid, _ in g)
        n = min(len(g), max(1, round(total_chunks * share / grand)))
        runs = _split(g, [cost[rid] for _, rid, _ in g], n, [keys[id(it)] for it, _, _ in g])
        for part in (piece for run in runs for piece in _fitting(run)):
            c = Chunk(part[0][2], [it for it, _, _ in part], [rid for _, rid, _ in part])
            c.args = list(c.remote_ids) if sessions else _compress(c.remote_ids, per_module, partial)
            c.cost = sum(cost[rid] for rid in c.remote_ids)
            chunks.append(c)
    return chunks


def _split(seq: list[Any], costs: list[float], n: int, keys: list[str | None] | None = None) -> Iterator[list[Any]]:
    """``seq`` (``(item, remote id, requirements)`` tuples) cut into ``n`` contiguous runs of about
    equal total cost, fewer where a run may not end: never between two items of one node id (a
    node id sent to a worker selects every item it names, as pytest's argument does, and a
    conftest's own items may share one), nor inside a group of ``keys`` (the group of each
    element: xdist's ``--dist`` scope; a run ends only where the next element's group differs from
    this one's, or either has none)."""
    target = sum(costs) / n
    run: list[Any] = []
    acc = 0.0
    cut = 1
    deferred = False
    for i, (x, c) in enumerate(zip(seq, costs, strict=True)):
        run.append(x)
        acc += c
        due = acc >= target * cut * (1 - 1e-9) and cut < n  # float sums fall just short
        whole = i + 1 < len(seq) and (seq[i + 1][1] == x[1] or (
            keys is not None and keys[i] is not None and keys[i] == keys[i + 1]))
        if due and whole:
            deferred = True
        elif due:
            yield run
            run, cut = [], cut + 1
            while deferred and cut < n and acc >= target * cut * (1 - 1e-9):  # a group ran past more cuts
                cut += 1
            deferred = False
    if run:
        yield run


def _fitting(run: list[tuple[pytest.Item, str, dict[str, Any]]]) -> Iterator[list[tuple[pytest.Item, str, dict[str, Any]]]]:
    """``run`` cut into contiguous pieces whose result fits (:data:`MAX_CHUNK_RESULT_BYTES`)."""
    sizes = [RESULT_BYTES_PER_TEST + RESULT_BYTES_PER_ID_BYTE * len(rid.encode()) for _, rid, _ in run]
    pieces = -(-sum(sizes) // MAX_CHUNK_RESULT_BYTES)
    if pieces <= 1:
        yield run
    else:
        yield from _split(run, [float(n) for n in sizes], min(pieces, len(run)))


def _compress(remote_ids: list[str], per_module: dict[str, int], partial: set[str]) -> list[str]:
    """pytest arguments for these tests: a module path where all its selected tests are here."""
    here: dict[str, int] = {}
    for rid in remote_ids:
        here[rid.partition("::")[0]] = here.get(rid.partition("::")[0], 0) + 1
    args: list[str] = []
    for rid in remote_ids:
        module = rid.partition("::")[0]
        if module not in partial and here[module] == per_module[module]:
            if not args or args[-1] != module:
                args.append(module)
        else:
            args.append(rid)
    return list(dict.fromkeys(args))


def portable_id(arg: str, root: Path) -> str:
    """A node id with the local tree's path in its part after ``::`` (a parametrize over the
    tree's files with ``ids=str``) written as ``TREE_MARK``, which the worker replaces with its
    own tree's path (``tasks/pytest_args.py``); its results come back under its id there, which
    the replay maps back (:class:`.replay.LocalPaths`). pytest 9.2 names an automatic id of a str
    over 100 characters by its argument and index (``path0``): where only one side's path makes it
    that long the ids still differ, and only ids of the test's own (``ids=str``) travel."""
    path, sep, node = arg.partition("::")
    if not sep or str(root) not in node:
        return arg
    return path + sep + re.sub(re.escape(str(root).rstrip("/")) + r"(?![\w.-])", lambda _: TREE_MARK, node)
