"""The fast tier (`scripts/test.sh --fast`, `-m "not slow"`) holds the unit tests and the
in-process integration tests and nothing that starts processes; `tests/conftest.py` decides."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # it collects the whole suite in a child pytest
@pytest.mark.timeout(600)
def test_the_fast_tier_is_the_unit_and_in_process_tests() -> None:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-m", "not slow", "tests"], cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert out.returncode == 0, out.stdout + out.stderr
    fast = {line.split("::")[0] for line in out.stdout.splitlines() if "::" in line}
    folders = {Path(f).parts[1] if Path(f).parts[1] != "integration" else "/".join(Path(f).parts[1:3])
               for f in fast if len(Path(f).parts) > 2}
    assert folders == {"unit", "integration/api", "integration/store"}, folders
    assert {f for f in fast if len(Path(f).parts) == 2} == {"tests/test_import_layers.py", "tests/test_module_size.py"}
    unit = {str(p.relative_to(ROOT)) for p in (ROOT / "tests/unit").rglob("test_*.py")}
    assert unit <= fast, f"unit test files left out of the fast tier: {sorted(unit - fast)}"
