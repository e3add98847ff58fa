"""CUDA/ROCm paths; skipped on machines without a GPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from distributed_testing.bench import run_benchmark
from distributed_testing.errors import ExecutionError

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device"),
]
GPU = "rocm" if torch.version.hip else "cuda"


def test_gpu_inference_uses_device_memory_stats(fast: dict[str, Any]) -> None:
    result = run_benchmark({"model": "bert-base-uncased", "device": GPU, "batch_sizes": [1, 8], **fast})
    assert result["device"].startswith("cuda")
    for batch in result["batch_results"]:
        assert batch["memory_source"] == "torch.cuda.max_memory_allocated"
        assert batch["peak_memory_mb"] > 0
    env = result["environment"]
    assert env["device_type"] == "cuda" and env["gpu_compute_capability"]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_gpu_half_precision(precision: str, fast: dict[str, Any]) -> None:
    result = run_benchmark({"model": "gpt2", "device": GPU, "precision": precision, **fast})
    assert result["precision"] == precision


def test_gpu_autocast_and_training(fast: dict[str, Any]) -> None:
    result = run_benchmark(
        {"model": "resnet-50", "device": GPU, "autocast": True, "mode": "training", "optimizer": "adamw", **fast}
    )
    assert result["mode"] == "training"


def test_cuda_streams_run_concurrently(fast: dict[str, Any]) -> None:
    result = run_benchmark(
        {"model": "mlp", "device": GPU, "optimize_for": "throughput", "cuda_streams": 3, "batch_sizes": [16], **fast}
    )
    assert result["batch_results"][0]["concurrency"] == 3


def test_int8_on_gpu_is_refused(fast: dict[str, Any]) -> None:
    with pytest.raises(ExecutionError, match="runs on cpu only"):
        run_benchmark({"model": "mlp", "device": GPU, "precision": "int8", **fast})


def test_wrong_gpu_flavour_is_refused() -> None:
    other = "cuda" if GPU == "rocm" else "rocm"
    with pytest.raises(ExecutionError, match="ROCm"):
        run_benchmark({"model": "mlp", "tiny": True, "device": other})
