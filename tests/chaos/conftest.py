"""Fixtures for the chaos suite; the helpers live in chaos_support.py."""

from collections.abc import Iterator

import pytest
from chaos_support import netns

from distributed_testing.testing.netns import NetNs

__all__ = ["namespaces", "netns"]


@pytest.fixture
def namespaces() -> Iterator[list[NetNs]]:
    """One network namespace per HA member, or none where they cannot be made here."""
    if NetNs.unavailable() is not None:
        yield []
        return
    with NetNs() as a, NetNs() as b, NetNs() as c:
        yield [a, b, c]
