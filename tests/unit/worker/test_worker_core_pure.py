"""``worker/core/`` is pure: no module under it imports the event loop, sockets, the clock,
logging or a store (read with ``ast``, so nothing is imported; imports inside functions count)."""

from __future__ import annotations

import ast
from pathlib import Path

import distributed_testing.worker.core as core

FORBIDDEN = {"asyncio", "socket", "time", "logging", "duckdb", "aiohttp", "psycopg", "psycopg_pool", "threading",
             "subprocess", "selectors"}


def top_level_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_nothing_under_worker_core_imports_io_the_clock_or_logging() -> None:
    modules = sorted(Path(core.__file__).parent.rglob("*.py"))
    assert len(modules) >= 2  # __init__ and state at least
    bad = {str(p.name): sorted(top_level_imports(p) & FORBIDDEN) for p in modules}
    assert not {k: v for k, v in bad.items() if v}, bad
