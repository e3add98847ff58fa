"""The OpenVINO backend: ``openvino.convert_model`` of the torch model, then ``compile_model``.

Devices: config ``cpu`` / ``gpu`` / ``npu`` map to OpenVINO's ``CPU`` / ``GPU`` / ``NPU`` and must
be in ``Core().available_devices``. The model is converted once with an example batch (shapes
stay dynamic, so every batch size runs on the same compiled model).

Precision is set explicitly with ``INFERENCE_PRECISION_HINT`` (OpenVINO would otherwise pick
bf16/f16 on hardware that has it) and checked on the compiled model: ``fp32`` -> f32;
``fp16`` / ``bf16`` need ``FP16`` / ``BF16`` in the device's ``OPTIMIZATION_CAPABILITIES`` (the
CPU plugin silently keeps f32 without them, which is refused here); ``int8`` quantizes the
converted model with ``nncf.quantize`` (post-training, calibrated on four random batches of the
benchmark's own inputs: fine for speed, meaningless for accuracy) and needs ``nncf``.

``optimize_for`` sets ``PERFORMANCE_HINT``: ``LATENCY`` runs one synchronous infer request;
``THROUGHPUT`` runs the plugin's ``OPTIMAL_NUMBER_OF_INFER_REQUESTS`` requests concurrently
(``start_async`` on each, each with its own input, then ``wait`` on each) per round.
Peak memory is the host process's (see measure.py), also for GPU/NPU devices.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from distributed_testing.bench.backends import PreparedModel
from distributed_testing.bench.measure import CpuRssTracker, Workload
from distributed_testing.bench.models_base import BuiltModel, ModelInputs
from distributed_testing.bench.task_config import BenchConfig
from distributed_testing.errors import ExecutionError

logger = logging.getLogger(__name__)

OV_DEVICES = {"cpu": "CPU", "gpu": "GPU", "npu": "NPU"}
OV_PRECISION = {"fp32": "f32", "fp16": "f16", "bf16": "bf16", "int8": "f32"}
CAPABILITY = {"fp16": "FP16", "bf16": "BF16"}
CALIBRATION_BATCHES = 4


def _openvino() -> Any:
    try:
        import openvino
    except ImportError as exc:
        raise ExecutionError("backend openvino: the 'openvino' package is not installed") from exc
    return openvino


def _nncf() -> Any:
    try:
        import nncf
    except ImportError as exc:
        raise ExecutionError(
            "precision int8 on backend openvino needs the 'nncf' package, which is not installed"
        ) from exc
    return nncf


def resolve_ov_device(core: Any, name: str) -> str:
    if name not in OV_DEVICES:
        raise ExecutionError(
            f"device '{name}' is not an OpenVINO device (backend openvino takes {', '.join(OV_DEVICES)})"
        )
    device = OV_DEVICES[name]
    available = list(core.available_devices)
    if not any(d == device or d.startswith(device + ".") for d in available):
        raise ExecutionError(
            f"OpenVINO device {device} is not available here (available: {', '.join(available) or 'none'})"
        )
    return device


def _check_precision(core: Any, device: str, precision: str) -> None:
    if precision not in CAPABILITY:
        return
    capabilities = list(core.get_property(device, "OPTIMIZATION_CAPABILITIES"))
    if CAPABILITY[precision] not in capabilities:
        raise ExecutionError(
            f"precision {precision} on OpenVINO {device}: the device does not list "
            f"{CAPABILITY[precision]} in OPTIMIZATION_CAPABILITIES ({', '.join(capabilities)}), "
            "so it would run in f32"
        )


def _example_input(inputs: ModelInputs) -> Any:
    if inputs.kwargs:
        return dict(inputs.kwargs)
    return inputs.args[0] if len(inputs.args) == 1 else tuple(inputs.args)


def _feed(inputs: ModelInputs) -> Any:
    """Numpy inputs for calibration: keyed by input name for keyword inputs, else positional."""
    if inputs.kwargs:
        return {name: tensor.numpy() for name, tensor in inputs.kwargs.items()}
    return [t.numpy() for t in inputs.args]


def _convert(ov: Any, built: BuiltModel, cfg: BenchConfig) -> Any:
    generator = torch.Generator().manual_seed(cfg.seed)
    example = built.make_inputs(cfg.batch_sizes[0], generator, False)
    module = built.module.eval()
    with torch.no_grad():
        ov_model = ov.convert_model(module, example_input=_example_input(example))
    expected = len(example.tensors())
    if len(ov_model.inputs) != expected:
        raise ExecutionError(
            f"OpenVINO conversion of {built.name} produced {len(ov_model.inputs)} inputs, expected {expected}"
        )
    if cfg.precision == "int8":
        nncf = _nncf()
        calibration = [
            _feed(built.make_inputs(cfg.batch_sizes[0], generator, False)) for _ in range(CALIBRATION_BATCHES)
        ]
        ov_model = nncf.quantize(ov_model, nncf.Dataset(calibration), subset_size=CALIBRATION_BATCHES)
        if fake_quantize_count(ov_model) == 0:
            raise ExecutionError(f"nncf inserted no quantizers into {built.name}; int8 would measure an f32 model")
    return ov_model


def fake_quantize_count(ov_model: Any) -> int:
    """Quantization nodes in a converted model (0 for an unquantized one)."""
    return sum(1 for op in ov_model.get_ops() if op.get_type_name() == "FakeQuantize")


def openvino_target(cfg: BenchConfig) -> tuple[Any, str]:
    """``(Core, device)`` for the task, checked before any model is built."""
    core = _openvino().Core()
    device = resolve_ov_device(core, cfg.device)
    _check_precision(core, device, cfg.precision)
    if cfg.precision == "int8":
        _nncf()
    return core, device


def prepare_openvino(built: BuiltModel, cfg: BenchConfig, target: tuple[Any, str], load_start: float) -> PreparedModel:
    """Convert, (optionally) quantize and compile; conversion time is reported separately."""
    ov = _openvino()
    core, device = target
    load_time = time.perf_counter() - load_start
    convert_start = time.perf_counter()
    ov_model = _convert(ov, built, cfg)
    hint = "THROUGHPUT" if cfg.optimize_for == "throughput" else "LATENCY"
    wanted = OV_PRECISION[cfg.precision]
    compiled = core.compile_model(ov_model, device, {"PERFORMANCE_HINT": hint, "INFERENCE_PRECISION_HINT": wanted})
    actual = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    if actual != wanted:
        raise ExecutionError(
            f"OpenVINO {device} compiled the model with inference precision {actual}, not the requested {wanted}"
        )
    convert_time = time.perf_counter() - convert_start
    requests = int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
    engine = OpenVINOEngine(compiled, built, device, core.get_property(device, "FULL_DEVICE_NAME"), requests)
    info = {
        "openvino_device": device,
        "performance_hint": hint,
        "inference_precision": actual,
        "optimal_infer_requests": requests,
    }
    if cfg.precision == "int8":
        info["int8_fake_quantize_nodes"] = fake_quantize_count(ov_model)
    return PreparedModel(
        built=built,
        engine=engine,
        device_label=f"openvino:{device}",
        torch_device=None,
        load_time_s=load_time,
        convert_time_s=convert_time,
        info=info,
    )


class OpenVINOEngine:
    def __init__(self, compiled: Any, built: BuiltModel, device: str, full_name: str, optimal_requests: int) -> None:
        self.compiled = compiled
        self.built = built
        self.device = device
        self.full_name = full_name
        self.optimal_requests = max(1, optimal_requests)

    def device_name(self) -> str | None:
        return f"{self.full_name} (OpenVINO {self.device})"

    def _request(self, batch_size: int, generator: torch.Generator) -> Any:
        ov = _openvino()
        request = self.compiled.create_infer_request()
        inputs = self.built.make_inputs(batch_size, generator, False)
        for index, array in enumerate(self._ordered(inputs)):
            request.set_input_tensor(index, ov.Tensor(array))
        return request

    def _ordered(self, inputs: ModelInputs) -> list[Any]:
        """Arrays in the compiled model's input order: keyword inputs matched by port name."""
        if not inputs.kwargs:
            return [t.numpy() for t in inputs.args]
        arrays = []
        for port in self.compiled.inputs:
            names = [n for n in port.get_names() if n in inputs.kwargs]
            if not names:
                raise ExecutionError(f"OpenVINO input {port.get_names()} matches none of {', '.join(inputs.kwargs)}")
            arrays.append(inputs.kwargs[names[0]].numpy())
        return arrays

    def workload(self, cfg: BenchConfig, batch_size: int) -> Workload:
        generator = torch.Generator().manual_seed(cfg.seed)
        if cfg.optimize_for == "latency":
            request = self._request(batch_size, generator)
            return Workload(step=request.infer, batch_size=batch_size, memory=CpuRssTracker())
        requests = [self._request(batch_size, generator) for _ in range(self.optimal_requests)]

        def step() -> None:
            for request in requests:
                request.start_async()
            for request in requests:
                request.wait()

        return Workload(step=step, batch_size=batch_size, memory=CpuRssTracker(), concurrency=len(requests))
