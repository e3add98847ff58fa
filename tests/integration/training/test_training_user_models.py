"""Training ranks import a ``module:factory`` model only from a module the worker allows, even
when the task reaches the training executor without the worker's own check (a coordinator that
sent it anyway): the rank refuses before importing anything."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from distributed_testing.worker.executors.base import TaskContext
from distributed_testing.worker.executors.training import TrainingExecutor, TrainingOptions

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

FACTORY = """
from pathlib import Path

Path({marker!r}).write_text("imported")

from distributed_testing.training.models import mlp


def factory():
    return mlp(in_features=8, hidden=8, depth=1)
"""


def config(model: str) -> dict[str, object]:
    return {"model": model, "nodes": 1, "nproc_per_node": 1, "batch_size": 4, "steps": 2,
            "warmup_steps": 0}


async def test_a_rank_refuses_a_factory_from_a_module_the_worker_does_not_allow(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    modules = tmp_path / "modules"
    modules.mkdir()
    evil_marker, ok_marker = tmp_path / "evil-imported", tmp_path / "ok-imported"
    (modules / "dt_train_evil.py").write_text(FACTORY.format(marker=str(evil_marker)))
    (modules / "dt_train_ok.py").write_text(FACTORY.format(marker=str(ok_marker)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(modules), os.environ.get("PYTHONPATH", "")]))
    ex = TrainingExecutor(TrainingOptions(run_dir=tmp_path / "runs", interface="lo",
                                         allow_model_modules=("dt_train_ok",)))
    try:
        refused = await ex.run(TaskContext("evil", 1, "training", config("dt_train_evil:factory"), timeout_s=90))
        allowed = await ex.run(TaskContext("ok", 1, "training", config("dt_train_ok:factory"), timeout_s=90))
    finally:
        await ex.close()
    assert refused.status == "failed", refused
    log = Path(refused.output["log_path"]).read_text()
    assert "does not allow importing module 'dt_train_evil'" in log
    assert not evil_marker.exists()
    assert allowed.status == "succeeded", allowed.error
    assert ok_marker.exists()


async def test_a_factory_that_returns_only_a_module_fails_saying_what_a_factory_returns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a user's first factory often returns just the nn.Module, as a benchmark's callable does;
    # the rank's error must say what a training factory returns, not "too many values to unpack"
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "dt_train_bare.py").write_text(
        "import torch\n\ndef factory():\n    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(modules), os.environ.get("PYTHONPATH", "")]))
    ex = TrainingExecutor(TrainingOptions(run_dir=tmp_path / "runs", interface="lo",
                                         allow_model_modules=("dt_train_bare",)))
    try:
        result = await ex.run(TaskContext("bare", 1, "training", config("dt_train_bare:factory"), timeout_s=90))
    finally:
        await ex.close()
    assert result.status == "failed", result
    assert "the factory returned a Sequential; a training factory must return (model, make_batch)" in (result.error or "")
