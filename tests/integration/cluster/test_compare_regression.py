"""``dt compare`` on real measurements: the same benchmark twice on one worker, the second run
slowed for real by a CPU-burning process sharing the benchmark's one core (same model, same
configuration, same environment fingerprint: nothing the fingerprint records changes, only the
contention), and the verdict is ``slower`` with exit code 1 and a JUnit failure with figures."""

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

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]

# A round of ~40 ms, much longer than a scheduler slice, so a competing process on the same core
# stretches every round rather than a few (8192 rows took under 2 ms on a quiet machine: rounds
# inside one slice left the median untouched by the burner, and the verdict was inconclusive).
BENCH = {"model": "mlp", "tiny": True, "batch_sizes": [65536], "iterations": 40, "warmup": 2, "min_duration_s": 0.0}


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


async def _dt(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = await asyncio.to_thread(dt.main, list(argv))
    return code, capsys.readouterr().out


async def test_a_run_slowed_by_contention_is_reported_slower_with_exit_1(tmp_path: Path, capsys) -> None:
    with pinned_to_one_cpu():
        async with run_cluster(tmp_path, workers=1, batch_wait_s=0.0, worker_overrides={"bench_threads": 1}) as c:
            auth = ["--coordinator", c.base_url, "--api-key", c.admin_key]
            [base] = await c.submit([{"task_id": "base", "type": "benchmark", "config": BENCH}])
            assert (await c.wait(base, timeout=90))["state"] == "succeeded"
            with cpu_burner():
                [slow] = await c.submit([{"task_id": "slow", "type": "benchmark", "config": BENCH}])
                done = await c.wait(slow, timeout=90)
            assert done["state"] == "succeeded", done["outcome"]
            fingerprints = {r["output"]["environment"]["fingerprint_hash"] for r in
                            (await c.request("GET", "/api/v1/results", params={"model": "mlp"}))[1]["results"]}
            assert len(fingerprints) == 1  # the slowdown is not an environment change

            junit = tmp_path / "compare.xml"
            code, out = await _dt(capsys, *auth, "compare", "slow", "--junit", str(junit))
            assert code == 1, out
            assert "slow  mlp  bs=65536  SLOWER" in out, out
            failure = ET.parse(junit).getroot().find("testsuite/testcase/failure")
            assert failure is not None and "regression: median" in failure.get("message", "")

            slowdown = float(re.search(r"SLOWER\s+\+([0-9.]+)%", out).group(1))  # type: ignore[union-attr]
            threshold = f"{2 * slowdown + 100:.0f}"  # well above this run's slowdown, whatever the machine's load
            code, out = await _dt(capsys, *auth, "compare", "slow", "--baseline", "base", "--threshold", threshold)
            assert code == 0 and "SLOWER" not in out, out  # a threshold above the slowdown tolerates it
