"""``dt compare`` on real measurements, one worker, one benchmark thread, same configuration and
environment fingerprint each time:

* the model's own code got slower between two runs (a user model module that gained layers): the
  verdict is ``slower`` with exit code 1 and a JUnit failure with figures;
* a run slowed by a CPU-burning process sharing the benchmark's one core says it was
  ``disturbed`` and is not compared (issue 29: contention is not a regression), exit code 0;
* a mistyped task id, or ids without a benchmark result, exit 2 naming them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from distributed_testing.cli import dt
from distributed_testing.testing import run_cluster

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(240), pytest.mark.slow, pytest.mark.serial]  # it times a slowdown

MODULE = "dt_compare_model"
MODEL = """
import torch

def make():
    return torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range({layers})])
"""
# Rounds of several ms, much longer than a scheduler slice, so a competing process on the same core
# stretches every round rather than a few.
BENCH = {"model": f"{MODULE}:make", "input_shape": [256], "batch_sizes": [256], "iterations": 40, "warmup": 2,
         "min_duration_s": 0.0}


@contextlib.contextmanager
def pinned_to_one_cpu() -> Iterator[int]:
    """This thread (and every process it starts from now on) runs on one CPU until exit."""
    before = os.sched_getaffinity(0)
    cpu = max(before)
    os.sched_setaffinity(0, {cpu})
    try:
        yield cpu
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def cpu_burner() -> Iterator[None]:
    """A busy loop in a child process (inherits the pinned CPU)."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        proc.kill()
        proc.wait(10)


async def _dt(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(dt.main, list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_slower_code_is_slower_and_contention_is_disturbed(tmp_path: Path, capsys, monkeypatch) -> None:
    code_dir = tmp_path / "code"
    code_dir.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(code_dir), os.environ.get("PYTHONPATH")])))
    overrides = {"bench_threads": 1, "allow_model_modules": (MODULE,)}
    with pinned_to_one_cpu():
        async with run_cluster(tmp_path, workers=1, batch_wait_s=0.0, worker_overrides=overrides) as c:
            auth = ["--coordinator", c.base_url, "--api-key", c.admin_key]

            async def bench(task_id: str, layers: int) -> None:
                (code_dir / f"{MODULE}.py").write_text(MODEL.format(layers=layers))
                [tid] = await c.submit([{"task_id": task_id, "type": "benchmark", "config": BENCH}])
                done = await c.wait(tid, timeout=180)
                assert done["state"] == "succeeded", done["outcome"]

            for attempt in range(3):  # other work on a shared machine may disturb a run: measure again
                base, slow = f"base{attempt}", f"slow{attempt}"
                await bench(base, 2)
                await bench(slow, 6)  # three times the work per round: the code regressed
                code, out, _ = await _dt(capsys, *auth, "compare", slow, "--baseline", base)
                if "disturbed" not in out:
                    break
            else:
                pytest.skip(f"every run was disturbed by other work on this machine: {out}")
            with cpu_burner():
                await bench("busy", 2)
            fingerprints = {r["output"]["environment"]["fingerprint_hash"] for r in
                            (await c.request("GET", "/api/v1/results", params={"task_type": "benchmark"}))[1]["results"]}
            assert len(fingerprints) == 1  # neither change is an environment change

            junit = tmp_path / "compare.xml"
            code, out, _ = await _dt(capsys, *auth, "compare", slow, "--baseline", base, "--junit", str(junit))
            assert code == 1, out
            assert f"{slow}  {MODULE}:make  bs=256  SLOWER" in out, out
            failure = ET.parse(junit).getroot().find("testsuite/testcase/failure")
            assert failure is not None and "regression: median" in failure.get("message", "")

            slowdown = float(re.search(r"SLOWER\s+\+([0-9.]+)%", out).group(1))  # type: ignore[union-attr]
            threshold = f"{2 * slowdown + 100:.0f}"  # well above this run's slowdown, whatever the machine's load
            code, out, _ = await _dt(capsys, *auth, "compare", slow, "--baseline", base, "--threshold", threshold)
            assert code == 0 and "SLOWER" not in out, out  # a threshold above the slowdown tolerates it

            code, out, _ = await _dt(capsys, *auth, "compare", "busy", "--baseline", base)
            assert code == 0, out
            assert "NOT COMPARED" in out and "[disturbed]" in out and "measurement disturbed: " in out, out
            assert "SLOWER" not in out and "FASTER" not in out, out

            code, out, err = await _dt(capsys, *auth, "compare", slow, "sloww")
            assert code == 2 and "no result for task id(s) sloww" in err and out == "", (out, err)
