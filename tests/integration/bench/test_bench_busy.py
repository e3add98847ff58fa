"""A benchmark on a machine where another process keeps the other cores busy (issue 29).

With every core but one held by a pure-Python busy loop, the benchmark child, started as a
default worker starts it, must report either a median close to a bare torch loop measured in the
same test, or ``verdict: "disturbed"`` with a reason; never a slow number that looks steady.
Before the fix, tiny mlp at batch size >= 4 came back ~700x slower than the bare loop with a low cv
and nothing to say so (torch used every core, and its threads waited on each other).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from distributed_testing.bench.models import build_model
from distributed_testing.bench.models_base import ModelRequest

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # busy loops of its own: alone, after the parallel phase

BATCHES = [4, 16]
RATIO = 5.0  # generous: the bare loop and the child run at different moments on a shared machine
MLP = {"model": "mlp", "tiny": True, "batch_sizes": BATCHES, "warmup": 5, "iterations": 200, "min_duration_s": 0.5}


@pytest.fixture
def busy_cores() -> Iterator[int]:
    """A pure-Python busy loop on every core but one."""
    count = max(1, (os.cpu_count() or 2) - 1)
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield count
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _bare_median_ms(batch: int) -> float:
    """The same tiny mlp and input shape, called in a loop on one thread: what one call costs."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        built = build_model(ModelRequest(name="mlp", tiny=True))
        module = built.module.eval()
        inputs = built.make_inputs(batch, torch.Generator().manual_seed(0), False)
        samples = []
        with torch.inference_mode():
            for _ in range(20):
                module(*inputs.args, **inputs.kwargs)
            for _ in range(2000):
                start = time.perf_counter_ns()
                module(*inputs.args, **inputs.kwargs)
                samples.append((time.perf_counter_ns() - start) / 1e6)
        return statistics.median(samples)
    finally:
        torch.set_num_threads(before)


def _child(configs: list[dict[str, Any]], cwd: Path) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k not in ("DT_BENCH_THREADS", "OMP_NUM_THREADS")}
    proc = subprocess.run([sys.executable, "-m", "distributed_testing.bench.child"], cwd=cwd, env=env,
                          input=json.dumps({"id": 1, "configs": configs}) + "\n", capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results: list[dict[str, Any]] = json.loads(proc.stdout.splitlines()[-1])["results"]  # after the progress lines
    for result in results:
        assert "error" not in result, result
    return results


def _honest(result: dict[str, Any], bare: dict[int, float]) -> list[str]:
    wrong = []
    for entry in result["batch_results"]:
        median, batch = entry["latency_ms"]["median"], entry["batch_size"]
        assert entry["verdict"] in ("quiet", "noisy", "disturbed") and entry["verdict_reason"]
        if entry["verdict"] != "disturbed" and median > RATIO * bare[batch]:
            wrong.append(f"threads {result['threads']} bs {batch}: median {median:.4f} ms vs bare "
                         f"{bare[batch]:.4f} ms, verdict {entry['verdict']} ({entry['verdict_reason']})")
    return wrong


def test_busy_cores_give_a_true_median_or_say_disturbed(tmp_path: Path, busy_cores: int) -> None:
    bare = {batch: _bare_median_ms(batch) for batch in BATCHES}
    every_core = os.cpu_count() or 2
    default, all_cores = _child([MLP, {**MLP, "threads": every_core}], tmp_path)
    assert default["threads"] == 1 and default["environment"]["torch_threads"] == 1
    assert all_cores["threads"] == every_core and all_cores["environment"]["torch_threads"] == every_core
    assert default["environment"]["fingerprint_hash"] != all_cores["environment"]["fingerprint_hash"]
    wrong = _honest(default, bare) + _honest(all_cores, bare)
    assert not wrong, "a slow median that does not say it was disturbed:\n" + "\n".join(wrong)
