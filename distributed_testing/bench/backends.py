"""Devices, precisions and the torch backends (``eager`` and ``compile``).

Devices: ``cpu``; ``cuda[:N]`` (a CUDA build of torch with a visible device); ``rocm[:N]`` (a
ROCm/HIP build of torch: torch calls the device "cuda", and this name is only accepted when
``torch.version.hip`` is set); ``mps`` (Apple). An unavailable device is an ExecutionError saying
why. OpenVINO devices are handled in :mod:`.openvino_backend`.

Supported combinations, decided from what torch 2.13 actually runs (anything else fails with
the reason; nothing falls back):

============  ===========================================================================
precision     torch eager / compile
============  ===========================================================================
fp32          every device
fp16          every device. On CPUs without AVX512-FP16/AMX-FP16 torch computes it through
              conversions, so it is usually slower than fp32 there: that is what it measures,
              and the result says so (``model_info.cpu_native_fp16``).
bf16          every device (CPUs without AVX512-BF16/AMX-BF16 convert the same way;
              ``model_info.cpu_native_bf16``)
int8          eager on cpu only: ``torch.ao.quantization.quantize_dynamic`` of every
              ``nn.Linear`` (weights int8, activations quantized per batch at run time). Not
              for compile, training, or GPUs. A model without Linear layers is an error; the
              result reports ``int8_quantized_param_fraction``.
============  ===========================================================================

``autocast: true`` runs the fp32 model under ``torch.autocast`` (bf16 on cpu, fp16 on cuda,
rocm and mps); it needs precision fp32 and a torch backend. ``cuda_streams > 1`` needs a
CUDA/ROCm device, ``optimize_for: throughput`` and inference mode. ``backend: compile`` needs a
C++ compiler for inductor on the CPU; its absence surfaces as the compile error.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from distributed_testing.bench.env import cpu_flags
from distributed_testing.bench.measure import Workload, memory_tracker
from distributed_testing.bench.models_base import BuiltModel, ModelInputs
from distributed_testing.bench.task_config import BenchConfig
from distributed_testing.errors import ExecutionError
from distributed_testing.tasks.configs import combination_problems

logger = logging.getLogger(__name__)

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
AUTOCAST_DTYPES = {"cpu": torch.bfloat16, "cuda": torch.float16, "mps": torch.float16}


class Engine(Protocol):
    """A prepared model on its backend: makes the workload for one batch size."""

    def workload(self, cfg: BenchConfig, batch_size: int) -> Workload: ...

    def device_name(self) -> str | None: ...


@dataclass
class PreparedModel:
    """What the model cache holds: the built model on its backend, ready to measure."""

    built: BuiltModel
    engine: Engine
    device_label: str
    torch_device: torch.device | None
    load_time_s: float
    convert_time_s: float | None = None
    info: dict[str, Any] = field(default_factory=dict)


def _cuda_device(kind: str, index: int) -> torch.device:
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        raise ExecutionError(f"device '{kind}': no GPU is visible to this process (torch.cuda.device_count() == 0)")
    count = torch.cuda.device_count()
    if index >= count:
        raise ExecutionError(f"device '{kind}:{index}': only {count} device(s) visible")
    return torch.device("cuda", index)


def _parse_index(name: str) -> tuple[str, int]:
    kind, _, index = name.partition(":")
    if not index:
        return kind, 0
    if not index.isdigit():
        raise ExecutionError(f"device '{name}': the index must be a non-negative integer")
    return kind, int(index)


def resolve_torch_device(name: str) -> torch.device:
    """The torch device for a config device name, or ExecutionError with the reason."""
    kind, index = _parse_index(name)
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "cuda":
        if torch.version.cuda is None:
            if torch.version.hip is not None:
                raise ExecutionError(
                    f"device 'cuda': this torch is a ROCm (HIP {torch.version.hip}) build; request device 'rocm'"
                )
            raise ExecutionError(
                f"device 'cuda': torch {torch.__version__} was built without CUDA (torch.version.cuda is None)"
            )
        return _cuda_device(kind, index)
    if kind == "rocm":
        if torch.version.hip is None:
            raise ExecutionError(
                f"device 'rocm': torch {torch.__version__} is not a ROCm build (torch.version.hip is None)"
            )
        return _cuda_device(kind, index)
    if kind == "mps":
        if not torch.backends.mps.is_built():
            raise ExecutionError(f"device 'mps': torch {torch.__version__} was built without MPS")
        if not torch.backends.mps.is_available():
            raise ExecutionError(
                "device 'mps': MPS is built but not available on this machine (needs Apple silicon / macOS 12.3+)"
            )
        return torch.device("mps")
    raise ExecutionError(f"unknown device '{name}' for backend torch (known: cpu, cuda[:N], rocm[:N], mps)")


def check_config_combination(cfg: BenchConfig) -> None:
    """Reject combinations that are unsupported whatever the machine (the rules submission
    checks too: ``tasks.configs.combination_problems``), with the worker's defaults applied."""
    problems = combination_problems(autocast=cfg.autocast, precision=cfg.precision, backend=cfg.backend,
                                    mode=cfg.mode, cuda_streams=cfg.cuda_streams, optimize_for=cfg.optimize_for)
    if problems:
        raise ExecutionError(problems[0][1])


