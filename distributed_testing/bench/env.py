"""Environment fingerprint attached to every benchmark result.

:func:`collect_environment` reads library versions, the CPU, torch's thread settings and the
measured device (name, driver, CUDA/ROCm runtime). Values that do not exist on this machine are
``None`` (an absent library or driver is a fact, not a guess). ``fingerprint_hash`` is the first
16 hex digits of a SHA-256 over the canonical JSON of every other field, so two results with the
same hash came from the same software, hardware and thread settings.

:func:`config_hash` identifies a benchmark *configuration* the same way: two results with equal
``config_hash`` (and model) measured the same thing, whatever their batch sizes, iteration
counts or display name; ``dt compare`` looks up history by (model, config_hash, fingerprint_hash).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

_NVIDIA_VERSION_FILE = Path("/proc/driver/nvidia/version")
_AMDGPU_VERSION_FILE = Path("/sys/module/amdgpu/version")
_CPUINFO = Path("/proc/cpuinfo")


def package_version(name: str) -> str | None:
    """Installed distribution version, or None when the distribution is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU model string (``/proc/cpuinfo`` on Linux, ``platform.processor()`` elsewhere)."""
    if _CPUINFO.is_file():
        for line in _CPUINFO.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_flags() -> frozenset[str]:
    """The CPU feature flags from ``/proc/cpuinfo`` (empty where that file does not exist)."""
    if not _CPUINFO.is_file():
        return frozenset()
    for line in _CPUINFO.read_text(errors="replace").splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def _read_first_line(path: Path) -> str | None:
    if not path.is_file():
        return None
    lines = path.read_text(errors="replace").splitlines()
    return lines[0].strip() if lines else None


def gpu_driver_version() -> str | None:
    """Kernel driver version for NVIDIA (proc file) or AMD (amdgpu module); None if absent."""
    line = _read_first_line(_NVIDIA_VERSION_FILE)
    if line is not None:
        match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", line)
        return match.group(1) if match else line
    return _read_first_line(_AMDGPU_VERSION_FILE)


def _device_fields(device: torch.device | None, device_name: str | None) -> dict[str, Any]:
    kind = device.type if device is not None else "cpu"
    fields: dict[str, Any] = {
        "device_type": kind,
        "device_name": device_name,
        "device_count": None,
        "gpu_driver_version": None,
        "gpu_compute_capability": None,
    }
    if kind == "cuda":
        index = device.index if device is not None and device.index is not None else 0
        props = torch.cuda.get_device_properties(index)
        fields["device_name"] = device_name or props.name
        fields["device_count"] = torch.cuda.device_count()
        fields["gpu_driver_version"] = gpu_driver_version()
        fields["gpu_compute_capability"] = (
            getattr(props, "gcnArchName", None) if torch.version.hip else f"{props.major}.{props.minor}"
        )
    elif kind == "mps":
        fields["device_name"] = device_name or f"Apple MPS ({platform.machine()})"
        fields["device_count"] = 1
    elif fields["device_name"] is None:
        fields["device_name"] = cpu_model()
    return fields


def fingerprint_hash(fields: dict[str, Any]) -> str:
    """Stable 16-hex-digit hash of ``fields`` (key order does not matter)."""
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


CONFIG_HASH_IGNORED = frozenset({"name", "batch_sizes", "iterations", "warmup", "min_duration_s"})
"""Config fields that do not change what one iteration measures (results compare per batch size)."""


OPENVINO_METHOD = "static-shapes+request-latency"
"""The OpenVINO measurement method, part of an OpenVINO result's environment fingerprint."""


def config_hash(config: dict[str, Any]) -> str:
    """16-hex-digit hash of an effective benchmark config (every field, defaults applied) without
    the ``CONFIG_HASH_IGNORED`` fields."""
    return fingerprint_hash({k: v for k, v in config.items() if k not in CONFIG_HASH_IGNORED})


def collect_environment(
    device: torch.device | None = None,
    device_name: str | None = None,
    device_type: str | None = None,
) -> dict[str, Any]:
    """Everything that decides what a measurement means, plus ``fingerprint_hash``.

    ``device`` is the torch device measured (None for OpenVINO, which runs outside torch);
    ``device_name`` / ``device_type`` override the detected values (OpenVINO passes its
    FULL_DEVICE_NAME and e.g. ``openvino:CPU``).
    """
    fields: dict[str, Any] = {
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "torch_version": torch.__version__,
        "torch_cuda_version": torch.version.cuda,
        "torch_hip_version": torch.version.hip,
        "cudnn_version": _cudnn_version(),
        "transformers_version": package_version("transformers"),
        "openvino_version": package_version("openvino"),
        "nncf_version": package_version("nncf"),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
    }
    fields.update(_device_fields(device, device_name))
    if device_type is not None:
        fields["device_type"] = device_type
    if device_type is not None and device_type.startswith("openvino:"):
        # how openvino_backend measures: figures from before issue 39 (dynamic shapes, host
        # clock) are neither served from the result cache nor compared with these
        fields["openvino_method"] = OPENVINO_METHOD
    fields["fingerprint_hash"] = fingerprint_hash(fields)
    return fields


def _cudnn_version() -> int | None:
    if not torch.backends.cudnn.is_available():  # type: ignore[no-untyped-call]
        return None
    version = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
    return int(version) if version is not None else None


def main(argv: list[str] | None = None) -> int:
    """``python -m distributed_testing.bench.env``: write :func:`collect_environment` as one JSON line to
    stdout (the probe's answer to its parent, not a log message) for
    this machine's first accelerator (CUDA/ROCm if torch sees one, else the CPU). The worker runs
    this once to fingerprint test, custom and training results (``worker/environment.py``)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m distributed_testing.bench.env")
    parser.parse_args(argv)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else None
    sys.stdout.write(json.dumps(collect_environment(device)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
