"""Benchmark config validation (pure)."""

from __future__ import annotations

import pytest
import torch

from distributed_testing.bench.backends import check_config_combination, check_device_combination
from distributed_testing.bench.task_config import KNOWN_KEYS, RunnerDefaults, parse_config
from distributed_testing.errors import ExecutionError


def test_defaults() -> None:
    cfg = parse_config({"model": "mlp"})
    assert cfg.batch_sizes == (1,)
    assert (cfg.backend, cfg.device, cfg.precision, cfg.mode) == ("eager", "cpu", "fp32", "inference")
    assert (cfg.warmup, cfg.iterations, cfg.optimize_for, cfg.cuda_streams) == (3, 30, "latency", 1)
    assert cfg.autocast is False


def test_unknown_key_is_named() -> None:
    with pytest.raises(ExecutionError, match="unknown config key 'batchsize'"):
        parse_config({"model": "mlp", "batchsize": 4})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("batch_sizes", []),
        ("batch_sizes", [1, 0]),
        ("batch_sizes", [2, "4"]),
        ("batch_sizes", 8),
        ("batch_sizes", [True]),
        ("precision", "fp8"),
        ("backend", "tensorrt"),
        ("mode", "eval"),
        ("iterations", 0),
        ("iterations", 2.5),
        ("warmup", 0),
        ("min_duration_s", -1),
        ("min_duration_s", float("nan")),
        ("optimize_for", "speed"),
        ("cuda_streams", 0),
        ("tiny", "yes"),
        ("autocast", 1),
        ("weights", "imagenet"),
        ("model_config", [1]),
        ("input_shape", [3, -1]),
        ("sequence_length", 0),
        ("name", 5),
    ],
)
def test_bad_values_name_the_key(key: str, value: object) -> None:
    with pytest.raises(ExecutionError, match=f"'{key}'"):
        parse_config({"model": "mlp", key: value})


def test_model_is_required() -> None:
    with pytest.raises(ExecutionError, match="'model'"):
        parse_config({"batch_sizes": [1]})
    with pytest.raises(ExecutionError, match="must be an object"):
        parse_config(["mlp"])  # type: ignore[arg-type]


def test_training_only_keys_rejected_for_inference() -> None:
    with pytest.raises(ExecutionError, match="'optimizer': only applies to mode: training"):
        parse_config({"model": "mlp", "optimizer": "adamw"})
    cfg = parse_config({"model": "mlp", "mode": "training", "optimizer": "adamw", "learning_rate": 0.1})
    assert (cfg.optimizer, cfg.learning_rate) == ("adamw", 0.1)


def test_runner_default_autocast_scope() -> None:
    defaults = RunnerDefaults(autocast=True)
    assert parse_config({"model": "mlp"}, defaults).autocast_source == "runner_default"
    assert parse_config({"model": "mlp"}, defaults).autocast is True
    explicit = parse_config({"model": "mlp", "autocast": False}, defaults)
    assert (explicit.autocast, explicit.autocast_source) == (False, "config")
    for other in ({"precision": "int8"}, {"backend": "openvino"}, {"precision": "bf16"}):
        cfg = parse_config({"model": "mlp", **other}, defaults)
        assert cfg.autocast is False and cfg.autocast_source == "default"


def test_runner_default_device() -> None:
    assert parse_config({"model": "mlp"}, RunnerDefaults(device="CUDA:1")).device == "cuda:1"
    with pytest.raises(ExecutionError, match="threads"):
        RunnerDefaults(threads=0)


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"autocast": True, "precision": "bf16"}, "cannot be combined with precision bf16"),
        ({"autocast": True, "backend": "openvino"}, "backend openvino does not support it"),
        ({"mode": "training", "backend": "openvino"}, "inference-only"),
        ({"precision": "int8", "backend": "compile"}, "torch.compile of quantized"),
        ({"precision": "int8", "mode": "training"}, "int8 is inference-only"),
        ({"cuda_streams": 2}, "requires optimize_for: throughput"),
        ({"cuda_streams": 2, "optimize_for": "throughput", "mode": "training"}, "torch inference only"),
    ],
)
def test_unsupported_combinations(extra: dict[str, object], reason: str) -> None:
    with pytest.raises(ExecutionError, match=reason):
        check_config_combination(parse_config({"model": "mlp", **extra}))


def test_int8_and_streams_device_rules_without_a_gpu() -> None:
    int8 = parse_config({"model": "mlp", "precision": "int8", "device": "cuda"})
    with pytest.raises(ExecutionError, match="int8 .* runs on cpu only"):
        check_device_combination(int8, torch.device("cuda"))
    streams = parse_config({"model": "mlp", "cuda_streams": 4, "optimize_for": "throughput"})
    with pytest.raises(ExecutionError, match="single execution stream"):
        check_device_combination(streams, torch.device("cpu"))
    check_device_combination(streams, torch.device("cuda"))


def test_cache_key_separates_model_affecting_fields() -> None:
    base = parse_config({"model": "mlp", "batch_sizes": [1]})
    same = parse_config({"model": "mlp", "batch_sizes": [8], "iterations": 5})
    assert base.cache_key() == same.cache_key()
    for change in (
        {"precision": "bf16"},
        {"tiny": True},
        {"mode": "training"},
        {"backend": "compile"},
        {"model_config": {"num_layers": 2}},
    ):
        assert parse_config({"model": "mlp", **change}).cache_key() != base.cache_key()


def test_known_keys_documented() -> None:
    from distributed_testing.bench import task_config as config

    for key in KNOWN_KEYS:
        assert f"``{key}``" in (config.__doc__ or ""), key
