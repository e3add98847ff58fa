"""Benchmark task configuration: the accepted keys, their defaults and validation.

A task's ``config`` dict is validated once, here, into a frozen :class:`BenchConfig`. Unknown
keys and bad values raise :class:`~distributed_testing.errors.ExecutionError` naming the key.
Combination rules that depend on the machine (device present, precision supported on it) live in
:mod:`distributed_testing.bench.backends`; rules that are pure config live here.

Keys (default in brackets):

``model`` (required)          registry name, ``mlp``, ``cnn`` or ``module:callable``
``batch_sizes`` [[1]]         list of positive ints, run in the given order
``backend`` [eager]           ``eager`` | ``compile`` (torch.compile) | ``openvino``
``device`` [runner default]   ``cpu`` | ``cuda[:N]`` | ``rocm[:N]`` | ``mps`` (torch);
                              ``cpu`` | ``gpu`` | ``npu`` (openvino)
``precision`` [fp32]          ``fp32`` | ``fp16`` | ``bf16`` | ``int8``
``autocast`` [runner default] bool: torch.autocast mixed precision (needs precision fp32)
``mode`` [inference]          ``inference`` | ``training``
``optimizer`` [sgd]           ``sgd`` | ``adamw`` (training only)
``learning_rate`` [1e-4]      positive float (training only)
``warmup`` [3]                untimed iterations per batch size (>= 1; the first is reported
                              as ``first_call_ms``)
``iterations`` [30]           minimum timed iterations per batch size
``min_duration_s`` [1.0]      minimum timed seconds per batch size (whichever is longer)
``sequence_length`` [128]     text models
``image_size`` [224]          vision models (``vit``, ``resnet-50``, ``cnn``)
``input_shape``               user models only: one input's shape without the batch dim
``tiny`` [false]              a very small variant of the same architecture (random weights)
``model_config`` [{}]         overrides of the architecture config (keys must exist in it)
``weights`` [auto]            ``auto`` (pretrained if in the local HF cache) | ``pretrained``
                              (fail if not cached) | ``random``
``optimize_for`` [latency]    ``latency`` | ``throughput`` (see measure.py)
``cuda_streams`` [1]          concurrent CUDA streams in throughput mode
``seed`` [0]                  seed for random weights and inputs
``threads`` [runner default]  torch intra-op threads for this task (the worker's
                              ``--bench-threads``, itself 1 by default, as in
                              ``torch.utils.benchmark``; more threads are faster only while
                              every one of them has a core to itself: see disturbance.py)
``name``                      free text echoed in the result
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from distributed_testing.errors import ExecutionError

BACKENDS = ("eager", "compile", "openvino")
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
MODES = ("inference", "training")
OPTIMIZERS = ("sgd", "adamw")
WEIGHTS = ("auto", "pretrained", "random")
OPTIMIZE_FOR = ("latency", "throughput")
DEFAULT_THREADS = 1

KNOWN_KEYS = frozenset(
    {
        "model",
        "batch_sizes",
        "backend",
        "device",
        "precision",
        "autocast",
        "mode",
        "optimizer",
        "learning_rate",
        "warmup",
        "iterations",
        "min_duration_s",
        "sequence_length",
        "image_size",
        "input_shape",
        "tiny",
        "model_config",
        "weights",
        "optimize_for",
        "cuda_streams",
        "seed",
        "threads",
        "name",
    }
)
TRAINING_ONLY_KEYS = ("optimizer", "learning_rate")


@dataclass(frozen=True)
class RunnerDefaults:
    """Process-level defaults a worker gives every task it runs.

    ``autocast``: the worker's mixed-precision flag. It turns autocast on for tasks that do not
    set ``autocast`` themselves and whose backend is torch (eager/compile) with precision fp32;
    the result then says ``autocast_source: "runner_default"``. Other tasks are unaffected.
    ``device``: used when a task names no device. ``threads``: torch intra-op threads of a task
    that sets none (``DEFAULT_THREADS`` unless the worker says otherwise). ``hf_cache_dir``: the Hugging Face
    hub cache to look for pretrained checkpoints in (None: huggingface_hub's default).
    ``allow_model_modules``: module prefixes a ``module:callable`` model may come from (the
    worker's ``--allow-model-modules``; the benchmark child always sets it). None: any module, for
    in-process library use only.
    """

    autocast: bool = False
    device: str = "cpu"
    threads: int = DEFAULT_THREADS
    hf_cache_dir: str | None = None
    allow_model_modules: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ExecutionError(f"threads must be >= 1, got {self.threads}")


@dataclass(frozen=True)
class BenchConfig:
    """One validated benchmark task."""

    model: str
    batch_sizes: tuple[int, ...] = (1,)
    backend: str = "eager"
    device: str = "cpu"
    precision: str = "fp32"
    autocast: bool = False
    autocast_source: str = "default"
    mode: str = "inference"
    optimizer: str = "sgd"
    learning_rate: float = 1e-4
    warmup: int = 3
    iterations: int = 30
    min_duration_s: float = 1.0
    sequence_length: int = 128
    image_size: int = 224
    input_shape: tuple[int, ...] | None = None
    tiny: bool = False
    model_config: dict[str, Any] = field(default_factory=dict)
    weights: str = "auto"
    optimize_for: str = "latency"
    cuda_streams: int = 1
    seed: int = 0
    threads: int = 1
    name: str | None = None

    @property
    def is_torch_backend(self) -> bool:
        return self.backend in ("eager", "compile")

    def cache_key(self) -> tuple[Any, ...]:
        """Everything that changes the prepared model object (not the measurement)."""
        overrides = tuple(sorted((k, repr(v)) for k, v in self.model_config.items()))
        return (
            self.model,
            self.backend,
            self.precision,
            self.device,
            self.tiny,
            overrides,
            self.weights,
            self.mode,
            self.optimize_for,
            self.input_shape,
            self.seed,
            self.image_size,
        )


def _fail(key: str, message: str) -> ExecutionError:
    return ExecutionError(f"config key '{key}': {message}")


def _choice(raw: dict[str, Any], key: str, choices: tuple[str, ...], default: str) -> str:
    value = raw.get(key, default)
    if value not in choices:
        raise _fail(key, f"must be one of {', '.join(choices)}; got {value!r}")
    return str(value)


def _int(raw: dict[str, Any], key: str, default: int, minimum: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(key, f"must be an integer >= {minimum}; got {value!r}")
    return value


def _float(raw: dict[str, Any], key: str, default: float, *, positive: bool) -> float:
    value = raw.get(key, default)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise _fail(key, f"must be a finite number {bound}; got {value!r}")
    return float(value)


def _bool(raw: dict[str, Any], key: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise _fail(key, f"must be true or false; got {value!r}")
    return value


def _positive_ints(raw: dict[str, Any], key: str, default: tuple[int, ...]) -> tuple[int, ...]:
    value = raw.get(key, list(default))
    if not isinstance(value, (list, tuple)) or not value:
        raise _fail(key, f"must be a non-empty list of positive integers; got {value!r}")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or item < 1:
            raise _fail(key, f"must be a non-empty list of positive integers; got {value!r}")
    return tuple(value)


def _model_name(raw: dict[str, Any]) -> str:
    value = raw.get("model")
    if not isinstance(value, str) or not value.strip():
        raise _fail("model", f"a model name is required; got {value!r}")
    return value.strip()


def _autocast(raw: dict[str, Any], defaults: RunnerDefaults, backend: str, precision: str) -> tuple[bool, str]:
    if "autocast" in raw:
        return _bool(raw, "autocast", False), "config"
    if defaults.autocast and backend in ("eager", "compile") and precision == "fp32":
        return True, "runner_default"
    return False, "default"


def _check_mode_keys(raw: dict[str, Any], mode: str) -> None:
    if mode != "training":
        for key in TRAINING_ONLY_KEYS:
            if key in raw:
                raise _fail(key, "only applies to mode: training")


def _model_config(raw: dict[str, Any]) -> dict[str, Any]:
    value = raw.get("model_config", {})
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise _fail("model_config", f"must be an object with string keys; got {value!r}")
    return dict(value)


def _input_shape(raw: dict[str, Any]) -> tuple[int, ...] | None:
    if "input_shape" not in raw:
        return None
    return _positive_ints(raw, "input_shape", ())


def _name(raw: dict[str, Any]) -> str | None:
    value = raw.get("name")
    if value is not None and not isinstance(value, str):
        raise _fail("name", f"must be a string; got {value!r}")
    return value


def parse_config(raw: dict[str, Any], defaults: RunnerDefaults | None = None) -> BenchConfig:
    """Validate a task config dict; raises ExecutionError naming the first bad key."""
    if not isinstance(raw, dict):
        raise ExecutionError(f"benchmark config must be an object; got {type(raw).__name__}")
    unknown = sorted(set(raw) - KNOWN_KEYS)
    if unknown:
        raise ExecutionError(f"unknown config key '{unknown[0]}' (known keys: {', '.join(sorted(KNOWN_KEYS))})")
    defaults = defaults or RunnerDefaults()
    backend = _choice(raw, "backend", BACKENDS, "eager")
    precision = _choice(raw, "precision", PRECISIONS, "fp32")
    mode = _choice(raw, "mode", MODES, "inference")
    _check_mode_keys(raw, mode)
    autocast, autocast_source = _autocast(raw, defaults, backend, precision)
    device = raw.get("device", defaults.device)
    if not isinstance(device, str) or not device:
        raise _fail("device", f"must be a device name; got {device!r}")
    return BenchConfig(
        model=_model_name(raw),
        batch_sizes=_positive_ints(raw, "batch_sizes", (1,)),
        backend=backend,
        device=device.strip().lower(),
        precision=precision,
        autocast=autocast,
        autocast_source=autocast_source,
        mode=mode,
        optimizer=_choice(raw, "optimizer", OPTIMIZERS, "sgd"),
        learning_rate=_float(raw, "learning_rate", 1e-4, positive=True),
        warmup=_int(raw, "warmup", 3, 1),
        iterations=_int(raw, "iterations", 30, 1),
        min_duration_s=_float(raw, "min_duration_s", 1.0, positive=False),
        sequence_length=_int(raw, "sequence_length", 128, 1),
        image_size=_int(raw, "image_size", 224, 1),
        input_shape=_input_shape(raw),
        tiny=_bool(raw, "tiny", False),
        model_config=_model_config(raw),
        weights=_choice(raw, "weights", WEIGHTS, "auto"),
        optimize_for=_choice(raw, "optimize_for", OPTIMIZE_FOR, "latency"),
        cuda_streams=_int(raw, "cuda_streams", 1, 1),
        seed=_int(raw, "seed", 0, 0),
        threads=_int(raw, "threads", defaults.threads, 1),
        name=_name(raw),
    )
