"""Environment fingerprint."""

from __future__ import annotations

import torch

from distributed_testing.bench.env import collect_environment, fingerprint_hash, package_version


def test_fingerprint_fields_and_stable_hash() -> None:
    first = collect_environment(torch.device("cpu"))
    second = collect_environment(torch.device("cpu"))
    assert first == second
    for key in (
        "torch_version",
        "openvino_version",
        "transformers_version",
        "device_name",
        "gpu_driver_version",
        "torch_cuda_version",
        "torch_hip_version",
        "cpu_model",
        "torch_threads",
        "fingerprint_hash",
    ):
        assert key in first
    assert first["torch_version"] == torch.__version__
    assert first["torch_threads"] == torch.get_num_threads()
    assert len(first["fingerprint_hash"]) == 16
    fields = {k: v for k, v in first.items() if k != "fingerprint_hash"}
    assert fingerprint_hash(fields) == first["fingerprint_hash"]


def test_hash_changes_with_any_field_and_ignores_order() -> None:
    fields = {"a": 1, "b": "x"}
    assert fingerprint_hash(fields) == fingerprint_hash({"b": "x", "a": 1})
    assert fingerprint_hash(fields) != fingerprint_hash({"a": 2, "b": "x"})


def test_thread_count_is_part_of_the_fingerprint() -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = collect_environment()["fingerprint_hash"]
        torch.set_num_threads(2)
        two = collect_environment()["fingerprint_hash"]
    finally:
        torch.set_num_threads(before)
    assert one != two


def test_device_name_override_and_missing_package() -> None:
    env = collect_environment(None, "Some OpenVINO CPU")
    assert env["device_name"] == "Some OpenVINO CPU"
    assert package_version("surely-not-an-installed-distribution-xyz") is None
