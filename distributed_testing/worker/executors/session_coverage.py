"""What coverage measured in a test session, for a task's result: the session's ``done`` lines
(:mod:`.pytest_serve`) with each file named where the submitter has it too
(``plugin/coverage.py`` reads them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# A task's coverage (all its commands') may take at most this much of its result; over it, the
# result says so instead, and the plugin says that its report misses this task's lines.
MAX_COVERAGE_BYTES = 2 * 1024 * 1024


def tree_coverage(measured: list[dict[str, Any]], root: Path) -> dict[str, Any]:
    """What coverage measured for a task (the session's ``done`` lines: :mod:`.pytest_serve`), with
    each file named where the submitter has it too: ``tree/REL`` (a file of the shipped tree,
    relative to its root) or ``site/REL`` (of the environment's site-packages, relative to it);
    files elsewhere (the worker's own) are left out. ``{"arcs", "files"}``, or ``{"error"}``."""
    files: dict[str, list[Any]] = {}
    arcs = False
    for m in measured:
        if "error" in m:
            return {"error": f"coverage failed in the session: {m['error']}"}
        arcs = bool(m.get("arcs"))
        sites = [Path(p) for p in m.get("sites") or [] if isinstance(p, str)]
        for path, data in (m.get("files") or {}).items():
            where = _relative(Path(path), [("tree", root), *(("site", s) for s in sites)])
            if where is not None and isinstance(data, list):
                files.setdefault(where, []).extend(data)
    out = {"arcs": arcs, "files": files}
    size = len(json.dumps(out))
    if size > MAX_COVERAGE_BYTES:
        return {"error": f"the coverage of this task's tests ({size:,} bytes, {len(files):,} files) is over the "
                         f"{MAX_COVERAGE_BYTES:,} bytes a result gives it"}
    return out


def _relative(path: Path, bases: list[tuple[str, Path]]) -> str | None:
    for name, base in bases:
        if path.is_relative_to(base):
            return f"{name}/{path.relative_to(base).as_posix()}"
    return None
