from typing import Any

import pytest

from distributed_testing.errors import ExecutionError
from distributed_testing.training.errors import InvalidTrainingConfig
from distributed_testing.training.task_config import (
    ResolvedTrainingConfig,
    TrainingConfig,
    parse_config,
    resolve,
)

BASE: dict[str, Any] = {"kind": "training", "model": "mlp", "nodes": 2, "batch_size": 64, "steps": 10}


def config(**overrides: Any) -> dict[str, Any]:
    return {**BASE, **overrides}


def test_defaults() -> None:
    parsed = parse_config(config())
    assert parsed == TrainingConfig(model="mlp", nodes=2, batch_size=64, steps=10)
    assert parsed.nproc_per_node == "auto"
    assert parsed.backend == "auto"
    assert parsed.load_balance == "none"
    assert parsed.rebalance_interval is None


def test_unknown_key_is_named() -> None:
    with pytest.raises(InvalidTrainingConfig, match="'batchsize': unknown key") as info:
        parse_config(config(batchsize=3))
    assert info.value.field == "batchsize"
    assert isinstance(info.value, ExecutionError)


@pytest.mark.parametrize("key", ["model", "nodes", "batch_size", "steps"])
def test_required_keys(key: str) -> None:
    raw = config()
    del raw[key]
    with pytest.raises(InvalidTrainingConfig, match=f"'{key}': required"):
        parse_config(raw)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"kind": "benchmark"}, "kind"),
        ({"nodes": 0}, "nodes"),
        ({"nodes": True}, "nodes"),
        ({"steps": "10"}, "steps"),
        ({"batch_size": 1}, "batch_size"),
        ({"batch_size": 7, "nproc_per_node": 4}, "batch_size"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"nproc_per_node": 0}, "nproc_per_node"),
        ({"nproc_per_node": "all"}, "nproc_per_node"),
        ({"backend": "mpi"}, "backend"),
        ({"precision": "int8"}, "precision"),
        ({"load_balance": "greedy"}, "load_balance"),
        ({"load_balance": "none", "rebalance_interval": 5}, "rebalance_interval"),
        ({"load_balance": "dynamic", "rebalance_interval": 0}, "rebalance_interval"),
        ({"load_balance": "proportional", "warmup_steps": 0}, "warmup_steps"),
        ({"model": ""}, "model"),
        ({"model": "resnet50"}, "model"),
        ({"model": "os.system"}, "model"),
    ],
)
def test_bad_values_name_the_key(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidTrainingConfig) as info:
        parse_config(config(**overrides))
    assert info.value.field == field
    assert info.value.errors == [{"field": field, "error": str(info.value).split(": ", 1)[1]}]


def test_dynamic_gets_a_default_interval() -> None:
    assert parse_config(config(load_balance="dynamic")).rebalance_interval == 10
    assert parse_config(config(load_balance="hybrid", rebalance_interval=3)).rebalance_interval == 3


def test_factory_path_model_is_accepted() -> None:
    assert parse_config(config(model="distributed_testing.bench.models:resnet")).model.endswith(":resnet")


def test_auto_resolution_on_cpu_nodes() -> None:
    resolved = resolve(parse_config(config()), cuda_device_count=0, all_cuda=False)
    assert (resolved.nproc_per_node, resolved.backend) == (1, "gloo")


def test_auto_resolution_on_all_cuda_nodes() -> None:
    resolved = resolve(parse_config(config()), cuda_device_count=4, all_cuda=True)
    assert (resolved.nproc_per_node, resolved.backend) == (4, "nccl")


def test_auto_backend_is_gloo_when_some_node_lacks_cuda() -> None:
    resolved = resolve(parse_config(config()), cuda_device_count=2, all_cuda=False)
    assert (resolved.nproc_per_node, resolved.backend) == (2, "gloo")


def test_explicit_gloo_on_cuda_nodes_is_kept() -> None:
    resolved = resolve(parse_config(config(backend="gloo")), cuda_device_count=1, all_cuda=True)
    assert resolved.backend == "gloo"


@pytest.mark.parametrize(
    ("overrides", "cuda", "all_cuda", "field"),
    [
        ({"backend": "nccl"}, 1, False, "backend"),
        ({"precision": "fp16"}, 0, False, "precision"),
        ({"nproc_per_node": 3}, 2, True, "nproc_per_node"),
        ({"batch_size": 7}, 4, True, "batch_size"),
        ({}, 0, True, "backend"),
    ],
)
def test_resolution_errors(overrides: dict[str, Any], cuda: int, all_cuda: bool, field: str) -> None:
    with pytest.raises(InvalidTrainingConfig) as info:
        resolve(parse_config(config(**overrides)), cuda_device_count=cuda, all_cuda=all_cuda)
    assert info.value.field == field


def test_resolved_round_trip() -> None:
    resolved = resolve(parse_config(config(load_balance="hybrid")), cuda_device_count=0, all_cuda=False)
    assert ResolvedTrainingConfig.from_dict(resolved.to_dict()) == resolved
    with pytest.raises(InvalidTrainingConfig, match="extra"):
        ResolvedTrainingConfig.from_dict({**resolved.to_dict(), "extra": 1})
    incomplete = resolved.to_dict()
    del incomplete["steps"]
    with pytest.raises(InvalidTrainingConfig, match="steps"):
        ResolvedTrainingConfig.from_dict(incomplete)
