"""The model registry on the CPU: tiny variants, full-size bert, user models, local HF cache."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from distributed_testing.bench import known_models, run_benchmark
from distributed_testing.bench.models import build_model
from distributed_testing.bench.models_base import ModelRequest
from distributed_testing.errors import ExecutionError

REGISTRY = [
    "bert-base-uncased",
    "gpt2",
    "t5-small",
    "vit-base-patch16-224",
    "google/vit-base-patch16-224",
    "resnet-50",
    "microsoft/resnet-50",
    "mlp",
    "cnn",
]


@pytest.mark.parametrize("name", REGISTRY)
def test_tiny_registry_model_runs_on_cpu_eager(name: str, fast: dict[str, Any]) -> None:
    result = run_benchmark({"model": name, "batch_sizes": [2], **fast})
    assert result["weights"] == "random"
    assert result["device"] == "cpu" and result["backend"] == "eager"
    (batch,) = result["batch_results"]
    assert batch["batch_size"] == 2 and batch["iterations"] == 2
    stats = batch["latency_ms"]
    assert 0 < stats["min"] <= stats["median"] <= stats["max"]
    assert batch["throughput_items_s"] > 0
    assert batch["peak_memory_mb"] > 0 and batch["memory_source"] in ("proc_status_vmhwm", "ru_maxrss_process_lifetime")
    assert result["environment"]["fingerprint_hash"]
    assert result["compile_time_s"] is None
    assert len(result["load_average"]["before"]) == 3


def test_t5_gets_decoder_inputs_and_text_models_sequence_length() -> None:
    built = build_model(ModelRequest("t5-small", tiny=True, sequence_length=7))
    inputs = built.make_inputs(3, torch.Generator().manual_seed(0), False)
    assert set(inputs.kwargs) == {"input_ids", "decoder_input_ids"}
    assert inputs.kwargs["decoder_input_ids"].shape == (3, 7)
    vit = build_model(ModelRequest("vit-base-patch16-224", tiny=True, image_size=48))
    pixels = vit.make_inputs(2, torch.Generator(), False).kwargs["pixel_values"]
    assert pixels.shape == (2, 3, 48, 48)


def test_unknown_model_lists_known_names() -> None:
    with pytest.raises(ExecutionError) as info:
        run_benchmark({"model": "llama-70b"})
    message = str(info.value)
    for name in known_models():
        assert name in message
    assert "module:callable" in message


def test_model_config_override_and_unknown_field(fast: dict[str, Any]) -> None:
    result = run_benchmark({"model": "mlp", "model_config": {"hidden_size": 16}, **fast})
    assert result["model_info"]["config"]["hidden_size"] == 16
    with pytest.raises(ExecutionError, match="'n_layers' is not a field of GPT2Config"):
        run_benchmark({"model": "gpt2", "model_config": {"n_layers": 1}, **fast})
    with pytest.raises(ExecutionError, match="input_shape' only applies"):
        run_benchmark({"model": "mlp", "input_shape": [4], **fast})


def test_sequence_longer_than_positions_is_refused(fast: dict[str, Any]) -> None:
    with pytest.raises(ExecutionError, match="exceeds"):
        run_benchmark({**fast, "model": "bert-base-uncased", "sequence_length": 4096})


USER_MODULE = """
import torch

class Doubler(torch.nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.linear = torch.nn.Linear(width, width)
        self.input_shape = (width,)

    def forward(self, x):
        return self.linear(x) * 2

def make(width=8):
    return Doubler(width)

def make_conv():
    return torch.nn.Conv2d(3, 4, 3)

def not_a_module():
    return 42
"""


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "bench_user_models.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "bench_user_models"
    sys.modules.pop("bench_user_models", None)


def test_user_model_module_callable(user_module: str) -> None:
    base = {"warmup": 1, "iterations": 2, "min_duration_s": 0, "batch_sizes": [1, 3]}
    result = run_benchmark({"model": f"{user_module}:make", "model_config": {"width": 6}, **base})
    assert result["weights"] == "user-defined"
    assert result["model_info"]["input_shape"] == [6]
    assert [b["batch_size"] for b in result["batch_results"]] == [1, 3]
    conv = run_benchmark({"model": f"{user_module}:make_conv", "input_shape": [3, 8, 8], **base})
    assert conv["inputs"]["input_shape"] == [3, 8, 8]


def test_user_model_errors(user_module: str) -> None:
    with pytest.raises(ExecutionError, match="needs an input shape"):
        run_benchmark({"model": f"{user_module}:make_conv"})
    with pytest.raises(ExecutionError, match="expected torch.nn.Module"):
        run_benchmark({"model": f"{user_module}:not_a_module", "input_shape": [1]})
    with pytest.raises(ExecutionError, match="cannot import module"):
        run_benchmark({"model": "no_such_module_xyz:make"})
    with pytest.raises(ExecutionError, match="has no attribute"):
        run_benchmark({"model": f"{user_module}:missing"})


def test_random_weights_are_seeded(fast: dict[str, Any]) -> None:
    first = build_model(ModelRequest("gpt2", tiny=True, seed=3)).module.state_dict()
    second = build_model(ModelRequest("gpt2", tiny=True, seed=3)).module.state_dict()
    other = build_model(ModelRequest("gpt2", tiny=True, seed=4)).module.state_dict()
    key = "transformer.h.0.attn.c_attn.weight"
    assert torch.equal(first[key], second[key])
    assert not torch.equal(first[key], other[key])
