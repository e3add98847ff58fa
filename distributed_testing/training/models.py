"""Model sources for training tasks.

A *model source* is a zero-argument callable returning ``(model, make_batch)``: an ``nn.Module``
and ``make_batch(n) -> (inputs, targets)`` producing ``n`` synthetic samples on the CPU, where
``targets`` are class indices for ``cross_entropy`` (the loss every training task uses). Sources
draw from torch's global RNG; the rank seeds it, so every rank builds identical initial weights.

The task's ``model`` names a built-in source (``mlp``, ``cnn``, ``transformer``) or a factory as
``"package.module:callable"`` (how sources from other packages, e.g. a benchmark model registry,
plug in). A factory path imports code on the worker, so a worker runs one only from a module its
operator allows (``--allow-model-modules``): the worker checks before it launches, and each rank
checks again (:func:`check_model_allowed`) before anything is imported. ``factory`` is one name
(no dots) and must be a function or class defined in an allowed module (not one it imports),
checked after the import and before the call.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from torch import Tensor, nn

from distributed_testing.errors import ExecutionError
from distributed_testing.tasks.usercode import definition_refusal, model_name_error, refusal

MakeBatch = Callable[[int], tuple[Tensor, Tensor]]
ModelSource = Callable[[], tuple[nn.Module, MakeBatch]]

NUM_CLASSES = 10


def mlp(in_features: int = 256, hidden: int = 512, depth: int = 2) -> tuple[nn.Module, MakeBatch]:
    """A ReLU MLP; about 0.4 M parameters with the defaults."""
    layers: list[nn.Module] = []
    width = in_features
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, NUM_CLASSES))
    model = nn.Sequential(*layers)

    def make_batch(n: int) -> tuple[Tensor, Tensor]:
        return torch.randn(n, in_features), torch.randint(0, NUM_CLASSES, (n,))

    return model, make_batch


def cnn(image_size: int = 32) -> tuple[nn.Module, MakeBatch]:
    """A small convolutional classifier on 3 x 32 x 32 images (compute-heavy, few parameters)."""
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, NUM_CLASSES),
    )

    def make_batch(n: int) -> tuple[Tensor, Tensor]:
        return torch.randn(n, 3, image_size, image_size), torch.randint(0, NUM_CLASSES, (n,))

    return model, make_batch


class _TinyTransformer(nn.Module):
    def __init__(self, vocab: int, seq_len: int, d_model: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.position = nn.Parameter(torch.zeros(1, seq_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=4 * d_model, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, NUM_CLASSES)

    def forward(self, tokens: Tensor) -> Tensor:
        hidden = self.encoder(self.embed(tokens) + self.position)
        logits: Tensor = self.head(hidden.mean(dim=1))
        return logits


def transformer(
    vocab: int = 1000, seq_len: int = 32, d_model: int = 64, layers: int = 2
) -> tuple[nn.Module, MakeBatch]:
    """A two-layer transformer encoder classifying token sequences."""
    model = _TinyTransformer(vocab, seq_len, d_model, layers)

    def make_batch(n: int) -> tuple[Tensor, Tensor]:
        return torch.randint(0, vocab, (n, seq_len)), torch.randint(0, NUM_CLASSES, (n,))

    return model, make_batch


BUILTIN_SOURCES: dict[str, ModelSource] = {"mlp": mlp, "cnn": cnn, "transformer": transformer}


def check_model_allowed(name: str, allowed: tuple[str, ...]) -> None:
    """Raise ExecutionError when ``name`` is a factory path from a module outside ``allowed``."""
    if name in BUILTIN_SOURCES:
        return
    reason = refusal(name, allowed)
    if reason is not None:
        raise ExecutionError(reason)


def load_model_source(name: str, allowed: tuple[str, ...] | None = None) -> ModelSource:
    """Return the source a task's ``model`` names; raises ExecutionError when it cannot be loaded,
    or (with ``allowed``, the module prefixes a factory may come from) when it is not allowed or
    not a class or function defined in an allowed module."""
    if name in BUILTIN_SOURCES:
        return BUILTIN_SOURCES[name]
    if ":" not in name:
        raise ExecutionError(f"model {name!r} is not a built-in model nor 'package.module:factory'")
    bad = model_name_error(name) if allowed is None else refusal(name, allowed)
    if bad is not None:
        raise ExecutionError(bad)
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ExecutionError(f"model {name!r}: cannot import {module_name!r}: {exc}") from exc
    source = getattr(module, attr, None)
    if source is not None and allowed is not None and (reason := definition_refusal(name, source, allowed)):
        raise ExecutionError(reason)
    if not callable(source):
        raise ExecutionError(f"model {name!r}: {module_name}.{attr} is missing or not callable")
    return source  # type: ignore[no-any-return]


def build_model(name: str, allowed: tuple[str, ...] | None = None) -> tuple[nn.Module, MakeBatch]:
    """Call the source ``name`` names (:func:`load_model_source`) and check what it returned: a
    factory that returns something else than ``(nn.Module, make_batch)`` is an ExecutionError
    saying what a factory must return, not an unpacking error deep in the rank."""
    made = load_model_source(name, allowed)()
    if (not isinstance(made, tuple) or len(made) != 2 or not isinstance(made[0], nn.Module)
            or not callable(made[1])):
        got = type(made).__name__ + (f" of {len(made)}" if isinstance(made, tuple) else "")
        raise ExecutionError(f"model {name!r}: the factory returned a {got}; a training factory must return "
                             "(model, make_batch): an nn.Module and make_batch(n) -> (inputs, targets), n synthetic "
                             "samples with class-index targets for cross_entropy")
    return made
