"""Weights: full-size bert-base from its written config, pretrained checkpoints from the local cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from distributed_testing.bench import RunnerDefaults, run_benchmark
from distributed_testing.errors import ExecutionError


@pytest.mark.timeout(600)  # a hang bound, not a speed check: it took 40 s beside a loaded CI run
def test_full_size_bert_base_builds_and_runs() -> None:
    result = run_benchmark(
        {
            "model": "bert-base-uncased",
            "weights": "random",
            "batch_sizes": [1],
            "sequence_length": 16,
            "warmup": 1,
            "iterations": 1,
            "min_duration_s": 0,
        }
    )
    assert 109_000_000 < result["parameters"] < 111_000_000  # bert-base + MLM head
    assert result["tiny"] is False


def _fake_hub_cache(root: Path, repo_id: str) -> Path:
    """A Hugging Face hub cache layout holding a tiny BERT checkpoint under ``repo_id``."""
    from transformers import BertConfig, BertForMaskedLM

    repo_dir = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / "0123456789abcdef"
    config = BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    BertForMaskedLM(config).save_pretrained(snapshot)
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text("0123456789abcdef")
    return root


def test_pretrained_weights_come_from_the_local_cache(tmp_path: Path) -> None:
    cache = _fake_hub_cache(tmp_path, "google-bert/bert-base-uncased")
    defaults = RunnerDefaults(hf_cache_dir=str(cache))
    config = {"model": "bert-base-uncased", "warmup": 1, "iterations": 1, "min_duration_s": 0, "sequence_length": 8}
    result = run_benchmark(config, defaults=defaults)
    assert result["weights"] == "pretrained"
    assert "google-bert/bert-base-uncased" in result["model_source"]
    assert result["parameters"] < 1_000_000  # the cached checkpoint, not the written config
    forced = run_benchmark({**config, "weights": "random", "tiny": True}, defaults=defaults)
    assert forced["weights"] == "random" and forced["parameters"] != result["parameters"]


def test_pretrained_missing_from_cache_is_an_error(tmp_path: Path) -> None:
    defaults = RunnerDefaults(hf_cache_dir=str(tmp_path))
    with pytest.raises(ExecutionError, match="not in the local Hugging Face cache"):
        run_benchmark({"model": "gpt2", "weights": "pretrained"}, defaults=defaults)
    with pytest.raises(ExecutionError, match="no pretrained weights"):
        run_benchmark({"model": "mlp", "weights": "pretrained"})
    with pytest.raises(ExecutionError, match="cannot be combined with tiny"):
        run_benchmark({"model": "bert-base-uncased", "weights": "pretrained", "tiny": True})
    with pytest.raises(ExecutionError, match="expects image_size 224"):
        run_benchmark({"model": "google/vit-base-patch16-224", "weights": "pretrained", "image_size": 32})
