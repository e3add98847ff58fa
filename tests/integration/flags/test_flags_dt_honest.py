"""``dt`` says what happened (issue 29): a cancel that cancelled nothing says so, and a reader
that closes the pipe early (``dt results | head -2``) ends ``dt`` without a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from flags_support import ThreadCluster
from test_flags_dt_cli import DT, run_dt, task_file, unrunnable  # noqa: F401 (run_dt is a fixture)

from distributed_testing.coordinator.core.rows import ResultRow

pytestmark = pytest.mark.timeout(60)


def test_cancel_of_a_finished_task_says_nothing_was_cancelled(run_dt: DT, tmp_path: Path) -> None:  # noqa: F811
    assert run_dt("submit", task_file(tmp_path, unrunnable("c-1")))[0] == 0
    code, out, err = run_dt("cancel", "c-1")
    assert (code, out, err) == (0, "c-1: cancelled\n", "")
    code, out, err = run_dt("cancel", "c-1")
    assert (code, out) == (0, "c-1: cancelled\n")
    assert "nothing cancelled: task c-1 had already finished (cancelled)" in err


def test_results_into_head_ends_quietly(thread_cluster: ThreadCluster, clean_env: pytest.MonkeyPatch) -> None:
    rows = [ResultRow(task_id=f"t-{i:04d}", attempt=1, worker_id="w", status="succeeded", started_at=1.0,
                      finished_at=2.0, received_at=float(i), task_type="custom", output={"note": "x" * 80})
            for i in range(1000)]  # far more than a pipe buffer holds, so dt is still writing when head exits

    async def seed() -> None:
        await thread_cluster.c.runtime.store.append(rows)

    thread_cluster.call(seed())
    dt = shutil.which("dt", path=str(Path(sys.executable).parent)) or "dt"
    command = (f"{dt} --coordinator {thread_cluster.c.base_url} --api-key {thread_cluster.c.admin_key} "
               "results --format table --limit 1000 | head -2; exit ${PIPESTATUS[0]}")
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert len(proc.stdout.splitlines()) == 2
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
