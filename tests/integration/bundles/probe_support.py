"""What every confinement probe (a shipped or an operator test, a shipped or an operator custom
handler) starts with: the worker's paths it tries to reach and a check that an attempt failed; and
a pool of operator custom-handler children, confined as the worker confines them, whose handler
reports what of a list of paths it can read (what appears or changes after a child started)."""

from __future__ import annotations

from pathlib import Path

from distributed_testing.config import WorkerConfig
from distributed_testing.worker import confine
from distributed_testing.worker.confine import Confinement
from distributed_testing.worker.executors import CustomExecutor, TaskContext

PRELUDE = '''
KEY, OUTBOX, STATE, OTHER, PID, PORT = {key!r}, {outbox!r}, {state!r}, {other!r}, {pid}, {port}

def blocked(action):
    try:
        action()
    except OSError:
        return True
    return False
'''

READER = '''
import pathlib

def run(parameters, ctx):
    """What of each path in ``parameters["paths"]`` this child can read (None: not at all)."""
    out = {}
    for path in parameters["paths"]:
        try:
            out[path] = pathlib.Path(path).read_text()
        except OSError:
            out[path] = None
    return out
'''


async def read_pool(tmp_path: Path, config: WorkerConfig, cache: Path | None = None) -> CustomExecutor:
    """A started one-child pool of the ``read`` handler in ``config``'s confinement (the worker's
    cache directory ``cache``, by default ``state/outbox-cache``), as the worker's own pool."""
    handlers = tmp_path / "handlers"
    handlers.mkdir(exist_ok=True)
    (handlers / "op_reader.py").write_text(READER)
    cache = cache or tmp_path / "state" / "outbox-cache"
    ex = CustomExecutor(1, cache_dir=cache / "handlers", handlers={"read": "op_reader:run"}, pythonpath=[handlers],
                        use_entry_points=False, confinement=confine.for_worker(config, cache))
    await ex.start()
    return ex


async def read_paths(ex: CustomExecutor, *paths: Path) -> dict[str, str | None]:
    """What of ``paths`` the pool's child can read now (None: not at all)."""
    ctx = TaskContext("t1", 1, "custom", {"name": "read", "parameters": {"paths": [str(p) for p in paths]}},
                      timeout_s=60)
    outcome = await ex.run(ctx)
    assert outcome.status == "succeeded", outcome
    return outcome.output


async def confined_pool(tmp_path: Path, name: str, source: str) -> tuple[CustomExecutor, Confinement]:
    """A started one-child pool of custom handler ``name`` (``source``'s ``run``), confined as a
    worker confines the operator's handlers; and that confinement."""
    handlers = tmp_path / "handlers"
    handlers.mkdir(exist_ok=True)
    (handlers / f"op_{name}.py").write_text(source)
    (tmp_path / "root").mkdir(exist_ok=True)
    (tmp_path / "state").mkdir(exist_ok=True)
    config = WorkerConfig(worker_id="w0", db_path=tmp_path / "state" / "outbox.duckdb", test_root=tmp_path / "root")
    confinement = confine.for_worker(config, tmp_path / "state" / "cache")
    assert confinement is not None
    ex = CustomExecutor(1, handlers={name: f"op_{name}:run"}, pythonpath=[handlers], use_entry_points=False,
                        confinement=confinement)
    await ex.start()
    return ex, confinement


async def one_child_serves(ex: CustomExecutor, name: str, tasks: tuple[str, ...] = ("t1", "t2", "t3")) -> list[dict]:
    """Run handler ``name`` once per task id (its ``parameters["task"]``) and close the pool;
    the outputs, after checking that one child served them all."""
    outputs = []
    try:
        [pid] = ex.pool.pids
        for task in tasks:
            outcome = await ex.run(TaskContext(task, 1, "custom", {"name": name, "parameters": {"task": task}},
                                               timeout_s=60))
            assert outcome.status == "succeeded", outcome
            outputs.append(outcome.output)
        assert ex.pool.pids == [pid]  # one child served them all
    finally:
        await ex.close()
    return outputs
