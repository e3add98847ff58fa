"""The OpenVINO path measures what ``benchmark_app`` measures (issue 39): the same compile
configuration, recorded; a static-shape model per batch size; inputs set once; the request's own
latency as the figure. Real OpenVINO on the CPU, tiny models."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from distributed_testing.bench import run_benchmark
from distributed_testing.bench.env import OPENVINO_METHOD
from distributed_testing.bench.task_config import RunnerDefaults, parse_config

ov = pytest.importorskip("openvino")
from distributed_testing.bench.openvino_backend import compiled_properties  # noqa: E402

DECIDING = ("PERFORMANCE_HINT", "INFERENCE_PRECISION_HINT", "NUM_STREAMS", "INFERENCE_NUM_THREADS")


def _engine(cache: dict[Any, Any]) -> Any:
    (prepared,) = cache.values()
    return prepared.engine


def _as_benchmark_app_compiles(ov_model: Any, shape: list[int], hint: str) -> dict[str, Any]:
    """The properties of ``benchmark_app -d CPU -hint <hint> -infer_precision f32`` on this model
    with this static shape: the hint and precision set on the core, nothing else."""
    core = ov.Core()
    core.set_property("CPU", {"PERFORMANCE_HINT": hint, "INFERENCE_PRECISION_HINT": "f32"})
    model = ov_model.clone()
    model.reshape({model.input(0): ov.PartialShape(shape)})
    return compiled_properties(core.compile_model(model, "CPU"))


@pytest.mark.parametrize("optimize_for", ["latency", "throughput"])
def test_each_batch_records_the_compiled_properties_benchmark_app_gets(
    optimize_for: str, fast: dict[str, Any]
) -> None:
    cache: dict[Any, Any] = {}
    model = "mlp" if optimize_for == "latency" else "cnn"
    result = run_benchmark(
        {"model": model, "backend": "openvino", "batch_sizes": [1, 4], "optimize_for": optimize_for, **fast},
        model_cache=cache,
    )
    engine = _engine(cache)
    for entry in result["batch_results"]:
        recorded = entry["openvino_compiled"]
        assert set(DECIDING) <= set(recorded)
        assert recorded["PERFORMANCE_HINT"] == optimize_for.upper()
        assert recorded["INFERENCE_PRECISION_HINT"] == "f32"
        assert recorded["NUM_STREAMS"] >= 1 and recorded["INFERENCE_NUM_THREADS"] >= 1
        (shape,) = entry["static_input_shapes"]
        assert recorded == _as_benchmark_app_compiles(engine.ov_model, shape, optimize_for.upper())
        if optimize_for == "throughput":
            assert entry["concurrency"] == recorded["OPTIMAL_NUMBER_OF_INFER_REQUESTS"]


def test_every_batch_size_runs_a_static_model_compiled_once(fast: dict[str, Any]) -> None:
    cache: dict[Any, Any] = {}
    config = {"model": "mlp", "backend": "openvino", "batch_sizes": [1, 4], **fast}
    first = run_benchmark(config, model_cache=cache)
    assert [b["static_input_shapes"] for b in first["batch_results"]] == [[[1, 64]], [[4, 64]]]
    compile_one, compile_four = (b["openvino_compile_s"] for b in first["batch_results"])
    assert compile_one == 0.0 and compile_four > 0.0  # batch 1 was compiled while preparing
    assert first["compile_time_s"] > compile_four
    engine = _engine(cache)
    for batch in (1, 4):
        compiled, spent = engine.compiled_for(engine.arrays(batch, torch.Generator().manual_seed(0)))
        assert spent == 0.0
        assert [list(port.get_shape()) for port in compiled.model.inputs] == [[batch, 64]]
        assert not any(port.get_partial_shape().is_dynamic for port in compiled.model.inputs)
    again = run_benchmark(config, model_cache=cache)
    assert again["cached"] and again["compile_time_s"] == 0.0
    assert [b["openvino_compile_s"] for b in again["batch_results"]] == [0.0, 0.0]


def test_inputs_are_set_once_and_the_round_is_timed_by_the_request(fast: dict[str, Any]) -> None:
    cache: dict[Any, Any] = {}
    config = {"model": "mlp", "backend": "openvino", "batch_sizes": [4], **fast}
    result = run_benchmark(config, model_cache=cache)
    (entry,) = result["batch_results"]
    assert entry["timing"] == "openvino_request_latency"
    # results measured the old way (dynamic shapes, host clock) carry another fingerprint
    assert result["environment"]["openvino_method"] == OPENVINO_METHOD
    # each round's host time wraps its request latency, so the medians keep that order
    assert entry["host_clock_median_ms"] >= entry["latency_ms"]["median"] > 0.0
    engine = _engine(cache)
    work = engine.workload(parse_config(config, RunnerDefaults()), 4)
    request = work.step.__self__  # the workload's one infer request
    (expected,) = engine.arrays(4, torch.Generator().manual_seed(0))
    assert np.array_equal(request.get_input_tensor(0).data, expected)  # set before the first round
    request.get_input_tensor(0).data[...] = 0.0
    work.step()
    compiled, _ = engine.compiled_for([expected])
    zeros_out = compiled.model(np.zeros_like(expected))[0]
    assert np.array_equal(request.get_output_tensor(0).data, zeros_out)  # the round did not set inputs again
    assert work.round_ms is not None and work.round_ms() == request.latency > 0.0
