"""Precisions, modes, optimize_for, devices and the batch runner on the CPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from distributed_testing.bench import RunnerDefaults, run_benchmark, run_benchmark_batch
from distributed_testing.bench.models import build_model
from distributed_testing.bench.models_base import ModelRequest
from distributed_testing.errors import ExecutionError


def test_int8_dynamic_quantization_on_cpu(fast: dict[str, Any]) -> None:
    cache: dict[Any, Any] = {}
    result = run_benchmark({"model": "mlp", "precision": "int8", **fast}, model_cache=cache)
    assert result["precision"] == "int8"
    assert 0.9 < result["model_info"]["int8_quantized_param_fraction"] <= 1.0
    (prepared,) = cache.values()
    kinds = {type(m).__module__ for m in prepared.engine.module.modules()}
    assert "torch.ao.nn.quantized.dynamic.modules.linear" in kinds


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precisions_run_on_cpu_in_torch_2_13(precision: str, fast: dict[str, Any]) -> None:
    cache: dict[Any, Any] = {}
    result = run_benchmark({"model": "mlp", "precision": precision, **fast}, model_cache=cache)
    assert result["precision"] == precision
    (prepared,) = cache.values()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    assert isinstance(result["model_info"][f"cpu_native_{precision}"], bool)
    assert next(prepared.engine.module.parameters()).dtype == dtype


def test_autocast_from_config_and_runner_default(fast: dict[str, Any]) -> None:
    explicit = run_benchmark({"model": "mlp", "autocast": True, **fast})
    assert (explicit["autocast"], explicit["autocast_source"]) == (True, "config")
    by_default = run_benchmark({"model": "mlp", **fast}, defaults=RunnerDefaults(autocast=True))
    assert (by_default["autocast"], by_default["autocast_source"]) == (True, "runner_default")


def test_autocast_really_runs_bf16_on_cpu() -> None:
    from distributed_testing.bench.backends import AUTOCAST_DTYPES

    assert AUTOCAST_DTYPES["cpu"] == torch.bfloat16
    layer = torch.nn.Linear(4, 4)
    with torch.inference_mode(), torch.autocast("cpu", dtype=AUTOCAST_DTYPES["cpu"]):
        assert layer(torch.ones(1, 4)).dtype == torch.bfloat16


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_training_updates_parameters(optimizer: str, fast: dict[str, Any]) -> None:
    cache: dict[Any, Any] = {}
    config = {
        "model": "mlp",
        "mode": "training",
        "optimizer": optimizer,
        "learning_rate": 0.05,
        "batch_sizes": [4],
        **fast,
    }
    result = run_benchmark(config, model_cache=cache)
    assert result["mode"] == "training" and result["optimizer"] == optimizer
    (prepared,) = cache.values()
    trained = prepared.engine.module.state_dict()
    initial = build_model(ModelRequest("mlp", tiny=True, seed=0)).module.state_dict()
    assert trained.keys() == initial.keys()
    assert any(not torch.equal(trained[k], initial[k]) for k in trained)
    assert prepared.engine.module.training


def test_training_a_transformer_uses_its_loss(fast: dict[str, Any]) -> None:
    result = run_benchmark({"model": "t5-small", "mode": "training", **fast, "batch_sizes": [2]})
    assert result["batch_results"][0]["latency_ms"]["median"] > 0


def test_throughput_mode_uses_channels_last_for_images(fast: dict[str, Any]) -> None:
    cache: dict[Any, Any] = {}
    result = run_benchmark({"model": "cnn", "optimize_for": "throughput", **fast}, model_cache=cache)
    assert result["model_info"]["memory_format"] == "channels_last"
    (prepared,) = cache.values()
    conv = next(m for m in prepared.engine.module.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    latency = run_benchmark({"model": "cnn", **fast})
    assert latency["model_info"]["memory_format"] == "contiguous"


def test_iterations_and_min_duration(fast: dict[str, Any]) -> None:
    counted = run_benchmark({**fast, "model": "mlp", "iterations": 7})
    assert counted["batch_results"][0]["iterations"] == 7
    timed = run_benchmark({**fast, "model": "mlp", "iterations": 1, "min_duration_s": 0.05})
    batch = timed["batch_results"][0]
    assert batch["measured_s"] >= 0.05 and batch["iterations"] > 1


def test_runner_threads_are_applied(fast: dict[str, Any]) -> None:
    before = torch.get_num_threads()
    try:
        result = run_benchmark({"model": "mlp", **fast}, defaults=RunnerDefaults(threads=1))
        assert result["environment"]["torch_threads"] == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
@pytest.mark.parametrize(
    ("device", "reason"),
    [
        ("cuda", "built without CUDA|no GPU is visible"),
        ("rocm", "not a ROCm build|no GPU is visible"),
        ("mps", "built without MPS|not available"),
        ("tpu", "unknown device 'tpu'"),
        ("cuda:x", "index must be"),
    ],
)
def test_unavailable_devices_fail_with_reason(device: str, reason: str) -> None:
    with pytest.raises(ExecutionError, match=reason):
        run_benchmark({"model": "mlp", "tiny": True, "device": device})


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"precision": "int8", "backend": "compile"}, "torch.compile of quantized"),
        ({"precision": "int8", "mode": "training"}, "inference-only"),
        ({"autocast": True, "precision": "fp16"}, "cannot be combined with precision fp16"),
        ({"cuda_streams": 2, "optimize_for": "throughput"}, "single execution stream"),
        ({"mode": "training", "backend": "openvino"}, "openvino is inference-only"),
        ({"optimize_for": "throughput"}, "throughput would change nothing for mlp"),
    ],
)
def test_unsupported_combinations_fail_with_reason(extra: dict[str, Any], reason: str) -> None:
    with pytest.raises(ExecutionError, match=reason):
        run_benchmark({"model": "mlp", "tiny": True, **extra})


def test_int8_without_linear_layers_is_refused() -> None:
    from distributed_testing.bench.backends import quantize_int8

    with pytest.raises(ExecutionError, match="no nn.Linear layers"):
        quantize_int8(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()))


def test_batch_shares_the_model_and_isolates_failures(fast: dict[str, Any]) -> None:
    cache: dict[Any, Any] = {}
    configs = [
        {"model": "cnn", "batch_sizes": [1], "name": "a", **fast},
        {"model": "cnn", "batch_sizes": [2], "name": "bad", "bogus": 1, **fast},
        {"model": "cnn", "batch_sizes": [4], "name": "c", **fast},
        {"model": "cnn", "precision": "bf16", "name": "d", **fast},
    ]
    results = run_benchmark_batch(configs, model_cache=cache)
    assert [r.get("name") for r in results] == ["a", "bad", "c", "d"]
    assert results[1]["error"]["type"] == "ExecutionError" and "'bogus'" in results[1]["error"]["message"]
    assert results[1]["index"] == 1
    assert (results[0]["cached"], results[2]["cached"], results[3]["cached"]) == (False, True, False)
    assert results[2]["load_time_s"] == 0.0
    assert results[2]["model_load_count"] == results[0]["model_load_count"]  # no second build
    assert results[2]["batch_results"][0]["batch_size"] == 4
    assert len(cache) == 2


def test_batch_reports_a_user_model_exception(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "bench_broken_model.py").write_text(
        "import torch\n"
        "class Broken(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        raise RuntimeError('kaboom in forward')\n"
        "def make():\n"
        "    return Broken()\n"
        "class Hungry(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        raise MemoryError('cannot allocate 1 TiB')\n"
        "def make_hungry():\n"
        "    return Hungry()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    results = run_benchmark_batch(
        [
            {"model": "bench_broken_model:make", "input_shape": [2]},
            {"model": "bench_broken_model:make_hungry", "input_shape": [2]},
            {"model": "mlp", "tiny": True, "warmup": 1, "iterations": 1, "min_duration_s": 0},
        ]
    )
    assert results[0]["error"] == {"type": "RuntimeError", "message": "kaboom in forward"}
    assert results[1]["error"] == {"type": "OutOfMemory", "message": "cannot allocate 1 TiB"}
    assert "batch_results" in results[2]
