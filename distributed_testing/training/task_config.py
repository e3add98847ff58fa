"""The ``training`` task config: validation and per-node resolution.

Task JSON (every key but the required ones may be left out)::

    {"model": "mlp",                  # required: built-in name or "package.module:factory"
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

The config is validated at submit against
:class:`distributed_testing.tasks.configs.TrainingConfig` (the task kind's struct, with its
cross-field rules); :func:`parse_config` decodes that struct into the runner's
:class:`TrainingConfig` and raises
:class:`~distributed_testing.training.errors.InvalidTrainingConfig` naming the key when a caller
bypassed submit.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from distributed_testing.tasks import configs as task_configs
from distributed_testing.training.errors import InvalidTrainingConfig

DEFAULT_WARMUP_STEPS = 5
DEFAULT_REBALANCE_INTERVAL = 10

Backend = Literal["gloo", "nccl"]
Precision = Literal["fp32", "bf16", "fp16"]
LoadBalance = Literal["none", "proportional", "dynamic", "hybrid"]

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
    """The runner's view of a task config (a legacy ``"kind": "training"`` key is ignored).
    Unknown keys and bad values raise InvalidTrainingConfig, naming the key."""
    if not isinstance(raw, Mapping):
        raise InvalidTrainingConfig("", f"config must be an object, got {type(raw).__name__}")
    if raw.get("kind", "training") != "training":
        raise InvalidTrainingConfig("kind", f"must be 'training', got {raw['kind']!r}")
    plain = {k: v for k, v in raw.items() if k != "kind"}
    try:
        cfg = msgspec.convert(plain, task_configs.TrainingConfig)
    except msgspec.ValidationError as exc:
        if (unknown := re.search(r"unknown field `(\w+)`", str(exc))) is not None:
            raise InvalidTrainingConfig(unknown.group(1), "unknown key") from exc
        if (missing := re.search(r"missing required field `(\w+)`", str(exc))) is not None:
            raise InvalidTrainingConfig(missing.group(1), "required") from exc
        where = re.search(r"at `\$\.(\w+)", str(exc))
        raise InvalidTrainingConfig(where.group(1) if where else "", str(exc)) from exc
    problems = task_configs.check_training(plain, cfg)
    if problems:
        raise InvalidTrainingConfig(*problems[0])
    interval = cfg.rebalance_interval
    if cfg.load_balance in ("dynamic", "hybrid") and interval is None:
        interval = DEFAULT_REBALANCE_INTERVAL
    return TrainingConfig(model=cfg.model, nodes=cfg.nodes, batch_size=cfg.batch_size, steps=cfg.steps,
                          warmup_steps=cfg.warmup_steps, nproc_per_node=cfg.nproc_per_node, backend=cfg.backend,
                          precision=cfg.precision, load_balance=cfg.load_balance, rebalance_interval=interval)


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
