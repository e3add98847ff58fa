from __future__ import annotations

from typing import Any

import pytest

FAST: dict[str, Any] = {
    "tiny": True,
    "warmup": 1,
    "iterations": 2,
    "min_duration_s": 0.0,
    "sequence_length": 16,
    "image_size": 32,
}


@pytest.fixture
def fast() -> dict[str, Any]:
    """Config keys that keep a benchmark to a few milliseconds (tiny model, 2 timed rounds)."""
    return dict(FAST)
