"""Transformers architectures in the model registry, built without network access.

Each entry carries its published architecture configuration written out in code (the values of
the checkpoint's ``config.json``) and the model class that checkpoint lists in ``architectures``.
Weights: ``from_pretrained(repo, local_files_only=True)`` when the checkpoint's ``config.json`` is
in the local Hugging Face cache, otherwise random initialisation from the written config (seeded).
``weights: "pretrained"`` makes a missing checkpoint an error; ``"random"`` never reads the cache.
A checkpoint that is cached but fails to load raises; it never turns into random weights.

Inputs: text models get random token ids of shape ``(batch, sequence_length)``, all sequences
full length (no padding, so no attention mask); t5 also gets ``decoder_input_ids`` of the same
shape. Vision models get ``pixel_values`` of shape ``(batch, 3, image_size, image_size)``.
Training passes ``labels`` and uses the model's own loss.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from distributed_testing.bench.models_base import BuiltModel, ModelInputs, ModelRequest
from distributed_testing.errors import ExecutionError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HFEntry:
    """One registry architecture: published config values and a tiny variant of it."""

    name: str
    aliases: tuple[str, ...]
    repo_ids: tuple[str, ...]
    config_class: str
    model_class: str
    kind: str  # "text" | "seq2seq" | "image"
    published: dict[str, Any]
    tiny: dict[str, Any]
    runtime: dict[str, Any] = field(default_factory=dict)


_TEXT_RUNTIME = {"use_cache": False}

HF_ENTRIES: tuple[HFEntry, ...] = (
    HFEntry(
        name="bert-base-uncased",
        aliases=("google-bert/bert-base-uncased",),
        repo_ids=("google-bert/bert-base-uncased", "bert-base-uncased"),
        config_class="BertConfig",
        model_class="BertForMaskedLM",
        kind="text",
        published={
            "vocab_size": 30522,
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "intermediate_size": 3072,
            "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1,
            "max_position_embeddings": 512,
            "type_vocab_size": 2,
            "initializer_range": 0.02,
            "layer_norm_eps": 1e-12,
            "pad_token_id": 0,
        },
        tiny={
            "vocab_size": 1024,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 128,
        },
    ),
    HFEntry(
        name="gpt2",
        aliases=("openai-community/gpt2",),
        repo_ids=("openai-community/gpt2", "gpt2"),
        config_class="GPT2Config",
        model_class="GPT2LMHeadModel",
        kind="text",
        published={
            "vocab_size": 50257,
            "n_positions": 1024,
            "n_embd": 768,
            "n_layer": 12,
            "n_head": 12,
            "activation_function": "gelu_new",
            "resid_pdrop": 0.1,
            "embd_pdrop": 0.1,
            "attn_pdrop": 0.1,
            "layer_norm_epsilon": 1e-5,
            "initializer_range": 0.02,
            "bos_token_id": 50256,
            "eos_token_id": 50256,
        },
        tiny={
            "vocab_size": 1024,
            "n_embd": 64,
            "n_layer": 2,
            "n_head": 2,
            "n_positions": 512,
            "bos_token_id": 1023,
            "eos_token_id": 1023,
        },
        runtime=_TEXT_RUNTIME,
    ),
    HFEntry(
        name="t5-small",
        aliases=("google-t5/t5-small",),
        repo_ids=("google-t5/t5-small", "t5-small"),
        config_class="T5Config",
        model_class="T5ForConditionalGeneration",
        kind="seq2seq",
        published={
            "vocab_size": 32128,
            "d_model": 512,
            "d_kv": 64,
            "d_ff": 2048,
            "num_layers": 6,
            "num_decoder_layers": 6,
            "num_heads": 8,
            "relative_attention_num_buckets": 32,
            "dropout_rate": 0.1,
            "layer_norm_epsilon": 1e-6,
            "initializer_factor": 1.0,
            "feed_forward_proj": "relu",
            "is_encoder_decoder": True,
            "pad_token_id": 0,
            "eos_token_id": 1,
            "decoder_start_token_id": 0,
        },
        tiny={
            "vocab_size": 1024,
            "d_model": 64,
            "d_kv": 16,
            "d_ff": 128,
            "num_layers": 2,
            "num_decoder_layers": 2,
            "num_heads": 4,
        },
        runtime=_TEXT_RUNTIME,
    ),
    HFEntry(
        name="vit-base-patch16-224",
        aliases=("google/vit-base-patch16-224",),
        repo_ids=("google/vit-base-patch16-224",),
        config_class="ViTConfig",
        model_class="ViTForImageClassification",
        kind="image",
        published={
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "intermediate_size": 3072,
            "hidden_act": "gelu",
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
            "initializer_range": 0.02,
            "layer_norm_eps": 1e-12,
            "image_size": 224,
            "patch_size": 16,
            "num_channels": 3,
            "qkv_bias": True,
            "num_labels": 1000,
        },
        tiny={
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 128,
            "num_labels": 10,
        },
    ),
    HFEntry(
        name="resnet-50",
        aliases=("microsoft/resnet-50",),
        repo_ids=("microsoft/resnet-50",),
        config_class="ResNetConfig",
        model_class="ResNetForImageClassification",
        kind="image",
        published={
            "num_channels": 3,
            "embedding_size": 64,
            "hidden_sizes": [256, 512, 1024, 2048],
            "depths": [3, 4, 6, 3],
            "layer_type": "bottleneck",
            "hidden_act": "relu",
            "downsample_in_first_stage": False,
            "num_labels": 1000,
        },
        tiny={"embedding_size": 16, "hidden_sizes": [32, 64], "depths": [1, 1], "num_labels": 10},
    ),
)


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise ExecutionError(
            "the 'transformers' package is not installed; it is needed for the registry "
            "models (bert-base-uncased, gpt2, t5-small, vit-base-patch16-224, resnet-50)"
        ) from exc
    return transformers


def cached_repo(entry: HFEntry, cache_dir: str | None) -> str | None:
    """The first of the entry's repo ids whose config.json is in the local HF cache."""
    from huggingface_hub import try_to_load_from_cache

    for repo_id in entry.repo_ids:
        found = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache_dir)
        if isinstance(found, str):
            return repo_id
    return None