def check_device_combination(cfg: BenchConfig, device: torch.device) -> None:
    """Reject combinations that the resolved torch device cannot run."""
    if cfg.precision == "int8" and device.type != "cpu":
        raise ExecutionError(f"precision int8 (torch dynamic quantization) runs on cpu only, not on {cfg.device}")
    if cfg.cuda_streams > 1 and device.type != "cuda":
        raise ExecutionError(
            f"cuda_streams {cfg.cuda_streams} needs a CUDA/ROCm device; "
            f"device {cfg.device} has a single execution stream"
        )


def quantize_int8(module: nn.Module) -> tuple[nn.Module, float]:
    """Dynamic int8 quantization of every nn.Linear; returns the model and the param fraction."""
    total = sum(p.numel() for p in module.parameters())
    linear = sum(m.weight.numel() for m in module.modules() if isinstance(m, nn.Linear))
    if linear == 0:
        raise ExecutionError(
            "precision int8: the model has no nn.Linear layers, so dynamic quantization would change nothing"
        )
    from torch.ao.quantization import quantize_dynamic

    quantized = quantize_dynamic(  # type: ignore[no-untyped-call]
        module.eval(), {nn.Linear}, dtype=torch.qint8
    )
    return quantized, linear / total if total else 0.0


NATIVE_CPU_FLAGS = {"fp16": ("avx512_fp16", "amx_fp16"), "bf16": ("avx512_bf16", "amx_bf16")}


def cpu_half_support(cfg: BenchConfig, device: torch.device) -> dict[str, Any]:
    """For fp16/bf16 (or autocast) on the CPU: whether the CPU has native instructions for it."""
    if device.type != "cpu":
        return {}
    half = "bf16" if cfg.autocast else cfg.precision
    if half not in NATIVE_CPU_FLAGS:
        return {}
    flags = cpu_flags()
    return {f"cpu_native_{half}": any(flag in flags for flag in NATIVE_CPU_FLAGS[half])}


def _prepare_module(built: BuiltModel, cfg: BenchConfig, device: torch.device) -> tuple[nn.Module, dict[str, Any]]:
    module = built.module
    info: dict[str, Any] = {"memory_format": "contiguous", **cpu_half_support(cfg, device)}
    module.train(cfg.mode == "training")
    if cfg.precision == "int8":
        module, fraction = quantize_int8(module)
        info["int8_quantized_param_fraction"] = fraction
    elif cfg.precision in ("fp16", "bf16"):
        module = module.to(TORCH_DTYPES[cfg.precision])
    module = module.to(device)
    if cfg.optimize_for == "throughput" and built.input_kind == "image":
        module = module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        info["memory_format"] = "channels_last"
    if cfg.backend == "compile":
        module = torch.compile(module)  # type: ignore[assignment]
    return module, info


def torch_device_for(cfg: BenchConfig) -> torch.device:
    """The task's torch device, checked against the task's precision and streams."""
    device = resolve_torch_device(cfg.device)
    check_device_combination(cfg, device)
    return device


def check_throughput_effect(cfg: BenchConfig, built: BuiltModel, device: torch.device) -> None:
    """``optimize_for: throughput`` must change something (see measure.py), never nothing."""
    if cfg.optimize_for != "throughput" or cfg.cuda_streams > 1 or built.input_kind == "image":
        return
    raise ExecutionError(
        f"optimize_for: throughput would change nothing for {built.name} ({built.input_kind} input) on "
        f"{device} with backend {cfg.backend}: it means channels-last for image models, cuda_streams > 1 on "
        "CUDA/ROCm, or OpenVINO's THROUGHPUT hint. Use optimize_for: latency (throughput_items_s is reported "
        "either way)"
    )


