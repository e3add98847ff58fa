"""The operator's own modules on the worker's ``PYTHONPATH`` stay importable in the confinement
of tasks without a bundle (worker/confine.py), also where they lie beside ``--db-path``: a real
``dt-worker`` (``--sandbox bwrap``) with ``PYTHONPATH`` naming a directory in its state
directory runs a test that imports from it, while the outbox beside it stays hidden."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from distributed_testing.testing import Procs, hidden_accelerators, run_cluster
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120),
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]
ROOT = Path(__file__).resolve().parents[3]
DROP = ["DT_API_KEY", "DT_API_KEY_FILE", "DT_COORDINATOR_URL", "DT_DB_PATH", "DT_SANDBOX"]


async def test_a_pythonpath_entry_beside_the_db_path_is_shown_read_only(tmp_path: Path) -> None:
    state = tmp_path / "srv"
    models = state / "models"  # beside the outbox: the state directory is hidden whole
    models.mkdir(parents=True, mode=0o700)
    (models / "mymodels.py").write_text("VALUE = 42\n")
    db = state / "w.duckdb"
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_models.py").write_text(
        "import os\nimport mymodels\n\n\n"
        "def test_the_operators_module_is_there():\n    assert mymodels.VALUE == 42\n\n\n"
        f"def test_the_outbox_beside_it_is_not():\n    assert not os.path.exists({str(db)!r})\n\n\n"
        f"def test_nor_can_a_task_write_there():\n    assert not os.access({str(models)!r}, os.W_OK)\n")
    env = hidden_accelerators(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(models), env["PYTHONPATH"]])
    procs = Procs(tmp_path, cwd=ROOT)
    try:
        async with run_cluster(tmp_path / "c", workers=0) as c:
            key = await c.create_key("worker")
            log = tmp_path / "worker.log"
            procs.start([str(ROOT / "run_worker_example.py"), "--coordinator", c.base_url, "--api-key", key,
                         "--worker-id", "w", "--db-path", str(db), "--test-root", str(suite)], log, env=env,
                        drop_env=DROP)
            [tid] = await c.submit({"type": "test", "config": {"test_file": "test_models.py"}})
            task = await c.wait(tid, 90)
            assert task["state"] == "succeeded", (task, log.read_text()[-3000:])
        assert f"{models} shown read-only" in log.read_text()
    finally:
        procs.close()
