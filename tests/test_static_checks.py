"""The house rules' static checks run with the suite, so CI enforces them: ruff on everything,
mypy on the package (strict for protocol/ and coordinator/core/, per pyproject.toml)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# mypy from an empty cache is ~45 s alone on two cores (torch's 1,400 modules are half of it), and
# took over 300 s in a full parallel run beside another heavy job: the bound is for a hang, not speed
pytestmark = pytest.mark.timeout(900)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_is_clean() -> None:
    out = run("ruff", "check", "distributed_testing", "tests", "benchmarks")
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_is_clean() -> None:
    out = run("mypy", "distributed_testing")
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr
