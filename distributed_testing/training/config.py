"""The ``training`` task config: validation and per-node resolution.

Task JSON (every key but the required ones may be left out)::

    {"kind": "training",              # optional; must be "training" when present
     "model": "mlp",                  # required: built-in name or "package.module:factory"
     "nodes": 2,                      # required: number of worker machines
     "nproc_per_node": "auto",        # "auto" or an int >= 1 (ranks per node)
     "batch_size": 256,               # required: GLOBAL batch per optimizer step (see below)
     "steps": 50,                     # required: measured steps
     "warmup_steps": 5,               # unmeasured steps before them (and the profiling phase)
     "backend": "auto",               # "auto" | "gloo" | "nccl"
     "precision": "fp32",             # "fp32" | "bf16" | "fp16" (fp16 needs CUDA on every node)
     "load_balance": "none",          # "none" | "proportional" | "dynamic" | "hybrid"
     "rebalance_interval": 10}        # steps between re-measurements; dynamic/hybrid only

**Batch semantics.** ``batch_size`` is the *global* batch: the number of samples that together make
one optimizer step across every rank of every node. It never changes with the number of ranks, so
runs on 1 and on N nodes train on the same effective batch and their throughputs compare directly.
The load-balancing policy decides how the global batch is split into per-rank local batches; each
local batch is at least 1, so ``batch_size`` must be at least the world size.

**Resolution.** ``nproc_per_node: "auto"`` is one rank per CUDA device on nodes that have CUDA, else
one rank. ``backend: "auto"`` is ``nccl`` only when every node of the job has CUDA (the coordinator
knows and passes ``all_cuda``), else ``gloo``. A node with CUDA runs its ranks on its CUDA devices
(one device per local rank) whatever the backend; gloo reduces CUDA tensors through host memory.

Validation raises :class:`~distributed_testing.training.errors.InvalidTrainingConfig` naming the key.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from distributed_testing.training.errors import InvalidTrainingConfig

TASK_KIND = "training"
BUILTIN_MODELS = frozenset({"mlp", "cnn", "transformer"})
BACKENDS = ("auto", "gloo", "nccl")
PRECISIONS = ("fp32", "bf16", "fp16")
LOAD_BALANCE = ("none", "proportional", "dynamic", "hybrid")
DEFAULT_WARMUP_STEPS = 5
DEFAULT_REBALANCE_INTERVAL = 10

Backend = Literal["gloo", "nccl"]
Precision = Literal["fp32", "bf16", "fp16"]
LoadBalance = Literal["none", "proportional", "dynamic", "hybrid"]

_REQUIRED = ("model", "nodes", "batch_size", "steps")
_OPTIONAL = (
    "kind",
    "nproc_per_node",
    "warmup_steps",
    "backend",
    "precision",
    "load_balance",
    "rebalance_interval",
)
_FACTORY_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


@dataclass(frozen=True)
class TrainingConfig:
    """A validated task config; ``nproc_per_node`` and ``backend`` may still be ``"auto"``."""

    model: str
    nodes: int
    batch_size: int
    steps: int
    warmup_steps: int = DEFAULT_WARMUP_STEPS
    nproc_per_node: int | Literal["auto"] = "auto"
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    precision: Precision = "fp32"
    load_balance: LoadBalance = "none"
    rebalance_interval: int | None = None

    @property
    def uses_rebalance_interval(self) -> bool:
        return self.load_balance in ("dynamic", "hybrid")


@dataclass(frozen=True)
class ResolvedTrainingConfig:
    """A config with every ``auto`` resolved for one node. This is what the ranks receive."""

    model: str
    nodes: int
    nproc_per_node: int
    batch_size: int
    steps: int
    warmup_steps: int
    backend: Backend
    precision: Precision
    load_balance: LoadBalance
    rebalance_interval: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ResolvedTrainingConfig:
        """Rebuild from :meth:`to_dict` output; unknown or missing keys raise."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - names)
        if unknown:
            raise InvalidTrainingConfig(unknown[0], "unknown key in resolved config")
        missing = sorted(names - set(raw))
        if missing:
            raise InvalidTrainingConfig(missing[0], "missing from resolved config")
        return cls(**raw)


def parse_config(raw: Mapping[str, Any]) -> TrainingConfig:
    """Validate a task config dict. Unknown keys and bad values raise, naming the key."""
    if not isinstance(raw, Mapping):
        raise InvalidTrainingConfig("", f"config must be an object, got {type(raw).__name__}")
    for key in raw:
        if key not in _REQUIRED and key not in _OPTIONAL:
            raise InvalidTrainingConfig(str(key), "unknown key")
    for key in _REQUIRED:
        if key not in raw:
            raise InvalidTrainingConfig(key, "required")
    if raw.get("kind", TASK_KIND) != TASK_KIND:
        raise InvalidTrainingConfig("kind", f"must be {TASK_KIND!r}, got {raw['kind']!r}")
    load_balance = _choice(raw, "load_balance", LOAD_BALANCE, "none")
    config = TrainingConfig(
        model=_model(raw["model"]),
        nodes=_int(raw, "nodes", minimum=1),
        batch_size=_int(raw, "batch_size", minimum=1),
        steps=_int(raw, "steps", minimum=1),
        warmup_steps=_int(raw, "warmup_steps", minimum=0, default=DEFAULT_WARMUP_STEPS),
        nproc_per_node=_nproc(raw.get("nproc_per_node", "auto")),
        backend=cast(Any, _choice(raw, "backend", BACKENDS, "auto")),
        precision=cast(Precision, _choice(raw, "precision", PRECISIONS, "fp32")),
        load_balance=cast(LoadBalance, load_balance),
        rebalance_interval=_rebalance_interval(raw, load_balance),
    )
    _check_combinations(config)
    return config


def resolve(config: TrainingConfig, *, cuda_device_count: int, all_cuda: bool) -> ResolvedTrainingConfig:
    """Resolve ``auto`` values for a node with ``cuda_device_count`` devices.

    ``all_cuda`` says whether every node of the job has CUDA (the coordinator knows).
    """
    if cuda_device_count < 0:
        raise InvalidTrainingConfig("nproc_per_node", "cuda_device_count must be >= 0")
    if all_cuda and cuda_device_count == 0:
        raise InvalidTrainingConfig("backend", "all_cuda is true but this node has no CUDA device")
    nproc = config.nproc_per_node
    if nproc == "auto":
        nproc = cuda_device_count if cuda_device_count > 0 else 1
    if cuda_device_count > 0 and nproc > cuda_device_count:
        raise InvalidTrainingConfig(
            "nproc_per_node",
            f"{nproc} ranks but this node has {cuda_device_count} CUDA device(s); a CUDA node runs one rank per device",
        )
    backend: Backend = "nccl" if config.backend == "auto" and all_cuda else "gloo"
    if config.backend == "nccl":
        if not all_cuda:
            raise InvalidTrainingConfig("backend", "nccl needs CUDA on every node (all_cuda is false)")
        backend = "nccl"
    if config.precision == "fp16" and not all_cuda:
        raise InvalidTrainingConfig("precision", "fp16 needs CUDA on every node; use bf16 or fp32")
    world = config.nodes * nproc
    if config.batch_size < world:
        raise InvalidTrainingConfig(
            "batch_size",
            f"global batch {config.batch_size} is smaller than the world size {world} "
            f"({config.nodes} nodes x {nproc} ranks); every rank needs at least one sample",
        )
    return ResolvedTrainingConfig(
        model=config.model,
        nodes=config.nodes,
        nproc_per_node=nproc,
        batch_size=config.batch_size,
        steps=config.steps,
        warmup_steps=config.warmup_steps,
        backend=backend,
        precision=config.precision,
        load_balance=config.load_balance,
        rebalance_interval=config.rebalance_interval or 0,
    )


def _check_combinations(config: TrainingConfig) -> None:
    if config.batch_size < config.nodes:
        raise InvalidTrainingConfig(
            "batch_size", f"global batch {config.batch_size} is smaller than nodes={config.nodes}"
        )
    if isinstance(config.nproc_per_node, int) and config.batch_size < config.nodes * config.nproc_per_node:
        raise InvalidTrainingConfig(
            "batch_size",
            f"global batch {config.batch_size} is smaller than the world size {config.nodes * config.nproc_per_node}",
        )
    if config.load_balance in ("proportional", "hybrid") and config.warmup_steps < 1:
        raise InvalidTrainingConfig(
            "warmup_steps", f"{config.load_balance} profiles during warmup; needs warmup_steps >= 1"
        )


def _int(raw: Mapping[str, Any], key: str, *, minimum: int, default: int | None = None) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTrainingConfig(key, f"must be an integer, got {value!r}")
    if value < minimum:
        raise InvalidTrainingConfig(key, f"must be >= {minimum}, got {value}")
    return value


def _choice(raw: Mapping[str, Any], key: str, allowed: tuple[str, ...], default: str) -> str:
    value = raw.get(key, default)
    if value not in allowed:
        raise InvalidTrainingConfig(key, f"must be one of {', '.join(allowed)}; got {value!r}")
    return str(value)


def _model(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidTrainingConfig("model", f"must be a non-empty string, got {value!r}")
    if value not in BUILTIN_MODELS and not _FACTORY_PATH.match(value):
        raise InvalidTrainingConfig(
            "model",
            f"{value!r} is neither a built-in model ({', '.join(sorted(BUILTIN_MODELS))}) "
            "nor a 'package.module:factory' path",
        )
    return value


def _nproc(value: Any) -> int | Literal["auto"]:
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidTrainingConfig("nproc_per_node", f"must be 'auto' or an integer >= 1, got {value!r}")
    return value


def _rebalance_interval(raw: Mapping[str, Any], load_balance: str) -> int | None:
    if load_balance not in ("dynamic", "hybrid"):
        if "rebalance_interval" in raw:
            raise InvalidTrainingConfig(
                "rebalance_interval", f"only applies to dynamic or hybrid, not {load_balance!r}"
            )
        return None
    return _int(raw, "rebalance_interval", minimum=1, default=DEFAULT_REBALANCE_INTERVAL)
