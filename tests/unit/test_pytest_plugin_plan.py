"""How the pytest plugin cuts the selected tests into chunks (pure: items stand in for pytest's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distributed_testing.plugin.chunks import (
    MAX_CHUNK_RESULT_BYTES,
    RESULT_BYTES_PER_ID_BYTE,
    RESULT_BYTES_PER_TEST,
    dist_scope,
    plan_chunks,
)
from distributed_testing.pytest_plugin import MAX_WATCHERS, MAX_WATCHERS_CAP, watchers
from distributed_testing.worker.core.output import MAX_OUTPUT_BYTES

ROOT = Path("/suite")


@dataclass
class Marker:
    kwargs: dict[str, Any]
    args: tuple[()] = ()


@dataclass
class Item:
    nodeid: str
    marker: Marker | None = None
    group: Marker | None = None  # an xdist_group mark
    path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.path = ROOT / self.nodeid.partition("::")[0]

    def get_closest_marker(self, name: str) -> Marker | None:
        return self.marker

    def iter_markers(self, name: str) -> list[Marker]:
        return [self.group] if name == "xdist_group" and self.group is not None else []


def _items(modules: int, per: int) -> list[Any]:
    return [Item(f"test_m{m}.py::test_{i}") for m in range(modules) for i in range(per)]


def test_without_history_a_big_suite_gets_up_to_four_chunks_per_slot_of_whole_modules() -> None:
    chunks = plan_chunks(_items(8, 500), ROOT, 2, {}, set())
    assert len(chunks) == 8
    assert [c.args for c in chunks] == [[f"test_m{m}.py"] for m in range(8)]
    assert [rid for c in chunks for rid in c.remote_ids] == [i.nodeid for i in _items(8, 500)]


def test_without_history_a_small_suite_gets_one_chunk_per_slot() -> None:
    chunks = plan_chunks(_items(3, 100), ROOT, 2, {}, set())
    assert len(chunks) == 2
    assert chunks[0].args[0] == "test_m0.py" and "test_m1.py::test_49" in chunks[0].args
    assert chunks[1].args[0] == "test_m1.py::test_50" and chunks[1].args[-1] == "test_m2.py"


def test_with_history_one_chunk_per_slot_of_equal_time() -> None:
    items = _items(4, 100)
    history = {i.nodeid: (3.0 if i.nodeid.startswith("test_m0") else 1.0) for i in items}
    chunks = plan_chunks(items, ROOT, 2, history, set())
    assert len(chunks) == 2
    assert chunks[0].args == ["test_m0.py", "test_m1.py::test_0", "test_m1.py::test_1", "test_m1.py::test_2",
                              "test_m1.py::test_3", "test_m1.py::test_4", "test_m1.py::test_5"][:len(chunks[0].args)]
    assert sum(history[r] for r in chunks[0].remote_ids) == sum(history[r] for r in chunks[1].remote_ids)


def test_a_module_with_deselected_tests_goes_as_node_ids_and_requirements_never_share_a_chunk() -> None:
    items = [*_items(1, 3), Item("test_gpu.py::test_a", Marker({"hardware": "cuda"}))]
    chunks = plan_chunks(items, ROOT, 1, {}, {"test_m0.py"})
    assert [c.args for c in chunks] == [["test_m0.py::test_0", "test_m0.py::test_1", "test_m0.py::test_2"],
                                        ["test_gpu.py"]]
    assert chunks[1].requirements == {"hardware": ["cuda"]}


def test_a_shipped_run_gets_small_chunks_of_node_ids_in_collection_order() -> None:
    items = _items(4, 10)
    chunks = plan_chunks(items, ROOT, 2, {}, set(), sessions=True)
    assert len(chunks) == 16  # eight per slot: a session's chunk costs a command, not a pytest start
    assert [rid for c in chunks for rid in c.remote_ids] == [i.nodeid for i in items]  # collection order
    assert all(c.args == c.remote_ids for c in chunks)  # node ids, never a module path
    history = {i.nodeid: (5.0 if i.nodeid.startswith("test_m3") else 0.1) for i in items}
    timed = plan_chunks(items, ROOT, 2, history, set(), sessions=True)
    # in collection order with history too (each session runs its tests in that order)
    assert [rid for c in timed for rid in c.remote_ids] == [i.nodeid for i in items]
    assert timed[-1].remote_ids == ["test_m3.py::test_9"]  # a slow test alone, the fast ones together


def test_a_run_waits_for_as_many_tasks_at_once_as_it_has_slots_within_bounds() -> None:
    """Each chunk that runs has a watcher (its tests come live): one per slot past the 32 of a small run."""
    assert watchers(500, 64) == 64  # 64 chunks run at once: each followed live
    assert watchers(500, 4) == MAX_WATCHERS == 32
    assert watchers(5000, 1000) == MAX_WATCHERS_CAP == 256
    assert watchers(10, 64) == 10 and watchers(0, 8) == 1


def test_a_chunk_is_cut_where_its_tests_reports_would_not_fit_one_result() -> None:
    """packaging's 64,000 tests in 16 chunks: a chunk's reports came to 9 MB, over the 8 MiB a result
    may carry, and its tests not yet reported live became errors. Each chunk's estimate stays within
    MAX_CHUNK_RESULT_BYTES, a quarter of that limit, in both modes and with history."""
    long_id = "x" * 300
    items = [Item(f"test_m{m}.py::test_{long_id}[{i}]") for m in range(2) for i in range(5000)]

    def size(c: Any) -> int:
        return sum(RESULT_BYTES_PER_TEST + RESULT_BYTES_PER_ID_BYTE * len(r) for r in c.remote_ids)

    assert MAX_CHUNK_RESULT_BYTES * 4 <= MAX_OUTPUT_BYTES
    history = {i.nodeid: 0.01 for i in items}
    for kwargs, hist in (({"sessions": True}, {}), ({}, {}), ({}, history), ({"sessions": True}, history)):
        chunks = plan_chunks(items, ROOT, 2, hist, set(), **kwargs)
        assert all(size(c) <= MAX_CHUNK_RESULT_BYTES for c in chunks)
        assert sorted(rid for c in chunks for rid in c.remote_ids) == sorted(i.nodeid for i in items)
    shared = plan_chunks(items, ROOT, 2, history, set())
    assert len(shared) > 2  # one per slot by time alone
    assert shared[0].args[0].startswith("test_m0.py::")  # a module cut in two goes as node ids
    small = plan_chunks(_items(4, 10), ROOT, 2, {}, set())
    assert len(small) == 2  # a small suite's chunks are as before


def test_xdists_dist_groups_are_never_cut_by_a_chunk() -> None:
    """pathspec 1.1.1's IterTreeTest: its first test sets a class attribute the others read, so a chunk
    boundary inside the class failed the tests past it (on another worker, or a later command). xdist
    has --dist loadscope / loadfile / loadgroup for such suites; with the fleet in xdist's place they
    still hold: no chunk cuts a group, and the tests keep their order."""
    items = [*(Item(f"test_a.py::TestC::test_{i}") for i in range(20)), *(Item(f"test_a.py::test_f{i}") for i in range(20)),
             *(Item(f"test_b.py::TestD::test_{i}") for i in range(20))]
    ids = [i.nodeid for i in items]
    plain = plan_chunks(items, ROOT, 2, {}, set(), sessions=True)
    assert len(plain) == 16 and any(c.remote_ids[0].startswith("test_a.py::TestC::test_") and c.remote_ids[0] != ids[0]
                                    for c in plain)  # without --dist the class is cut
    for dist, group in (("loadscope", lambda r: r.rsplit("::", 1)[0]), ("loadfile", lambda r: r.split("::")[0])):
        chunks = plan_chunks(items, ROOT, 2, {}, set(), sessions=True, scope=dist_scope(dist))
        assert [rid for c in chunks for rid in c.remote_ids] == ids  # collection order
        owners: dict[str, set[int]] = {}
        for n, c in enumerate(chunks):
            for rid in c.remote_ids:
                owners.setdefault(group(rid), set()).add(n)
        assert all(len(v) == 1 for v in owners.values()), (dist, owners)
        assert len(chunks) > 1 or dist == "loadfile"
    scoped = plan_chunks(items, ROOT, 2, {}, set(), sessions=True, scope=dist_scope("loadscope"))
    assert [len(c.remote_ids) for c in scoped] == [20, 20, 20]  # a class, a module's functions (xdist's scopes)
    assert dist_scope("load") is None and dist_scope("no") is None and dist_scope(None) is None


def test_loadgroup_gathers_an_xdist_group_from_any_module_into_one_chunk() -> None:
    grouped = Marker({"name": "db"})
    items = [Item("test_a.py::test_0", group=grouped), *(Item(f"test_a.py::test_{i}") for i in range(1, 10)),
             Item("test_b.py::test_0", group=Marker({}, ("db",))), *(Item(f"test_b.py::test_{i}") for i in range(1, 10))]
    chunks = plan_chunks(items, ROOT, 2, {}, set(), sessions=True, scope=dist_scope("loadgroup"))
    assert chunks[0].remote_ids == ["test_a.py::test_0", "test_b.py::test_0"]  # where its first test was
    assert sorted(rid for c in chunks for rid in c.remote_ids) == sorted(i.nodeid for i in items)
    assert len(chunks) > 10 and all(len(c.remote_ids) <= 2 for c in chunks[1:])  # the others cut as before


def test_items_of_one_node_id_are_never_cut_apart() -> None:
    """A node id sent to a session selects every item it names (a conftest's own items may share
    one): they travel in one chunk, which then runs each once."""
    items: list[Any] = [Item(f"t.cases::name{i // 4}") for i in range(12)]
    chunks = plan_chunks(items, ROOT, 2, {}, set(), sessions=True)
    assert len(chunks) == 3
    assert [c.remote_ids for c in chunks] == [[f"t.cases::name{n}"] * 4 for n in range(3)]
