"""What the dashboard's browser tests share: Debian's Chromium (``DT_TEST_CHROMIUM`` names another
binary) driven by Playwright through ``executable_path``, since Playwright's own browser download
is unreachable here, and the arguments it is launched with."""

from __future__ import annotations

import os
import shutil
from types import ModuleType

import pytest

CHROMIUM = os.environ.get("DT_TEST_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def playwright_or_skip() -> ModuleType:
    """``playwright.async_api``, or the calling test module skipped, saying what is missing."""
    api = pytest.importorskip("playwright.async_api", reason="playwright is not installed (pip install playwright)")
    if not shutil.which(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium; scripts/setup.sh does it as root)",
                    allow_module_level=True)
    return api
