"""Real hardware detection for a worker: what this machine has, and why a device is absent.

:func:`detect_hardware` is meant to be called once at worker start (it takes seconds: importing
torch alone takes one or two). The accelerator probes (CUDA, ROCm, MPS, OpenVINO) run by default
in a short-lived child process, ``python -m distributed_testing.worker.hardware --probe-devices``,
so the long-lived worker never imports torch or creates a CUDA context (which would hold GPU
memory for the worker's whole life and make later forks unsafe). Every absent device carries the
concrete reason, e.g. ``"torch 2.13.0+cpu built without CUDA"``; nothing is guessed.

Run ``python -m distributed_testing.worker.hardware`` to print this machine's report as JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import importlib.util
import logging
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import psutil

logger = logging.getLogger(__name__)

ACCELERATORS = ("cuda", "rocm", "mps", "openvino")
DEVICE_KINDS = ("cpu", *ACCELERATORS)
_GIB = 1024**3
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


class DeviceInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One device kind. ``reason`` says why it is unavailable (None when available)."""

    available: bool
    count: int = 0
    names: tuple[str, ...] = ()
    memory_gb: tuple[float, ...] = ()
    driver_version: str | None = None
    runtime_version: str | None = None
    reason: str | None = None
    # Each device's UUID (CUDA; empty where torch gives none): the coordinator keeps an NCCL gang
    # off two workers that see the same GPU (coordinator/core/placement.py, ``shared_gpus``).
    uuids: tuple[str, ...] = ()


class HardwareInfo(msgspec.Struct, frozen=True, kw_only=True):
    """This machine as a worker reports it. ``devices`` has one entry per :data:`DEVICE_KINDS`."""

    hostname: str
    os: str
    os_release: str
    platform: str
    machine: str
    python_version: str
    python_implementation: str
    cpu_model: str
    physical_cores: int | None
    logical_cores: int
    memory_gb: float
    devices: dict[str, DeviceInfo]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-compatible dict (tuples become lists)."""
        result: dict[str, Any] = msgspec.to_builtins(self)
        return result

    @classmethod
    def from_dict(cls, data: Any) -> HardwareInfo:
        """Inverse of :meth:`to_dict`; raises ``msgspec.ValidationError`` on a bad shape."""
        return msgspec.convert(data, cls)


def capabilities(info: HardwareInfo) -> set[str]:
    """Names of the device kinds available on this machine; always includes ``"cpu"``."""
    return {"cpu"} | {name for name, dev in info.devices.items() if dev.available}


def detect_hardware(*, isolate: bool = True, probe_timeout_s: float = 180.0) -> HardwareInfo:
    """Detect this machine. Blocking (seconds): call it once, from a thread if a loop is running.

    With ``isolate`` (the default) the accelerator probes run in a child process; otherwise they
    run here and import torch and openvino into this process.
    """
    cpu_model = cpu_model_name()
    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    memory_gb = round(psutil.virtual_memory().total / _GIB, 2)
    devices = {
        "cpu": DeviceInfo(available=True, count=logical, names=(cpu_model,), memory_gb=(memory_gb,)),
        **(probe_devices_in_child(probe_timeout_s) if isolate else probe_devices()),
    }
    return HardwareInfo(
        hostname=socket.gethostname(),
        os=platform.system(),
        os_release=platform.release(),
        platform=platform.platform(),
        machine=platform.machine(),
        python_version=platform.python_version(),
        python_implementation=platform.python_implementation(),
        cpu_model=cpu_model,
        physical_cores=psutil.cpu_count(logical=False),
        logical_cores=logical,
        memory_gb=memory_gb,
        devices=devices,
    )


def network_interfaces(*, include_loopback: bool = True, up_only: bool = True) -> list[tuple[str, str]]:
    """``[(interface name, IPv4 address)]`` of this machine, in the order psutil lists them."""
    stats = psutil.net_if_stats()
    result = []
    for name, addrs in psutil.net_if_addrs().items():
        if up_only and not (name in stats and stats[name].isup):
            continue
        for addr in addrs:
            if addr.family != socket.AF_INET:
                continue
            if not include_loopback and addr.address.startswith("127."):
                continue
            result.append((name, addr.address))
    return result


# --- CPU --------------------------------------------------------------------------------------


def cpu_model_name() -> str:
    """The CPU's marketing name: /proc/cpuinfo on Linux, sysctl on macOS, else platform's guess."""
    system = platform.system()
    if system == "Linux":
        name = _cpuinfo_model(Path("/proc/cpuinfo"))
        if name:
            return name
    elif system == "Darwin":
        out = subprocess.run(
            ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, check=False
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    return platform.processor() or platform.machine() or "unknown"


def _cpuinfo_model(path: Path) -> str | None:
    """First 'model name' (x86) or 'Hardware'/'Processor'/'cpu model' (Arm, MIPS) in cpuinfo."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        logger.warning("cannot read %s: %s", path, exc)
        return None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            fields.setdefault(key.strip().lower(), value.strip())
    for key in ("model name", "hardware", "processor", "cpu model"):
        found = fields.get(key)
        if found and not found.isdigit():  # x86 'processor' is just the index
            return found
    return None


