"""Small modules (docs/architecture.md, "Process and module rules"): no module of the package is
over ``LIMIT`` lines; one that grows past it is split on a seam, not let through."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "distributed_testing"
LIMIT = 600


def sizes() -> dict[str, int]:
    return {p.relative_to(PACKAGE).as_posix(): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}


def test_no_module_is_over_the_limit() -> None:
    over = {name: n for name, n in sizes().items() if n > LIMIT}
    assert not over, f"modules over {LIMIT} lines (split them on a seam): {over}"
