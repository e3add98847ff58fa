"""Prints how many fuzz cases ran (``fuzz_support.CASES``) at the end of the session."""

from __future__ import annotations

from typing import Any

from fuzz_support import CASES


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if CASES:
        parts = ", ".join(f"{n} {suite}" for suite, n in sorted(CASES.items()))
        terminalreporter.write_sep("-", f"fuzz cases run: {parts} ({sum(CASES.values())} in all)")
