"""Fixtures for the executor tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from executor_support import HANDLER_MODULE, HANDLER_NAMES, HANDLER_SOURCE


@pytest.fixture
def handler_dir(tmp_path: Path) -> Path:
    """A directory holding the test handler module, for the pool children's PYTHONPATH."""
    site = tmp_path / "handlers"
    site.mkdir()
    (site / f"{HANDLER_MODULE}.py").write_text(textwrap.dedent(HANDLER_SOURCE))
    return site


@pytest.fixture
def handler_specs() -> dict[str, str]:
    return {name: f"{HANDLER_MODULE}:{name}" for name in HANDLER_NAMES}
