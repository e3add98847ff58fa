"""Each worker's session runs its tests in collection order, as plain pytest and each xdist
worker do, also once pytest's cache holds the tests' durations: a test that needs a later one not
to have run yet in its process (six's ``test_lazy``: a module not imported yet) passes there as
here. Before, a run with duration history sent its slowest chunk first, so with one worker the
later module's slow test ran first and imported the module (a failure through the fleet only).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from distributed_testing.testing import run_cluster
from distributed_testing.testing.suites import PLUGIN, submitter_env
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(600), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

FIRST = '''\
import sys
import time


def test_lazy_module_not_imported_yet():
    assert "lazymod" not in sys.modules
''' + "".join(f"\n\ndef test_short_{i}():\n    time.sleep(0.1)\n" for i in range(7))
LATER = '''\
import time


def test_slow_import():
    time.sleep(1.2)  # its chunk the longest: it was sent first
    import lazymod
    assert lazymod.VALUE == 1
''' + "".join(f"\n\ndef test_quick_{i}():\n    pass\n" for i in range(7))


async def test_sessions_run_chunks_in_collection_order_with_duration_history(tmp_path: Path) -> None:
    tree = tmp_path / "proj"
    tree.mkdir()
    (tree / "lazymod.py").write_text("VALUE = 1\n")
    (tree / "test_a_first.py").write_text(FIRST)
    (tree / "test_b_later.py").write_text(LATER)
    python = await asyncio.to_thread(submitter_env, tmp_path / "venv", [])
    async with run_cluster(tmp_path / "c", workers=0) as c:
        await c.add_worker(worker_id="w1", accept_bundles=True, max_concurrent_tasks=1,
                           db_path=tmp_path / "state" / "w1.duckdb")
        key = await c.create_key("submitter", allow_code=True)

        def run() -> subprocess.CompletedProcess[str]:
            return subprocess.run([str(python), "-m", "pytest", "-p", PLUGIN, "-rA", "--dt-coordinator", c.base_url],
                                  cwd=tree, env={**os.environ, "DT_API_KEY": key}, capture_output=True, text=True,
                                  timeout=300, check=False)

        # the first run writes the durations into pytest's cache; the second plans with them
        runs = [await asyncio.to_thread(run) for _ in range(2)]
    assert (tree / ".pytest_cache" / "v" / "distributed_testing").exists()
    for n, done in enumerate(runs, 1):
        assert done.returncode == 0 and "16 passed" in done.stdout, (n, done.stdout[-3000:] + done.stderr[-2000:])
