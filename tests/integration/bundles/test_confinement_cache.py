"""The custom pool's writable cache directory in the worker's confinement (worker/confine.py):
a confined handler writes its own cache directory, also where that directory is itself one the
confinement hides (it was remounted read-only over the writable bind), and reaches nothing else of
the worker's cache directory: not a running training task's result beside it, which neither a
handler's write nor ``setup_environment``'s ``clear_cache`` may touch."""

from __future__ import annotations

from pathlib import Path

import pytest

from distributed_testing.config import WorkerConfig
from distributed_testing.worker import confine
from distributed_testing.worker.executors import CustomExecutor, TaskContext
from distributed_testing.worker.executors.base import ExecutorSettings
from distributed_testing.worker.executors.custom import build
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

WRITER = '''
import pathlib

def run(parameters, ctx):
    """Write a file into the handlers' cache directory and into each of ``parameters["paths"]``."""
    def attempt(path):
        try:
            pathlib.Path(path).write_text("written by a handler")
        except OSError as exc:
            return exc.strerror
        return "written"
    return {"cache_dir": str(ctx.cache_dir), "cache": attempt(pathlib.Path(ctx.cache_dir) / "kept.txt"),
            **{path: attempt(path) for path in parameters["paths"]}}
'''


def _handlers(tmp_path: Path) -> Path:
    handlers = tmp_path / "handlers"
    handlers.mkdir()
    (handlers / "op_writer.py").write_text(WRITER)
    return handlers


async def _run(ex: CustomExecutor, name: str, parameters: dict[str, object]) -> dict[str, object]:
    await ex.start()
    try:
        outcome = await ex.run(TaskContext("t1", 1, "custom", {"name": name, "parameters": parameters}, timeout_s=60))
    finally:
        await ex.close()
    assert outcome.status == "succeeded", outcome
    return outcome.output


async def test_a_cache_directory_the_confinement_hides_stays_writable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"  # --db-path in HOME: the cache directory ~/w-cache is hidden on its own
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "root").mkdir()
    config = WorkerConfig(worker_id="w0", db_path=home / "w.duckdb", test_root=tmp_path / "root")
    cache = home / "w-cache"
    confinement = confine.for_worker(config, cache)
    assert confinement is not None and cache in confinement.hide
    ex = CustomExecutor(1, cache_dir=cache, handlers={"write": "op_writer:run"}, pythonpath=[_handlers(tmp_path)],
                        use_entry_points=False, confinement=confinement)
    output = await _run(ex, "write", {"paths": []})
    assert output["cache"] == "written"
    assert (cache / "kept.txt").read_text() == "written by a handler"


async def test_a_handler_reaches_its_cache_not_a_training_tasks_result(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    db = tmp_path / "state" / "outbox.duckdb"
    db.parent.mkdir()
    config = WorkerConfig(worker_id="w0", db_path=db, test_root=tmp_path / "root")
    cache = tmp_path / "state" / "outbox-cache"
    settings = ExecutorSettings(cache_dir=cache, confinement=confine.for_worker(config, cache),
                                custom_handlers={"write": "op_writer:run"}, custom_pythonpath=[_handlers(tmp_path)])
    result = cache / "training" / "t9-a1" / "result.json"  # a training node running now
    result.parent.mkdir(parents=True)
    result.write_text('{"status": "succeeded"}')
    written = await _run(build(settings), "write", {"paths": [str(result), str(cache / "planted.txt")]})
    cleared = await _run(build(settings), "setup_environment", {"clear_cache": True})
    assert written == {"cache_dir": str(cache / "handlers"), "cache": "written",
                       str(result): "No such file or directory", str(cache / "planted.txt"): "Read-only file system"}
    assert cleared["cleared"]["cache_dir"]["files_deleted"] == 1  # kept.txt, its own
    assert result.read_text() == '{"status": "succeeded"}' and not (cache / "planted.txt").exists()
