"""A benchmark task whose ``model: "module:callable"`` lives in its bundle: a real worker runs it in
a sandboxed child of its own with the bundle on ``sys.path``. The bundle's top-level modules
are allowed without ``--allow-model-modules``; the callable must still be defined there, a module
outside the bundle still needs the operator's allow-list, and the model's code reaches nothing of
the worker's (its factory refuses to build when it can read the worker's key file)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from distributed_testing.bundles.upload import upload
from distributed_testing.testing import run_cluster
from distributed_testing.worker.sandbox import available

pytest.importorskip("torch")
pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(240), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

MODEL = '''
import os
from os import getcwd  # reachable from the module, not defined in it

import torch

def make():
    for path in {forbidden!r}:
        try:
            open(path, "rb").read()
        except OSError:
            continue
        raise RuntimeError(f"the model read {{path}}")
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
'''
BENCH = {"input_shape": [8], "batch_sizes": [2], "iterations": 3, "warmup": 1, "min_duration_s": 0.0}


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
async def test_a_bundle_model_is_benchmarked_in_the_sandbox(tmp_path: Path, sandbox: str) -> None:
    state = tmp_path / "state"
    state.mkdir()
    key_file = state / "worker.key"
    async with run_cluster(tmp_path / "c", workers=0) as c:
        await c.add_worker(accept_bundles=True, sandbox=sandbox, task_network="none", bench_threads=1,
                           db_path=state / "outbox.duckdb")
        key_file.write_text(c.worker_keys["w0"])
        code = await c.create_key("submitter", allow_code=True)
        bundle = tmp_path / "b"
        bundle.mkdir()
        forbidden = [str(key_file), str(state / "outbox.duckdb"), f"/proc/{os.getpid()}/environ"]
        (bundle / "tinymodel.py").write_text(MODEL.format(forbidden=forbidden))
        # the child's own imports come from the standard library, not from the bundle's tree
        (bundle / "argparse.py").write_text("raise SystemExit('a shipped argparse.py shadowed the standard library')\n")
        digest = await asyncio.to_thread(upload, c.base_url, code, bundle)
        ids = await c.submit([{"type": "benchmark", "bundle": digest, "config": {**BENCH, "model": model}}
                              for model in ("tinymodel:make", "tinymodel:getcwd", "json:loads")], key=code)
        made, imported, outside = [await c.wait(t, timeout=180) for t in ids]
        status, body = await c.request("POST", "/api/v1/tasks", key=code,  # without a bundle, the allow-list rules
                                       json={"type": "benchmark", "config": {**BENCH, "model": "tinymodel:make"}})
    assert status == 400 and "no connected worker allows module 'tinymodel'" in body["message"], body
    if sandbox == "none":  # unconfined: the model reads the worker's key file (the check is not vacuous)
        assert made["outcome"]["status"] == "error" and "the model read" in made["outcome"]["error"], made["outcome"]
        return
    assert made["outcome"]["status"] == "succeeded", made["outcome"]
    assert made["result"]["output"]["batch_results"], made["result"]
    assert made["result"]["output"]["shipped_code"] is True  # never taken for a plain model's figure
    assert imported["outcome"]["status"] == "error"
    assert "is not defined in an allowed module" in imported["outcome"]["error"]
    assert outside["outcome"]["status"] == "error"
    assert "does not allow importing module 'json'" in outside["outcome"]["error"]
