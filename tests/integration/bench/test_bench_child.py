"""The benchmark child process: JSON lines on stdin/stdout, model cache kept between requests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CHATTY_MODEL = """
import torch

def make():
    print("this goes to stdout and must not corrupt the protocol")
    return torch.nn.Linear(4, 2)
"""

FAST = {"warmup": 1, "iterations": 2, "min_duration_s": 0}


def _run_child(
    requests: list[Any], cwd: Path, *args: str, env: dict[str, str] | None = None
) -> tuple[list[dict[str, Any]], str]:
    lines = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in requests)
    proc = subprocess.run(
        [sys.executable, "-m", "distributed_testing.bench.child", *args],
        input=lines,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=90,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()], proc.stderr


def test_two_requests_reuse_the_loaded_model(tmp_path: Path) -> None:
    (tmp_path / "bench_chatty_model.py").write_text(CHATTY_MODEL)
    user = {"model": "bench_chatty_model:make", "input_shape": [4], **FAST}
    requests = [
        {"id": 1, "configs": [{**user, "batch_sizes": [1]}, {"model": "nope"}]},
        "this is not json",
        {"id": "two", "configs": [{**user, "batch_sizes": [2, 3]}]},
        {"id": 3, "op": "status"},
        {"id": 4, "op": "clear_cache"},
        {"id": 5, "op": "status"},
        {"id": 6, "configs": "not a list"},
        {"id": 7, "configs": [user]},
    ]
    lines, stderr = _run_child(requests, tmp_path, "--threads", "1", "--allow-model-modules", "bench_chatty_model")
    responses = [r for r in lines if "progress" not in r]
    assert [r["id"] for r in responses] == [1, None, "two", 3, 4, 5, 6, 7]
    # each measured batch size is reported before its request's reply, and printed to the child's output
    reports = [(r["id"], r["progress"]["index"], r["progress"]["done"], r["progress"]["total"]) for r in lines
               if "progress" in r]
    assert reports == [(1, 0, 1, 1), ("two", 0, 1, 2), ("two", 0, 2, 2), (7, 0, 1, 1)]
    assert lines.index(next(r for r in lines if r.get("progress", {}).get("done") == 2)) < lines.index(responses[2])
    second_line = next(r for r in lines if r.get("id") == "two" and "progress" in r)["progress"]["line"]
    assert second_line.startswith("bench_chatty_model:make b2 fp32: ") and second_line.endswith(" ms (1 of 2)")
    assert second_line in stderr
    first, second = responses[0]["results"], responses[2]["results"]
    assert first[0]["cached"] is False and first[0]["model_load_count"] == 1
    assert first[1]["error"]["type"] == "ExecutionError" and "unknown model 'nope'" in first[1]["error"]["message"]
    assert responses[1]["error"]["type"] == "BadRequest"
    assert second[0]["cached"] is True and second[0]["model_load_count"] == 1
    assert second[0]["load_time_s"] == 0.0
    assert [b["batch_size"] for b in second[0]["batch_results"]] == [2, 3]
    assert second[0]["environment"]["torch_threads"] == 1
    assert responses[3]["cached_models"] == 1 and responses[3]["threads"] == 1
    assert responses[4] == {"id": 4, "cleared": 1}
    assert responses[5]["cached_models"] == 0
    assert responses[6]["error"]["type"] == "BadRequest"
    reloaded = responses[7]["results"][0]
    assert reloaded["cached"] is False and reloaded["model_load_count"] == 2  # after clear_cache
    assert "must not corrupt the protocol" in stderr


def test_threads_from_environment_and_mixed_precision_flag(tmp_path: Path) -> None:
    request = {"id": 1, "configs": [{"model": "mlp", "tiny": True, **FAST}]}
    responses, _ = _run_child(
        [request], tmp_path, "--mixed-precision", env={"DT_BENCH_THREADS": "1", "DT_BENCH_INTEROP_THREADS": "1"}
    )
    (result,) = responses[-1]["results"]  # after the batch size's progress line
    assert result["environment"]["torch_threads"] == 1
    assert result["environment"]["torch_interop_threads"] == 1
    assert (result["autocast"], result["autocast_source"]) == (True, "runner_default")


def test_bad_thread_setting_exits_with_an_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from distributed_testing.bench import child

    monkeypatch.setenv("DT_BENCH_THREADS", "many")
    assert child.main([]) == 2
    assert "DT_BENCH_THREADS must be a positive integer" in caplog.text
