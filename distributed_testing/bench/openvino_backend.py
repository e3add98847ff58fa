"""The OpenVINO backend: ``openvino.convert_model`` of the torch model, then ``compile_model``.

Devices: config ``cpu`` / ``gpu`` / ``npu`` map to OpenVINO's ``CPU`` / ``GPU`` / ``NPU`` and must
be in ``Core().available_devices``. The model is converted once with an example batch (its
shapes stay dynamic) and compiled once per set of input shapes, reshaped to them first: every
batch size runs on a model with static shapes, as ``benchmark_app`` measures a static model
(a dynamic-shape compiled model picks its kernels per call). The compiled models live as long as
the prepared model (at most ``MAX_COMPILED_SHAPES`` of them, the oldest dropped first).

Measured as ``benchmark_app -hint <hint> -infer_precision <p>`` measures (issue 39): the compile
configuration is exactly ``PERFORMANCE_HINT`` and ``INFERENCE_PRECISION_HINT`` (streams and
threads are what the hint chooses; the result records them per batch size as
``openvino_compiled``: see ``RECORDED_PROPERTIES``); inputs are written once into each infer
request's own input tensors before warm-up; under ``LATENCY`` a round is one synchronous
``infer`` timed by the request's own ``latency`` (``timing: openvino_request_latency``), so the
Python call around it is out of the figure (its host-clock median is beside it). The ``threads``
config key is torch's and does not reach OpenVINO.

Precision is set explicitly with ``INFERENCE_PRECISION_HINT`` (OpenVINO would otherwise pick
bf16/f16 on hardware that has it) and checked on the compiled model: ``fp32`` -> f32;
``fp16`` / ``bf16`` need ``FP16`` / ``BF16`` in the device's ``OPTIMIZATION_CAPABILITIES`` (the
CPU plugin silently keeps f32 without them, which is refused here); ``int8`` quantizes the
converted model with ``nncf.quantize`` (post-training, calibrated on four random batches of the
benchmark's own inputs: fine for speed, meaningless for accuracy) and needs ``nncf``.

``optimize_for`` sets ``PERFORMANCE_HINT``: ``LATENCY`` runs one synchronous infer request;
``THROUGHPUT`` runs the plugin's ``OPTIMAL_NUMBER_OF_INFER_REQUESTS`` requests concurrently
(``start_async`` on each, each with its own input, then ``wait`` on each) per round, timed by the
host clock (``benchmark_app`` keeps its queue full instead, without the per-round barrier).
Peak memory is the host process's (see measure.py), also for GPU/NPU devices.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
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


HINTS = {"latency": "LATENCY", "throughput": "THROUGHPUT"}
RECORDED_PROPERTIES = (
    "PERFORMANCE_HINT",
    "INFERENCE_PRECISION_HINT",
    "NUM_STREAMS",
    "INFERENCE_NUM_THREADS",
    "OPTIMAL_NUMBER_OF_INFER_REQUESTS",
    "ENABLE_CPU_PINNING",
    "ENABLE_HYPER_THREADING",
    "SCHEDULING_CORE_TYPE",
    "EXECUTION_MODE_HINT",
)
"""The compiled model's properties that decide a figure, recorded where the device reports them."""
MAX_COMPILED_SHAPES = 8


def openvino_target(cfg: BenchConfig) -> tuple[Any, str]:
    """``(Core, device)`` for the task, checked before any model is built."""
    core = _openvino().Core()
    device = resolve_ov_device(core, cfg.device)
    _check_precision(core, device, cfg.precision)
    if cfg.precision == "int8":
        _nncf()
    return core, device


def compile_config(cfg: BenchConfig) -> dict[str, str]:
    """What ``compile_model`` gets: the properties ``benchmark_app -hint H -infer_precision P`` sets."""
    return {"PERFORMANCE_HINT": HINTS[cfg.optimize_for], "INFERENCE_PRECISION_HINT": OV_PRECISION[cfg.precision]}


def _json_value(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "get_type_name"):  # an element type such as f32
        return value.get_type_name()
    name = getattr(value, "name", None)  # an enum such as PerformanceMode.LATENCY
    return name if isinstance(name, str) else str(value)


def compiled_properties(compiled: Any) -> dict[str, Any]:
    """``RECORDED_PROPERTIES`` of a compiled model, JSON-able (enums by name, types as ``f32``)."""
    supported = set(compiled.get_property("SUPPORTED_PROPERTIES"))
    return {key: _json_value(compiled.get_property(key)) for key in RECORDED_PROPERTIES if key in supported}


def static_model(ov_model: Any, shapes: list[list[int]]) -> Any:
    """A copy of ``ov_model`` with its inputs fixed to ``shapes`` (in its input order)."""
    ov = _openvino()
    if len(shapes) != len(ov_model.inputs):
        raise ExecutionError(f"{len(shapes)} input shapes for a model with {len(ov_model.inputs)} inputs")
    model = ov_model.clone()
    model.reshape({model.input(index): ov.PartialShape(shape) for index, shape in enumerate(shapes)})
    return model


