"""pytest-benchmark through ``--dt-coordinator``: the fleet runs the benchmarks disabled, as
pytest-benchmark does under pytest-xdist (timings taken on other machines would not compare with
this one's), says so at the end of the run, keeps ``--benchmark-json`` here (where no benchmark ran:
nothing is written), and refuses ``--benchmark-only``. Before, the workers timed the benchmarks
and their results were dropped with the chunk: no table, no ``--benchmark-json`` file, and
``--benchmark-compare-fail`` compared nothing, with no word of it.

A real pytest-benchmark in the submitter's virtual environment, which travels with the run to one
bundle worker."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from distributed_testing.testing import bundle_cluster
from distributed_testing.testing.suites import PLUGIN, submitter_env
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

TEST = '''def test_sum(benchmark):
    assert benchmark(sum, [1, 2, 3]) == 6


def test_runs_once(benchmark):  # disabled, pytest-benchmark calls the function once; timed, many times
    calls = []
    benchmark(calls.append, 1)
    assert len(calls) == 1


def test_plain():
    assert True
'''


def _pytest(python: Path, tree: Path, args: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    # not as an xdist worker's child: pytest-benchmark reads PYTEST_XDIST_WORKER and turns itself off
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    done = subprocess.run([str(python), "-m", "pytest", "-p", PLUGIN, "-rA", *args], cwd=tree, capture_output=True,
                          text=True, timeout=240, env={**clean, **(env or {})}, check=False)
    return done.returncode, done.stdout + done.stderr


async def test_benchmarks_run_disabled_on_the_fleet_as_under_xdist(tmp_path: Path) -> None:
    python = await asyncio.to_thread(submitter_env, tmp_path / "venv", ["pytest-benchmark"])
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "test_bench.py").write_text(TEST)
    (tree / "pytest.ini").write_text("[pytest]\n")
    async with bundle_cluster(tmp_path) as (c, key):
        env = {"DT_API_KEY": key}
        fleet = ["--dt-coordinator", c.base_url]
        timed = await asyncio.to_thread(_pytest, python, tree, [])
        assert timed[0] == 1 and "FAILED test_bench.py::test_runs_once" in timed[1]  # timed here: many calls
        code, out = await asyncio.to_thread(_pytest, python, tree, [*fleet, "--benchmark-json", "b.json"], env)
        assert code == 0, out  # as `--benchmark-disable` here: each benchmarked function once
        assert "PASSED test_bench.py::test_runs_once" in out and "3 passed" in out, out
        assert "pytest-benchmark's benchmarks ran on the fleet disabled" in out, out
        assert not (tree / "b.json").exists()  # nothing benchmarked here, so nothing saved (pytest-benchmark warns)
        code, out = await asyncio.to_thread(_pytest, python, tree, [*fleet, "--benchmark-only"], env)
        assert code == 4 and "--benchmark-only runs nothing but pytest-benchmark's benchmarks" in out, out
