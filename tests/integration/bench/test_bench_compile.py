"""torch.compile (inductor) backend on a tiny MLP. Needs a C++ compiler; ~5 s with a warm
inductor cache, ~30 s on a machine that never compiled before, and over 120 s (the suite's default
limit) when that cold compile shares two cores with other work: its own limit is 300 s."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from distributed_testing.bench import run_benchmark


@pytest.mark.timeout(300)
@pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None, reason="inductor needs a C++ compiler on the CPU"
)
def test_compile_backend_reports_compile_time(fast: dict[str, Any]) -> None:
    result = run_benchmark({"model": "mlp", "backend": "compile", "batch_sizes": [4], **fast})
    (batch,) = result["batch_results"]
    assert result["backend"] == "compile"
    assert result["compile_time_s"] == pytest.approx(batch["first_call_ms"] / 1000.0)
    assert batch["first_call_ms"] > 10 * batch["latency_ms"]["median"]
