"""Hardware detection against this real machine."""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import platform
import shutil
from pathlib import Path

import psutil
import pytest

from distributed_testing.worker import hardware
from distributed_testing.worker.hardware import (
    DEVICE_KINDS,
    HardwareInfo,
    capabilities,
    detect_hardware,
    network_interfaces,
)

pytestmark = pytest.mark.timeout(120)

HAS_NVIDIA = Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None


@pytest.fixture(scope="module")
def info() -> HardwareInfo:
    return detect_hardware()


def test_host_facts_match_this_machine(info: HardwareInfo) -> None:
    assert info.hostname == platform.node()
    assert info.os == platform.system()
    assert info.python_version == platform.python_version()
    assert info.logical_cores == psutil.cpu_count(logical=True)
    assert info.physical_cores == psutil.cpu_count(logical=False)
    assert abs(info.memory_gb - psutil.virtual_memory().total / 1024**3) < 0.01
    assert info.cpu_model and info.cpu_model != "unknown"


@pytest.mark.skipif(platform.system() != "Linux", reason="reads /proc/cpuinfo")
def test_cpu_model_comes_from_proc_cpuinfo(info: HardwareInfo) -> None:
    text = Path("/proc/cpuinfo").read_text()
    names = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")]
    if names:
        assert info.cpu_model == names[0]


def test_cpuinfo_parser_handles_arm_layout(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nBogoMIPS\t: 48.00\nCPU part\t: 0xd0c\n\nHardware\t: Example SoC\n")
    assert hardware._cpuinfo_model(cpuinfo) == "Example SoC"
    cpuinfo.write_text("processor\t: 0\nflags\t: fpu\n")
    assert hardware._cpuinfo_model(cpuinfo) is None


def test_every_device_kind_is_reported_with_a_reason_when_absent(info: HardwareInfo) -> None:
    assert set(info.devices) == set(DEVICE_KINDS)
    cpu = info.devices["cpu"]
    assert cpu.available and cpu.count == info.logical_cores and cpu.names == (info.cpu_model,)
    for name, dev in info.devices.items():
        if dev.available:
            assert dev.count > 0 and dev.reason is None and dev.names, name
            if name != "cpu":  # cpu counts logical cores under one model name
                assert len(dev.names) == dev.count, name
        else:
            assert dev.count == 0 and dev.reason, name


@pytest.mark.skipif(HAS_NVIDIA, reason="this machine has an NVIDIA GPU")
def test_cuda_absent_here_with_the_real_reason(info: HardwareInfo) -> None:
    cuda = info.devices["cuda"]
    assert not cuda.available
    if importlib.util.find_spec("torch") is None:
        assert cuda.reason == "torch not installed"
    else:
        assert "built without CUDA" in cuda.reason or "no NVIDIA driver" in cuda.reason
    assert hardware.nvidia_driver_version() == (None, "no NVIDIA driver: libnvidia-ml not found")


@pytest.mark.skipif(not HAS_NVIDIA, reason="needs an NVIDIA GPU")
def test_cuda_present_reports_gpus(info: HardwareInfo) -> None:
    cuda = info.devices["cuda"]
    assert cuda.available, cuda.reason
    assert cuda.driver_version and cuda.runtime_version
    assert all(m > 0 for m in cuda.memory_gb)
    # the coordinator keeps an NCCL gang off workers that see one GPU: each device's own UUID, as
    # nvidia-smi -L writes it
    assert len(cuda.uuids) == cuda.count and len(set(cuda.uuids)) == cuda.count
    assert all(u.startswith(("GPU-", "MIG-")) for u in cuda.uuids), cuda.uuids


def test_mps_and_openvino_reasons(info: HardwareInfo) -> None:
    if platform.system() != "Darwin":
        assert info.devices["mps"].reason == f"MPS needs macOS on Apple silicon; this is {platform.system()}"
    openvino = info.devices["openvino"]
    if importlib.util.find_spec("openvino") is None:
        assert openvino.reason == "openvino not installed"
    else:
        assert openvino.available and any(n.startswith("CPU") for n in openvino.names)


def test_probe_timeout_becomes_the_reason() -> None:
    devices = hardware.probe_devices_in_child(timeout_s=0.001)
    assert set(devices) == set(hardware.ACCELERATORS)
    assert all(not d.available and "timed out" in (d.reason or "") for d in devices.values())


def test_json_round_trip_and_capabilities(info: HardwareInfo) -> None:
    data = json.loads(json.dumps(info.to_dict()))
    assert data["devices"]["cpu"]["available"] is True
    assert HardwareInfo.from_dict(data) == info
    caps = capabilities(info)
    assert "cpu" in caps
    assert caps == {"cpu"} | {k for k, d in info.devices.items() if d.available}


def test_network_interfaces() -> None:
    interfaces = network_interfaces()
    assert interfaces, "no IPv4 interface is up"
    for name, address in interfaces:
        assert name and ipaddress.IPv4Address(address)
    assert all(not a.startswith("127.") for _, a in network_interfaces(include_loopback=False))


def test_module_cli_prints_json(
    info: HardwareInfo, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(hardware, "detect_hardware", lambda: info)  # detection itself is tested above
    assert hardware.main([]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["hostname"] == platform.node() and data["logical_cores"] == os.cpu_count()
