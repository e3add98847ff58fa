"""The fast tier (`scripts/test.sh --fast`, `-m "not slow"`) holds the unit tests and the
in-process integration tests and nothing that starts processes; `tests/conftest.py` decides."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _whole_suite_collected(config: pytest.Config) -> bool:
    """Whether this session collected every test file with no selection but ``-m "not serial"``
    (the full run's parallel phase): its items then carry the marks the fast tier selects by
    (``serial`` tests are ``slow`` too, so leaving them out changes no fast file)."""
    args = [Path(a.split("::")[0]).resolve() for a in config.args]
    return (all(a in (ROOT, ROOT / "tests") for a in args)
            and not config.option.keyword and not config.getoption("deselect", None)
            and (config.option.markexpr or "") in ("", "not serial"))


def _fast_files(request: pytest.FixtureRequest) -> set[str]:
    """The test files `-m "not slow"` keeps: read from this session's items when it collected the
    whole suite, else from a child pytest that collects it (~6 s of CPU: every test module)."""
    if _whole_suite_collected(request.config):
        return {item.nodeid.split("::")[0] for item in request.session.items if item.get_closest_marker("slow") is None}
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-m", "not slow", "tests"], cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert out.returncode == 0, out.stdout + out.stderr
    return {line.split("::")[0] for line in out.stdout.splitlines() if "::" in line}


@pytest.mark.slow  # it needs the whole suite collected, in this session or in a child pytest
@pytest.mark.timeout(600)
def test_the_fast_tier_is_the_unit_and_in_process_tests(request: pytest.FixtureRequest) -> None:
    fast = _fast_files(request)
    folders = {Path(f).parts[1] if Path(f).parts[1] != "integration" else "/".join(Path(f).parts[1:3])
               for f in fast if len(Path(f).parts) > 2}
    assert folders == {"unit", "integration/api", "integration/store"}, folders
    assert {f for f in fast if len(Path(f).parts) == 2} == {"tests/test_import_layers.py", "tests/test_module_size.py"}
    unit = {str(p.relative_to(ROOT)) for p in (ROOT / "tests/unit").rglob("test_*.py")}
    assert unit <= fast, f"unit test files left out of the fast tier: {sorted(unit - fast)}"
