"""The placement index chooses what the scan of the fleet chooses (``pick_worker``, ``pick_ahead``):
the most free slots (or room ahead), ties to the lowest id, among workers meeting the task's
hardware, tags, memory, model-module, handler, bundle and task-network requirements, through every change a worker's
slots, window, health and offered memory go through."""

from __future__ import annotations

import random

import pytest

from distributed_testing.coordinator.core.placement import (
    NO_REQUIREMENTS,
    PlacementIndex,
    ReqKey,
    WorkerView,
    fits,
    pick_ahead,
    pick_worker,
    unmet,
)

KEYS: list[ReqKey] = [
    NO_REQUIREMENTS,
    (("cuda",), (), 0.0, 0, "", "", False, ""),
    ((), ("fast",), 0.0, 0, "", "", False, ""),
    ((), (), 16.0, 0, "", "", False, ""),
    ((), (), 0.0, 2000, "", "", False, ""),
    ((), (), 0.0, 0, "mymodels", "", False, ""),
    ((), (), 0.0, 0, "", "square", False, ""),
    (("cpu", "cuda"), ("fast",), 8.0, 500, "", "square", False, ""),
    ((), (), 0.0, 0, "", "", True, ""),
    ((), (), 0.0, 0, "", "", True, "loopback"),
    ((), (), 0.0, 0, "", "", True, "host"),
]


def _view(rng: random.Random, i: int) -> WorkerView:
    return WorkerView(
        f"w{i:03d}", frozenset(rng.sample(["cpu", "cuda"], rng.randint(1, 2))),
        frozenset(rng.sample(["fast", "big"], rng.randint(0, 2))), rng.choice([4.0, 8.0, 32.0]),
        rng.randint(0, 3), model_modules=rng.choice([(), ("mymodels",)]),
        handlers=rng.choice([None, frozenset(), frozenset({"square"})]),
        available_memory_mb=rng.choice([None, 100.0, 4000.0]), window=rng.choice([0, 0, 1, 4]),
        accept_bundles=rng.random() < 0.7, task_network=rng.choice([None, "none", "loopback", "host"]))


def _check(index: PlacementIndex, views: dict[str, WorkerView]) -> None:
    for key in KEYS:
        assert index.pick_worker(key) is pick_worker(key, views.values()), key
        assert index.pick_ahead(key) is pick_ahead(key, views.values()), key


@pytest.mark.parametrize("seed", range(12))
def test_index_matches_the_scan_through_random_changes(seed: int) -> None:
    rng = random.Random(seed)
    views = {v.worker_id: v for v in (_view(rng, i) for i in range(40))}
    index = PlacementIndex()
    for v in views.values():
        index.add(v)
    _check(index, views)
    slot = 0
    for _ in range(600):
        wid = rng.choice(sorted(views) or ["none"])
        v = views.get(wid)
        op = rng.randrange(9)
        if v is None or op == 0:  # a worker (re)connects with a fresh view
            v = _view(rng, rng.randrange(60))
            views[v.worker_id] = v
            index.add(v)
        elif op in (1, 2):  # the state places a task: what the index chose, or the scan's choice
            key = rng.choice(KEYS)
            w = index.pick_worker(key) or index.pick_ahead(key)
            if w is not None:
                slot += 1
                w.hold(f"t{slot}", exclusive=rng.random() < 0.2, started=rng.random() < 0.3)
                if key[3] and w.available_memory_mb is not None:
                    w.available_memory_mb -= key[3]
        elif op == 3 and v.running:  # a task finishes
            v.release(rng.choice(sorted(v.running)))
            index.touch(wid)
        elif op == 4:  # a heartbeat: health and offered memory
            v.accepting = rng.random() < 0.8
            v.available_memory_mb = rng.choice([None, 100.0, 1000.0, 4000.0])
            index.touch(wid)
        elif op == 5:  # a result moves the pipelining window
            v.window = rng.choice([0, 1, 2, 8])
            index.touch(wid)
        elif op == 6 and v.running:  # a held task announces itself started (only ever less room)
            v.started.add(rng.choice(sorted(v.running)))
        elif op == 7:  # drained or said goodbye (only ever less room)
            v.accepting = False
        elif op == 8:  # disconnected
            index.remove(wid)
            del views[wid]
        _check(index, views)


def test_ties_go_to_the_lowest_id_and_most_free_slots_win() -> None:
    index = PlacementIndex()
    a, b, c = WorkerView("b", frozenset(), frozenset(), 1, 2), WorkerView("a", frozenset(), frozenset(), 1, 2), \
        WorkerView("c", frozenset(), frozenset(), 1, 3)
    for v in (a, b, c):
        index.add(v)
    assert index.pick_worker(NO_REQUIREMENTS) is c
    c.hold("t1")
    assert index.pick_worker(NO_REQUIREMENTS) is b  # 2 free each now: "a" before "b"
    c.release("t1")
    index.touch("c")
    assert index.pick_worker(NO_REQUIREMENTS) is c


def test_a_worker_offering_too_little_memory_returns_after_a_heartbeat_offers_more() -> None:
    index = PlacementIndex()
    v = WorkerView("w", frozenset(), frozenset(), 1, 1, available_memory_mb=100.0)
    index.add(v)
    key: ReqKey = ((), (), 0.0, 500, "", "", False, "")
    assert index.pick_worker(key) is None
    v.available_memory_mb = 800.0
    index.touch("w")
    assert index.pick_worker(key) is v


def test_stale_entries_do_not_pile_up() -> None:
    index = PlacementIndex()
    v = WorkerView("w", frozenset(), frozenset(), 1, 1)
    index.add(v)
    for i in range(2000):
        assert index.pick_worker(NO_REQUIREMENTS) is v
        v.hold(f"t{i}")
        v.release(f"t{i}")
        index.touch("w")
    assert all(len(h) <= 4 * len(index) + 64 for h in index._free.values())


@pytest.mark.parametrize("seed", range(4))
def test_fits_is_unmet_without_the_words(seed: int) -> None:
    """The index's check at each pick (``fits``) says what ``unmet`` says, for every key and view."""
    rng = random.Random(seed)
    for i in range(200):
        v = _view(rng, i)
        for key in KEYS:
            assert fits(key, v) is (not unmet(key, v)), (key, v)
