"""The benchmark child's ``fingerprint`` op reports the environment a run on that device reports."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(120)

FAST = {"model": "mlp", "tiny": True, "warmup": 1, "iterations": 2, "min_duration_s": 0}


def _child(requests: list[dict[str, Any]], cwd: Path, *args: str) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "distributed_testing.bench.child", *args],
        input="".join(json.dumps(r) + "\n" for r in requests),
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [r for r in map(json.loads, proc.stdout.splitlines()) if "progress" not in r]  # replies only


def test_fingerprint_matches_a_cpu_run_and_names_an_absent_device(tmp_path: Path) -> None:
    replies = _child(
        [
            {"id": 1, "op": "fingerprint"},
            {"id": 2, "op": "fingerprint", "device": "CPU", "backend": "compile"},
            {"id": 3, "configs": [FAST]},
            {"id": 4, "op": "fingerprint", "device": "cuda"},
            {"id": 5, "op": "fingerprint", "backend": "tensorrt"},
            {"id": 6, "op": "fingerprint", "device": 3},
        ],
        tmp_path,
        "--threads",
        "1",
    )
    default, explicit, run, cuda, backend, bad = replies
    environment = run["results"][0]["environment"]
    assert default["fingerprint_hash"] == explicit["fingerprint_hash"] == environment["fingerprint_hash"]
    assert default["environment"] == environment
    assert default["environment"]["torch_threads"] == 1
    assert cuda["error"]["type"] == "ExecutionError" and "cuda" in cuda["error"]["message"]
    assert backend["error"]["type"] == "ExecutionError" and "tensorrt" in backend["error"]["message"]
    assert bad["error"]["type"] == "BadRequest"


@pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="openvino is not installed")
def test_fingerprint_matches_an_openvino_run(tmp_path: Path) -> None:
    fingerprint, run = _child(
        [{"id": 1, "op": "fingerprint", "backend": "openvino", "device": "cpu"},
         {"id": 2, "configs": [{**FAST, "backend": "openvino"}]}],
        tmp_path,
    )
    environment = run["results"][0]["environment"]
    assert fingerprint["environment"] == environment
    assert environment["device_type"] == "openvino:CPU"