def prepare_torch(built: BuiltModel, cfg: BenchConfig, device: torch.device, load_start: float) -> PreparedModel:
    """Convert, move and (for ``compile``) wrap the built model; compilation itself is lazy."""
    check_throughput_effect(cfg, built, device)
    module, info = _prepare_module(built, cfg, device)
    engine = TorchEngine(module, built, device)
    return PreparedModel(
        built=built,
        engine=engine,
        device_label=str(device),
        torch_device=device,
        load_time_s=time.perf_counter() - load_start,
        info=info,
    )


class TorchEngine:
    """Eager or torch.compile'd module on a torch device."""

    def __init__(self, module: nn.Module, built: BuiltModel, device: torch.device) -> None:
        self.module = module
        self.built = built
        self.device = device

    def device_name(self) -> str | None:
        return None

    def _inputs(self, cfg: BenchConfig, batch_size: int, generator: torch.Generator, with_labels: bool) -> ModelInputs:
        raw = self.built.make_inputs(batch_size, generator, with_labels)
        float_dtype = TORCH_DTYPES.get(cfg.precision)
        channels_last = cfg.optimize_for == "throughput" and self.built.input_kind == "image"
        return raw.to(self.device, float_dtype, channels_last)

    def _context(self, cfg: BenchConfig, inference: bool) -> Any:
        def enter() -> contextlib.ExitStack:
            stack = contextlib.ExitStack()
            if inference:
                stack.enter_context(torch.inference_mode())
            if cfg.autocast:
                stack.enter_context(torch.autocast(self.device.type, dtype=AUTOCAST_DTYPES[self.device.type]))
            return stack

        return enter

    def _sync(self) -> Any:
        if self.device.type == "cuda":
            return lambda: torch.cuda.synchronize(self.device)
        if self.device.type == "mps":
            return torch.mps.synchronize
        return None

    def workload(self, cfg: BenchConfig, batch_size: int) -> Workload:
        generator = torch.Generator().manual_seed(cfg.seed)
        if cfg.mode == "training":
            return self._training(cfg, batch_size, generator)
        if cfg.cuda_streams > 1:
            return self._multi_stream(cfg, batch_size, generator)
        inputs = self._inputs(cfg, batch_size, generator, with_labels=False)
        module, args, kwargs = self.module, inputs.args, inputs.kwargs

        def step() -> Any:
            return module(*args, **kwargs)

        stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        return Workload(
            step=step,
            batch_size=batch_size,
            memory=memory_tracker(self.device),
            sync=self._sync(),
            cuda_events_on=stream,
            context=self._context(cfg, True),
        )

    def _multi_stream(self, cfg: BenchConfig, batch_size: int, generator: torch.Generator) -> Workload:
        count = cfg.cuda_streams
        streams = [torch.cuda.Stream(self.device) for _ in range(count)]  # type: ignore[no-untyped-call]
        batches = [self._inputs(cfg, batch_size, generator, False) for _ in range(count)]
        torch.cuda.synchronize(self.device)
        module = self.module

        def step() -> None:
            for stream, inputs in zip(streams, batches, strict=True):
                with torch.cuda.stream(stream):
                    inputs.call(module)

        return Workload(
            step=step,
            batch_size=batch_size,
            memory=memory_tracker(self.device),
            sync=self._sync(),
            concurrency=count,
            context=self._context(cfg, True),
        )

    def _training(self, cfg: BenchConfig, batch_size: int, generator: torch.Generator) -> Workload:
        inputs = self._inputs(cfg, batch_size, generator, with_labels=True)
        params = [p for p in self.module.parameters() if p.requires_grad]
        optimizer: torch.optim.Optimizer
        if cfg.optimizer == "adamw":
            optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate)
        else:
            optimizer = torch.optim.SGD(params, lr=cfg.learning_rate)
        module, loss_fn = self.module, self.built.loss

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(inputs.call(module), inputs)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()

        stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        return Workload(
            step=step,
            batch_size=batch_size,
            memory=memory_tracker(self.device),
            sync=self._sync(),
            cuda_events_on=stream,
            context=self._context(cfg, False),
            extra={"optimizer": cfg.optimizer},
        )