def prepare_openvino(built: BuiltModel, cfg: BenchConfig, target: tuple[Any, str], load_start: float) -> PreparedModel:
    """Convert, (optionally) quantize, and compile for the first batch size; conversion and that
    compilation are reported as ``convert_time_s``, later batch sizes' compilations per batch."""
    ov = _openvino()
    core, device = target
    load_time = time.perf_counter() - load_start
    convert_start = time.perf_counter()
    ov_model = _convert(ov, built, cfg)
    engine = OpenVINOEngine(core, ov_model, built, device, compile_config(cfg))
    first, _ = engine.compiled_for(engine.arrays(cfg.batch_sizes[0], torch.Generator().manual_seed(cfg.seed)))
    convert_time = time.perf_counter() - convert_start
    info = {
        "openvino_device": device,
        "performance_hint": first.properties["PERFORMANCE_HINT"],
        "inference_precision": first.properties["INFERENCE_PRECISION_HINT"],
        "optimal_infer_requests": first.requests,
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


@dataclass
class Compiled:
    """One compiled static-shape model and what it was compiled as."""

    model: Any
    properties: dict[str, Any]
    requests: int


class OpenVINOEngine:
    """The converted model, compiled per set of input shapes on first use."""

    def __init__(self, core: Any, ov_model: Any, built: BuiltModel, device: str, config: dict[str, str]) -> None:
        self.core = core
        self.ov_model = ov_model
        self.built = built
        self.device = device
        self.config = config
        self.full_name = core.get_property(device, "FULL_DEVICE_NAME")
        self._compiled: dict[tuple[tuple[int, ...], ...], Compiled] = {}

    def device_name(self) -> str | None:
        return f"{self.full_name} (OpenVINO {self.device})"

    def arrays(self, batch_size: int, generator: torch.Generator) -> list[Any]:
        """One batch of generated inputs as numpy arrays in the converted model's input order
        (keyword inputs matched by port name)."""
        inputs = self.built.make_inputs(batch_size, generator, False)
        if not inputs.kwargs:
            return [t.numpy() for t in inputs.args]
        arrays = []
        for port in self.ov_model.inputs:
            names = [n for n in port.get_names() if n in inputs.kwargs]
            if not names:
                raise ExecutionError(f"OpenVINO input {port.get_names()} matches none of {', '.join(inputs.kwargs)}")
            arrays.append(inputs.kwargs[names[0]].numpy())
        return arrays

    def compiled_for(self, arrays: list[Any]) -> tuple[Compiled, float]:
        """The model compiled for these arrays' shapes and the seconds this call spent compiling
        it (0.0 when it already was); refuses an inference precision other than the requested."""
        key = tuple(tuple(int(d) for d in a.shape) for a in arrays)
        if key in self._compiled:
            return self._compiled[key], 0.0
        start = time.perf_counter()
        compiled = self.core.compile_model(static_model(self.ov_model, [list(k) for k in key]), self.device, self.config)
        elapsed = time.perf_counter() - start
        properties = compiled_properties(compiled)
        wanted = self.config["INFERENCE_PRECISION_HINT"]
        if properties.get("INFERENCE_PRECISION_HINT") != wanted:
            raise ExecutionError(
                f"OpenVINO {self.device} compiled the model with inference precision "
                f"{properties.get('INFERENCE_PRECISION_HINT')}, not the requested {wanted}"
            )
        requests = max(1, int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
        if len(self._compiled) >= MAX_COMPILED_SHAPES:
            del self._compiled[next(iter(self._compiled))]
        entry = Compiled(compiled, properties, requests)
        self._compiled[key] = entry
        return entry, elapsed

    @staticmethod
    def _request(compiled: Any, arrays: list[Any]) -> Any:
        """An infer request with ``arrays`` copied into its own input tensors, once (as
        ``benchmark_app`` fills them before measuring)."""
        request = compiled.create_infer_request()
        for index, array in enumerate(arrays):
            request.get_input_tensor(index).data[...] = array
        return request

    def workload(self, cfg: BenchConfig, batch_size: int) -> Workload:
        generator = torch.Generator().manual_seed(cfg.seed)
        arrays = self.arrays(batch_size, generator)
        entry, compile_s = self.compiled_for(arrays)
        extra = {
            "openvino_compiled": dict(entry.properties),
            "static_input_shapes": [list(a.shape) for a in arrays],
            "openvino_compile_s": compile_s,
        }
        if cfg.optimize_for == "latency":
            request = self._request(entry.model, arrays)
            return Workload(
                step=request.infer,
                batch_size=batch_size,
                memory=CpuRssTracker(),
                extra=extra,
                round_ms=lambda: float(request.latency),
                timing="openvino_request_latency",
            )
        requests = [self._request(entry.model, arrays)]
        requests += [self._request(entry.model, self.arrays(batch_size, generator)) for _ in range(entry.requests - 1)]

        def step() -> None:
            for request in requests:
                request.start_async()
            for request in requests:
                request.wait()

        return Workload(
            step=step, batch_size=batch_size, memory=CpuRssTracker(), concurrency=len(requests), extra=extra
        )
