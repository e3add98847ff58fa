"""A worker's pytest session runs the chunks it is given in collection order, as each pytest-xdist
worker runs its tests (``--dist load`` hands them out in that order): a suite whose later module
changes what an earlier one reads (freezegun's ``test_utils`` reloads ``freezegun.api`` with a
mocked ``platform``, after which its ``cpython_only`` tests skip) passes through the plugin as it
passes locally. Before, a run with the tests' durations known sent the slowest chunks first, so a
session ran the later module before the earlier one (freezegun's second run: 1 failed and 3
skipped that pass locally)."""

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

FILES = {
    "state.py": "CHANGED = False\n",
    # tests that read the shared state before the last module changes it (a few chunks' worth)
    "test_a_reads.py": "import time\n\nimport state\n\n\n" + "".join(
        f"def test_reads_{i}():\n    time.sleep(0.2)\n    assert not state.CHANGED\n\n\n" for i in range(6)),
    # the slowest module, last in collection order: leaves the state changed behind it
    "test_z_changes.py": "import time\n\nimport state\n\n\ndef test_changes():\n    time.sleep(1.0)\n"
                         "    state.CHANGED = True\n",
}


async def test_a_session_runs_its_chunks_in_collection_order_with_durations_known(tmp_path: Path) -> None:
    tree = tmp_path / "proj"
    tree.mkdir()
    for name, text in FILES.items():
        (tree / name).write_text(text)
    python = await asyncio.to_thread(submitter_env, tmp_path / "venv", [])
    local = await asyncio.to_thread(subprocess.run, [str(python), "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider",
                                                     "-q"], cwd=tree, capture_output=True, text=True, timeout=300)
    assert "7 passed" in local.stdout, local.stdout[-3000:]
    async with bundle_cluster(tmp_path) as (c, key):
        env = {**os.environ, "DT_API_KEY": key}
        runs = []
        for _ in range(2):  # the second has the first's durations (pytest's cache)
            runs.append(await asyncio.to_thread(
                subprocess.run, [str(python), "-m", "pytest", "-p", PLUGIN, "-q", "-o", f"cache_dir={tmp_path / 'cache'}",
                                 "--dt-coordinator", c.base_url], cwd=tree, env=env, capture_output=True, text=True,
                timeout=300))
    for run in runs:
        assert run.returncode == 0 and "7 passed" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]