# --- accelerators -----------------------------------------------------------------------------


def probe_devices() -> dict[str, DeviceInfo]:
    """Probe CUDA, ROCm, MPS and OpenVINO in this process (imports torch/openvino if present)."""
    return {**_probe_torch_devices(), "openvino": _probe_openvino()}


def probe_devices_in_child(timeout_s: float = 180.0) -> dict[str, DeviceInfo]:
    """:func:`probe_devices` in a child process; a failed probe becomes the devices' reason."""
    env = dict(os.environ)  # inherited as by any child, plus the path to this package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH")) if p)
    argv = [sys.executable, "-m", "distributed_testing.worker.hardware", "--probe-devices"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    except subprocess.TimeoutExpired:
        return _all_unavailable(f"device probe process timed out after {timeout_s:g} s")
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not lines:
        tail = done.stderr.strip()[-500:]
        return _all_unavailable(f"device probe process failed (exit code {done.returncode}): {tail}")
    try:
        return msgspec.json.decode(lines[-1], type=dict[str, DeviceInfo])
    except msgspec.DecodeError as exc:
        return _all_unavailable(f"device probe process printed malformed output: {exc}")


def _all_unavailable(reason: str) -> dict[str, DeviceInfo]:
    logger.warning("accelerator detection failed: %s", reason)
    return {kind: DeviceInfo(available=False, reason=reason) for kind in ACCELERATORS}


def _probe_torch_devices() -> dict[str, DeviceInfo]:
    kinds = ("cuda", "rocm", "mps")
    if importlib.util.find_spec("torch") is None:
        return {k: DeviceInfo(available=False, reason="torch not installed") for k in kinds}
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - a broken torch install is reported as the reason
        reason = f"torch failed to import: {type(exc).__name__}: {exc}"
        return {k: DeviceInfo(available=False, reason=reason) for k in kinds}
    return {"cuda": _probe_cuda(torch), "rocm": _probe_rocm(torch), "mps": _probe_mps(torch)}


def _probe_cuda(torch: Any) -> DeviceInfo:
    version = torch.__version__
    if torch.version.hip:
        reason = f"torch {version} is a ROCm build (HIP {torch.version.hip}); AMD GPUs are listed under rocm"
        return DeviceInfo(available=False, reason=reason)
    if torch.version.cuda is None:
        return DeviceInfo(available=False, reason=f"torch {version} built without CUDA")
    driver, driver_problem = nvidia_driver_version()
    if not torch.cuda.is_available():
        if driver_problem:
            reason = driver_problem
        else:
            reason = f"torch {version} (CUDA {torch.version.cuda}) sees no GPU with NVIDIA driver {driver}"
        return DeviceInfo(available=False, driver_version=driver, runtime_version=torch.version.cuda, reason=reason)
    return _torch_gpus(torch, driver_version=driver, runtime_version=torch.version.cuda)


def _probe_rocm(torch: Any) -> DeviceInfo:
    version, hip = torch.__version__, torch.version.hip
    if not hip:
        return DeviceInfo(available=False, reason=f"torch {version} built without ROCm (HIP)")
    if not torch.cuda.is_available():
        return DeviceInfo(available=False, runtime_version=hip, reason=f"torch {version} (HIP {hip}) sees no AMD GPU")
    return _torch_gpus(torch, driver_version=None, runtime_version=hip)


def _torch_gpus(torch: Any, *, driver_version: str | None, runtime_version: str) -> DeviceInfo:
    count = torch.cuda.device_count()
    props = [torch.cuda.get_device_properties(i) for i in range(count)]
    return DeviceInfo(
        available=count > 0,
        count=count,
        names=tuple(p.name for p in props),
        memory_gb=tuple(round(p.total_memory / _GIB, 2) for p in props),
        uuids=_uuids(props),
        driver_version=driver_version,
        runtime_version=runtime_version,
        reason=None if count else "torch reports CUDA available but zero devices",
    )


def _uuids(props: list[Any]) -> tuple[str, ...]:
    """The devices' UUIDs as torch reports them (``GPU-`` prefixed, as ``nvidia-smi -L`` and
    ``CUDA_VISIBLE_DEVICES`` write them); none unless every device has one."""
    found = [str(getattr(p, "uuid", "") or "") for p in props]
    if not all(found):
        return ()
    return tuple(u if u.startswith(("GPU-", "MIG-")) else f"GPU-{u}" for u in found)


def _probe_mps(torch: Any) -> DeviceInfo:
    system = platform.system()
    if system != "Darwin":
        return DeviceInfo(available=False, reason=f"MPS needs macOS on Apple silicon; this is {system}")
    mps = torch.backends.mps
    if not mps.is_built():
        return DeviceInfo(available=False, reason=f"torch {torch.__version__} built without MPS")
    if not mps.is_available():
        return DeviceInfo(available=False, reason=f"MPS unavailable on macOS {platform.mac_ver()[0]} ({platform.machine()})")
    memory: tuple[float, ...] = ()
    if hasattr(torch, "mps") and hasattr(torch.mps, "recommended_max_memory"):
        memory = (round(torch.mps.recommended_max_memory() / _GIB, 2),)
    return DeviceInfo(available=True, count=1, names=(f"Apple GPU ({cpu_model_name()})",), memory_gb=memory)


def nvidia_driver_version() -> tuple[str | None, str | None]:
    """``(driver version, None)`` from NVML, or ``(None, why not)``.

    Calls libnvidia-ml directly through ctypes, so no Python NVML binding is needed; the library
    ships with the NVIDIA driver itself.
    """
    libname = "nvml.dll" if sys.platform == "win32" else "libnvidia-ml.so.1"
    try:
        nvml = ctypes.CDLL(libname)
    except OSError:
        return None, f"no NVIDIA driver: {libname.split('.')[0]} not found"
    rc = nvml.nvmlInit_v2()
    if rc != 0:
        return None, f"NVIDIA driver library found but NVML failed to initialise (NVML error {rc})"
    try:
        buf = ctypes.create_string_buffer(96)
        rc = nvml.nvmlSystemGetDriverVersion(buf, ctypes.c_uint(len(buf)))
        if rc != 0:
            return None, f"NVML could not report the driver version (NVML error {rc})"
        return buf.value.decode(), None
    finally:
        nvml.nvmlShutdown()


def _probe_openvino() -> DeviceInfo:
    if importlib.util.find_spec("openvino") is None:
        return DeviceInfo(available=False, reason="openvino not installed")
    try:
        import openvino

        core = openvino.Core()
        devices = list(core.available_devices)
        names = tuple(f"{d}: {core.get_property(d, 'FULL_DEVICE_NAME')}" for d in devices)
        version = str(openvino.get_version())
    except Exception as exc:  # noqa: BLE001 - a broken openvino install is reported as the reason
        return DeviceInfo(available=False, reason=f"openvino failed to initialise: {type(exc).__name__}: {exc}")
    return DeviceInfo(
        available=bool(devices),
        count=len(devices),
        names=names,
        runtime_version=version,
        reason=None if devices else f"openvino {version} found no devices",
    )


def main(argv: list[str] | None = None) -> int:
    """CLI: print this machine's HardwareInfo (or, with --probe-devices, the probes) as JSON."""
    parser = argparse.ArgumentParser(prog="python -m distributed_testing.worker.hardware")
    parser.add_argument("--probe-devices", action="store_true", help="probe accelerators in-process only")
    args = parser.parse_args(argv)
    if args.probe_devices:
        # A short-lived process whose work is importing torch and openvino: without the cyclic
        # collector it uses about 1.65 s of CPU instead of 1.9 s (getrusage, 3 runs each).
        gc.disable()
        payload = msgspec.json.encode(probe_devices())
    else:
        payload = msgspec.json.format(msgspec.json.encode(detect_hardware()), indent=2)
    sys.stdout.write(payload.decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
