"""Every placement choice made in these tests is checked against the scan it replaces."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from distributed_testing.coordinator.core import placement


@pytest.fixture(autouse=True)
def audited_placement_index(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``PlacementIndex`` must choose what ``pick_worker``/``pick_ahead`` choose over every
    connected worker; each test of the coordinator's state then also tests the index."""
    index_worker, index_ahead = placement.PlacementIndex.pick_worker, placement.PlacementIndex.pick_ahead

    def pick_worker(self: placement.PlacementIndex, key: placement.ReqKey) -> placement.WorkerView | None:
        got = index_worker(self, key)
        assert got is placement.pick_worker(key, self._views.values()), key
        return got

    def pick_ahead(self: placement.PlacementIndex, key: placement.ReqKey) -> placement.WorkerView | None:
        got = index_ahead(self, key)
        assert got is placement.pick_ahead(key, self._views.values()), key
        return got

    monkeypatch.setattr(placement.PlacementIndex, "pick_worker", pick_worker)
    monkeypatch.setattr(placement.PlacementIndex, "pick_ahead", pick_ahead)
    yield
