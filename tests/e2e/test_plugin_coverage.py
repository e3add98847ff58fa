"""pytest-cov through the plugin: the coverage report of a run on two bundle workers is the one
local pytest prints (every file's statements, misses, branches and missing lines), whether
``--cov`` comes from the command line or from the ini file's ``addopts``, and
``--cov-fail-under`` decides the exit code as it does locally.

Before, pytest-cov measured the submitting process, where no test runs: its report showed only
what collection imported (the functions' bodies all missed), and a ``--cov-fail-under`` that
passes locally failed the run.

The submitter's environment is a virtual environment with pytest-cov installed (it travels with
the run); the workers run from this interpreter, in bwrap.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from distributed_testing.testing import bundle_cluster
from distributed_testing.testing.suites import PLUGIN, submitter_env
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(600), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

OPS = '''\
def add(a, b):
    return a + b


def sub(a, b):
    if a < b:
        return -(b - a)
    return a - b


def never():
    x = 1
    return x
'''
TESTS = {
    "tests/test_add.py": "from calc.ops import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n",
    "tests/test_sub.py": ("import pytest\nfrom calc.ops import sub\n\n\n@pytest.mark.parametrize('n', range(12))\n"
                          "def test_sub(n):\n    assert sub(10, n) == 10 - n\n"),
    "tests/test_other.py": "import calc\n\n\ndef test_version():\n    assert calc.VERSION == '1'\n",
}


def _project(root: Path) -> Path:
    (root / "calc").mkdir(parents=True)
    (root / "calc" / "__init__.py").write_text("VERSION = '1'\n")
    (root / "calc" / "ops.py").write_text(OPS)
    for name, text in TESTS.items():
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_text(text)
    (root / "pytest.ini").write_text("[pytest]\ntestpaths = tests\naddopts = --cov=calc\n")
    return root


def _pytest(python: Path, tree: Path, args: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    done = subprocess.run([str(python), "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", *args], cwd=tree,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=300, check=False)
    return done.returncode, done.stdout + done.stderr


def _report(out: str) -> list[str]:
    """The rows of pytest-cov's table (a file's or TOTAL), spaces collapsed."""
    rows = [" ".join(line.split()) for line in out.splitlines() if line.startswith(("calc/", "calc\\", "TOTAL"))]
    assert rows, out[-3000:]
    return rows


async def test_the_runs_coverage_is_measured_on_the_workers_and_reported_as_locally(tmp_path: Path) -> None:
    tree = _project(tmp_path / "proj")
    python = await asyncio.to_thread(submitter_env, tmp_path / "venv", ["pytest-cov"])
    runs = {  # name: arguments beside the ini file's --cov=calc
        "ini": [],
        "branches": ["--cov-branch", "--cov-report=term-missing"],
        "fail-under": ["--cov-report=term-missing", "--cov-fail-under=90"],
    }
    local = {name: await asyncio.to_thread(_pytest, python, tree, args) for name, args in runs.items()}
    async with bundle_cluster(tmp_path, workers=2) as (c, key):
        remote = {name: await asyncio.to_thread(_pytest, python, tree, [*args, "--dt-coordinator", c.base_url],
                                                {"DT_API_KEY": key})
                  for name, args in runs.items()}
    for name in runs:
        assert _report(remote[name][1]) == _report(local[name][1]), (name, remote[name][1][-4000:])
    # the local figures the comparison stands on: both of sub's branches ran, never() did not
    assert "calc/ops.py 9 2 2 0 82% 12-13" in _report(local["branches"][1]), local["branches"][1][-3000:]
    assert local["fail-under"][0] == remote["fail-under"][0] == 1  # 80 % < 90 %: fails here and through the fleet
    assert local["ini"][0] == remote["ini"][0] == 0
    assert "no coverage came back" not in remote["ini"][1]