def _random_config(entry: HFEntry, request: ModelRequest) -> Any:
    config_cls = getattr(_transformers(), entry.config_class)
    values: dict[str, Any] = dict(entry.published)
    if request.tiny:
        values.update(entry.tiny)
    known = config_cls(**values).to_dict()
    for key in request.model_config:
        if key not in known:
            raise ExecutionError(
                f"config key 'model_config': '{key}' is not a field of {entry.config_class} for model {entry.name}"
            )
    values.update(request.model_config)
    if entry.name.startswith("vit") and "image_size" not in request.model_config:
        values["image_size"] = request.image_size
    values.update(entry.runtime)
    return config_cls(**values)


def _check_pretrained_request(entry: HFEntry, request: ModelRequest) -> None:
    if request.tiny:
        raise ExecutionError(f"weights: pretrained cannot be combined with tiny: true ({entry.name})")
    if request.model_config:
        raise ExecutionError(
            f"model_config overrides change the architecture and cannot be combined with "
            f"pretrained weights for {entry.name}; set weights: random"
        )
    if entry.name.startswith("vit") and request.image_size != entry.published["image_size"]:
        raise ExecutionError(
            f"pretrained {entry.name} expects image_size {entry.published['image_size']}, "
            f"got {request.image_size}; set weights: random to use another size"
        )


def _load_pretrained(entry: HFEntry, repo_id: str, request: ModelRequest) -> nn.Module:
    model_cls = getattr(_transformers(), entry.model_class)
    logger.info("loading %s from the local HF cache (%s)", entry.name, repo_id)
    try:
        model = model_cls.from_pretrained(
            repo_id,
            local_files_only=True,
            cache_dir=request.hf_cache_dir,
            dtype=torch.float32,
            **entry.runtime,
        )
    except (OSError, ValueError) as exc:
        raise ExecutionError(
            f"{entry.name}: checkpoint {repo_id} is in the local HF cache but failed to load: {exc}"
        ) from exc
    if not isinstance(model, nn.Module):
        raise ExecutionError(f"{entry.model_class}.from_pretrained did not return an nn.Module")
    return model


def _choose_weights(entry: HFEntry, request: ModelRequest) -> str | None:
    """The repo id to load from, or None for random weights."""
    if request.weights == "pretrained":
        _check_pretrained_request(entry, request)
    if request.weights == "random" or (request.weights == "auto" and request.tiny):
        return None
    if request.weights == "auto" and request.model_config:
        return None
    repo_id = cached_repo(entry, request.hf_cache_dir)
    if repo_id is None and request.weights == "pretrained":
        raise ExecutionError(
            f"weights: pretrained but {entry.name} is not in the local Hugging Face cache "
            f"(looked for {', '.join(entry.repo_ids)}); downloads are not attempted"
        )
    if repo_id is not None:
        _check_pretrained_request(entry, request)
    return repo_id


def build_hf_model(entry: HFEntry, request: ModelRequest) -> BuiltModel:
    """Instantiate the entry (pretrained from the local cache or random) and its input maker."""
    repo_id = _choose_weights(entry, request)
    if repo_id is not None:
        module = _load_pretrained(entry, repo_id, request)
        weights, source = "pretrained", repo_id
    else:
        config = _random_config(entry, request)
        model_cls = getattr(_transformers(), entry.model_class)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(request.seed)
            module = model_cls(config)
        weights, source = "random", "config"
    config = module.config
    _check_sequence_length(entry, config, request.sequence_length)
    return BuiltModel(
        module=module,
        name=entry.name,
        weights=weights,
        source=f"transformers:{entry.model_class} ({source})",
        input_kind="image" if entry.kind == "image" else "text",
        make_inputs=_input_maker(entry, config, request),
        info={"attn_implementation": getattr(config, "_attn_implementation", None)},
    )


def _check_sequence_length(entry: HFEntry, config: Any, sequence_length: int) -> None:
    if entry.kind == "image":
        return
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if entry.kind == "text" and limit is not None and sequence_length > limit:
        raise ExecutionError(f"sequence_length {sequence_length} exceeds {entry.name}'s {limit} positions")


def _input_maker(entry: HFEntry, config: Any, request: ModelRequest) -> Any:
    seq = request.sequence_length
    size = getattr(config, "image_size", request.image_size) if entry.name.startswith("vit") else request.image_size
    channels = getattr(config, "num_channels", 3)

    def make(batch: int, generator: torch.Generator, with_labels: bool) -> ModelInputs:
        kwargs: dict[str, torch.Tensor] = {}
        if entry.kind == "image":
            kwargs["pixel_values"] = torch.randn(batch, channels, size, size, generator=generator)
            if with_labels:
                kwargs["labels"] = torch.randint(0, config.num_labels, (batch,), generator=generator)
            return ModelInputs(kwargs=kwargs)
        kwargs["input_ids"] = torch.randint(0, config.vocab_size, (batch, seq), generator=generator)
        if entry.kind == "seq2seq":
            kwargs["decoder_input_ids"] = torch.randint(0, config.vocab_size, (batch, seq), generator=generator)
        if with_labels:
            source = "decoder_input_ids" if entry.kind == "seq2seq" else "input_ids"
            kwargs["labels"] = kwargs[source].clone()
        return ModelInputs(kwargs=kwargs)

    return make
