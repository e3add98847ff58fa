"""Types shared by the model builders: what is asked for, what is built, what is fed to it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class ModelRequest:
    """The part of a benchmark config that decides which model object is built."""

    name: str
    tiny: bool = False
    model_config: dict[str, Any] = field(default_factory=dict)
    weights: str = "auto"
    seed: int = 0
    sequence_length: int = 128
    image_size: int = 224
    input_shape: tuple[int, ...] | None = None
    hf_cache_dir: str | None = None
    allow_model_modules: tuple[str, ...] | None = None  # None: any module (in-process use only)


@dataclass(frozen=True)
class ModelInputs:
    """One batch: positional and keyword tensors for ``forward``, plus a training target.

    ``target`` is not passed to ``forward``; the built model's ``loss`` uses it.
    """

    args: tuple[torch.Tensor, ...] = ()
    kwargs: dict[str, torch.Tensor] = field(default_factory=dict)
    target: torch.Tensor | None = None

    def tensors(self) -> list[torch.Tensor]:
        return [*self.args, *self.kwargs.values()]

    def to(
        self,
        device: torch.device,
        float_dtype: torch.dtype | None = None,
        channels_last: bool = False,
    ) -> ModelInputs:
        """Copy to ``device``; floating tensors optionally cast, 4-D ones optionally NHWC."""

        def move(tensor: torch.Tensor) -> torch.Tensor:
            out = tensor.to(device)
            if float_dtype is not None and out.is_floating_point():
                out = out.to(float_dtype)
            if channels_last and out.dim() == 4:
                out = out.contiguous(memory_format=torch.channels_last)
            return out

        return replace(
            self,
            args=tuple(move(t) for t in self.args),
            kwargs={k: move(v) for k, v in self.kwargs.items()},
            target=self.target.to(device) if self.target is not None else None,
        )

    def call(self, module: Callable[..., Any]) -> Any:
        return module(*self.args, **self.kwargs)


InputMaker = Callable[[int, torch.Generator, bool], ModelInputs]
"""``make(batch_size, generator, with_labels)`` -> one batch of inputs on the CPU."""


def first_tensor(output: Any) -> torch.Tensor:
    """The first tensor of a model output (tensor, tuple/list, dict or ModelOutput)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict):
        values: list[Any] = list(output.values())
    elif isinstance(output, (tuple, list)):
        values = list(output)
    else:
        raise TypeError(f"cannot find a tensor in model output of type {type(output).__name__}")
    for value in values:
        if isinstance(value, torch.Tensor):
            return value
    raise TypeError(f"model output of type {type(output).__name__} holds no tensor")


def default_loss(output: Any, inputs: ModelInputs) -> torch.Tensor:
    """Loss used in training mode.

    A model that computes its own loss (transformers models given ``labels``) returns it as
    ``output.loss``; a classifier with a ``target`` gets cross-entropy; anything else gets the
    mean square of its first output tensor (a real backward through the whole graph).
    """
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    tensor = first_tensor(output)
    if inputs.target is not None:
        return nn.functional.cross_entropy(tensor.float(), inputs.target)
    return tensor.float().pow(2).mean()


@dataclass
class BuiltModel:
    """A freshly built fp32 CPU model and the means to feed and train it."""

    module: nn.Module
    name: str
    weights: str  # "pretrained" | "random" | "user-defined"
    source: str
    input_kind: str  # "text" | "image" | "tensor"
    make_inputs: InputMaker
    loss: Callable[[Any, ModelInputs], torch.Tensor] = default_loss
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.module.parameters())
