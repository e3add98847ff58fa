"""The OpenVINO backend on the CPU (openvino and nncf are installed in the dev environment)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from distributed_testing.bench import run_benchmark
from distributed_testing.errors import ExecutionError

ov = pytest.importorskip("openvino")


def _capabilities() -> list[str]:
    return list(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def test_openvino_latency_and_throughput_on_cpu(fast: dict[str, Any]) -> None:
    cache: dict[Any, Any] = {}
    latency = run_benchmark({"model": "mlp", "backend": "openvino", "batch_sizes": [1, 4], **fast}, model_cache=cache)
    assert latency["device"] == "openvino:CPU"
    assert latency["model_info"]["performance_hint"] == "LATENCY"
    assert latency["model_info"]["inference_precision"] == "f32"
    assert latency["compile_time_s"] > 0
    assert [b["batch_size"] for b in latency["batch_results"]] == [1, 4]
    assert latency["environment"]["device_name"].endswith("(OpenVINO CPU)")
    assert latency["environment"]["device_type"] == "openvino:CPU"
    assert latency["environment"]["openvino_version"]
    again = run_benchmark({"model": "mlp", "backend": "openvino", **fast}, model_cache=cache)
    assert again["cached"] and again["compile_time_s"] == 0.0
    throughput = run_benchmark({"model": "mlp", "backend": "openvino", "optimize_for": "throughput", **fast})
    requests = throughput["model_info"]["optimal_infer_requests"]
    assert throughput["model_info"]["performance_hint"] == "THROUGHPUT"
    assert throughput["batch_results"][0]["concurrency"] == requests >= 1


def test_openvino_int8_via_nncf(fast: dict[str, Any]) -> None:
    pytest.importorskip("nncf")
    result = run_benchmark({"model": "mlp", "backend": "openvino", "precision": "int8", **fast})
    assert result["model_info"]["int8_fake_quantize_nodes"] > 0


def test_openvino_int8_without_nncf_is_a_clear_error(fast: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nncf", None)
    with pytest.raises(ExecutionError, match="needs the 'nncf' package"):
        run_benchmark({"model": "mlp", "backend": "openvino", "precision": "int8", **fast})


def test_openvino_not_installed_is_a_clear_error(fast: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)
    with pytest.raises(ExecutionError, match="'openvino' package is not installed"):
        run_benchmark({"model": "mlp", "backend": "openvino", **fast})


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_openvino_half_precision_needs_the_capability(precision: str, fast: dict[str, Any]) -> None:
    if {"bf16": "BF16", "fp16": "FP16"}[precision] in _capabilities():
        result = run_benchmark({"model": "mlp", "backend": "openvino", "precision": precision, **fast})
        assert result["model_info"]["inference_precision"] == precision.replace("fp", "f")
        return
    with pytest.raises(ExecutionError, match="OPTIMIZATION_CAPABILITIES"):
        run_benchmark({"model": "mlp", "backend": "openvino", "precision": precision, **fast})


@pytest.mark.parametrize(
    ("device", "reason"), [("cuda", "not an OpenVINO device"), ("npu", "is not available here|NPU")]
)
def test_openvino_device_errors(device: str, reason: str, fast: dict[str, Any]) -> None:
    if device == "npu" and any(d.startswith("NPU") for d in ov.Core().available_devices):
        pytest.skip("this machine has an NPU")
    with pytest.raises(ExecutionError, match=reason):
        run_benchmark({"model": "mlp", "backend": "openvino", "device": device, **fast})
