"""The model registry: named architectures, two built-in torch models and user models.

Names (aliases in brackets):

* ``bert-base-uncased`` [google-bert/bert-base-uncased], ``gpt2`` [openai-community/gpt2],
  ``t5-small`` [google-t5/t5-small], ``vit-base-patch16-224`` [google/vit-base-patch16-224],
  ``resnet-50`` [microsoft/resnet-50]: transformers models, see :mod:`.hf_models`.
* ``mlp``: ``num_layers`` Linear layers with ReLU between them, input ``(batch, in_features)``.
* ``cnn``: strided 3x3 Conv-BatchNorm-ReLU stages, global average pool and a Linear classifier,
  input ``(batch, 3, image_size, image_size)``.
* ``package.module:callable``: ``callable(**model_config)`` must return an ``nn.Module`` taking
  one float tensor of shape ``(batch, *input_shape)``; ``input_shape`` comes from the config or
  from an ``input_shape`` attribute of the returned module (a 3-dim shape counts as an image,
  ``(channels, height, width)``). Its weights are whatever the callable made
  (``weights: "user-defined"``). The module must be one the worker's operator allows
  (``ModelRequest.allow_model_modules``, from ``--allow-model-modules``); it is checked before
  anything is imported, and ``callable`` (one name, no dots) must be a class or function defined
  in an allowed module, checked before it is called (:mod:`distributed_testing.tasks.usercode`).

``tiny: true`` builds a few-layer, narrow variant of the same architecture (random weights);
``model_config`` overrides single architecture fields (unknown fields are rejected).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from distributed_testing.bench.hf_models import HF_ENTRIES, HFEntry, build_hf_model
from distributed_testing.bench.models_base import BuiltModel, ModelInputs, ModelRequest
from distributed_testing.errors import ExecutionError
from distributed_testing.tasks import usercode

logger = logging.getLogger(__name__)

MLP_DEFAULTS: dict[str, Any] = {
    "in_features": 1024,
    "hidden_size": 2048,
    "num_layers": 3,
    "num_classes": 1000,
}
MLP_TINY: dict[str, Any] = {"in_features": 64, "hidden_size": 128, "num_layers": 2, "num_classes": 10}
CNN_DEFAULTS: dict[str, Any] = {"channels": [32, 64, 128, 256], "num_classes": 1000}
CNN_TINY: dict[str, Any] = {"channels": [8, 16], "num_classes": 10}
BUILTIN_MODELS = ("mlp", "cnn")

_HF_BY_NAME: dict[str, HFEntry] = {}
for _entry in HF_ENTRIES:
    _HF_BY_NAME[_entry.name] = _entry
    for _alias in _entry.aliases:
        _HF_BY_NAME[_alias] = _entry


def known_models() -> list[str]:
    """Canonical registry names (aliases excluded), then the built-ins."""
    return [entry.name for entry in HF_ENTRIES] + list(BUILTIN_MODELS)


def is_user_model(name: str) -> bool:
    return usercode.is_user_model(name) and name not in _HF_BY_NAME


def canonical_name(name: str) -> str:
    """Registry name for ``name`` (alias resolved); user models are returned unchanged."""
    if name in _HF_BY_NAME:
        return _HF_BY_NAME[name].name
    if name in BUILTIN_MODELS or is_user_model(name):
        return name
    aliases = sorted(alias for entry in HF_ENTRIES for alias in entry.aliases)
    raise ExecutionError(
        f"unknown model '{name}'. Known models: {', '.join(known_models())} "
        f"(aliases: {', '.join(aliases)}); or give a user model as 'package.module:callable'"
    )


def build_model(request: ModelRequest) -> BuiltModel:
    """Build the requested model in fp32 on the CPU (the backend moves and converts it)."""
    name = canonical_name(request.name)
    if request.input_shape is not None and not is_user_model(name):
        raise ExecutionError(
            "config key 'input_shape' only applies to 'module:callable' models; registry models "
            "take sequence_length / image_size and model_config"
        )
    if name in _HF_BY_NAME:
        return build_hf_model(_HF_BY_NAME[name], request)
    if name in BUILTIN_MODELS:
        return _build_builtin(name, request)
    return _build_user_model(name, request)


def _merged(name: str, request: ModelRequest, defaults: dict[str, Any], tiny: dict[str, Any]) -> dict[str, Any]:
    values = dict(defaults)
    if request.tiny:
        values.update(tiny)
    for key in request.model_config:
        if key not in defaults:
            raise ExecutionError(
                f"config key 'model_config': '{key}' is not a field of built-in model {name} "
                f"(fields: {', '.join(sorted(defaults))})"
            )
    values.update(request.model_config)
    return values


def make_mlp(in_features: int, hidden_size: int, num_layers: int, num_classes: int) -> nn.Module:
    if num_layers < 1:
        raise ExecutionError(f"mlp num_layers must be >= 1, got {num_layers}")
    widths = [in_features] + [hidden_size] * (num_layers - 1) + [num_classes]
    layers: list[nn.Module] = []
    for index in range(num_layers):
        layers.append(nn.Linear(widths[index], widths[index + 1]))
        if index < num_layers - 1:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def make_cnn(channels: list[int], num_classes: int) -> nn.Module:
    if not channels:
        raise ExecutionError("cnn channels must not be empty")
    layers: list[nn.Module] = []
    previous = 3
    for width in channels:
        layers += [nn.Conv2d(previous, width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
        previous = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(previous, num_classes)]
    return nn.Sequential(*layers)


def _classifier_inputs(shape: tuple[int, ...], num_classes: int) -> Callable[..., ModelInputs]:
    def make(batch: int, generator: torch.Generator, with_labels: bool) -> ModelInputs:
        data = torch.randn(batch, *shape, generator=generator)
        target = torch.randint(0, num_classes, (batch,), generator=generator) if with_labels else None
        return ModelInputs(args=(data,), target=target)

    return make


def _build_builtin(name: str, request: ModelRequest) -> BuiltModel:
    if request.weights == "pretrained":
        raise ExecutionError(f"built-in model {name} has no pretrained weights; use weights: random")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(request.seed)
        if name == "mlp":
            values = _merged(name, request, MLP_DEFAULTS, MLP_TINY)
            module = make_mlp(**values)
            shape: tuple[int, ...] = (values["in_features"],)
            kind = "tensor"
        else:
            values = _merged(name, request, CNN_DEFAULTS, CNN_TINY)
            module = make_cnn(list(values["channels"]), values["num_classes"])
            shape = (3, request.image_size, request.image_size)
            kind = "image"
    return BuiltModel(
        module=module,
        name=name,
        weights="random",
        source=f"builtin:{name}",
        input_kind=kind,
        make_inputs=_classifier_inputs(shape, values["num_classes"]),
        info={"config": values},
    )


def _import_callable(name: str, allowed: tuple[str, ...] | None) -> Callable[..., Any]:
    """The class or function ``name`` (``module:attr``) names; with ``allowed`` (None: any module,
    in-process use only) the module must be allowed and the object defined in an allowed module."""
    bad = usercode.model_name_error(name) if allowed is None else usercode.refusal(name, allowed)
    if bad is not None:
        raise ExecutionError(bad)
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ExecutionError(f"user model '{name}': cannot import module '{module_name}': {exc}") from exc
    if not hasattr(module, attr):
        raise ExecutionError(f"user model '{name}': '{module_name}' has no attribute '{attr}'")
    target = getattr(module, attr)
    if allowed is not None and (reason := usercode.definition_refusal(name, target, allowed)) is not None:
        raise ExecutionError(reason)
    if not callable(target):
        raise ExecutionError(f"user model '{name}': '{attr}' is not callable")
    return target  # type: ignore[no-any-return]


def _build_user_model(name: str, request: ModelRequest) -> BuiltModel:
    if request.tiny:
        raise ExecutionError(f"tiny: true only applies to registry and built-in models, not {name}")
    if request.weights == "pretrained":
        raise ExecutionError(
            f"user model {name}: weights are whatever the callable builds; weights: pretrained does not apply"
        )
    factory = _import_callable(name, request.allow_model_modules)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(request.seed)
        module = factory(**request.model_config)
    if not isinstance(module, nn.Module):
        raise ExecutionError(f"user model '{name}' returned {type(module).__name__}, expected torch.nn.Module")
    shape = request.input_shape or getattr(module, "input_shape", None)
    if not shape:
        raise ExecutionError(
            f"user model '{name}' needs an input shape: set config key 'input_shape' "
            "(without the batch dimension) or give the module an 'input_shape' attribute"
        )
    dims = tuple(int(d) for d in shape)

    def make(batch: int, generator: torch.Generator, with_labels: bool) -> ModelInputs:
        return ModelInputs(args=(torch.randn(batch, *dims, generator=generator),))

    return BuiltModel(
        module=module,
        name=name,
        weights="user-defined",
        source=f"user:{name}",
        input_kind="image" if len(dims) == 3 else "tensor",
        make_inputs=make,
        info={"input_shape": list(dims)},
    )
