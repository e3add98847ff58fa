"""Custom handler registry and the built-in handlers, called directly (no pool)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from distributed_testing.errors import ExecutionError
from distributed_testing.worker.executors.handlers import (
    HandlerContext,
    HandlerLoadError,
    HandlerParameterError,
    HandlerRegistry,
    load_spec,
    noop,
    sleep,
)
from distributed_testing.worker.executors.setup_env import KNOWN_MODELS, model_status, setup_environment

pytestmark = pytest.mark.timeout(30)

CTX = HandlerContext(task_id="t", attempt=1)


def test_registry_names_and_resolution() -> None:
    registry = HandlerRegistry({"dump": "json:dumps"}, use_entry_points=False)
    assert registry.names() == ["dump", "noop", "setup_environment", "sleep"]
    assert registry.resolve("noop") is noop
    assert registry.resolve("dump") is json.dumps
    with pytest.raises(ExecutionError, match=r"unknown custom handler 'x'; known handlers: dump, noop"):
        registry.resolve("x")


def test_extra_spec_cannot_shadow_a_builtin(caplog: pytest.LogCaptureFixture) -> None:
    registry = HandlerRegistry({"noop": "json:dumps"}, use_entry_points=False)
    assert registry.resolve("noop") is noop
    assert "already registered" in caplog.text


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nocolon", "not of the form"),
        ("dt_no_such_mod:f", "cannot load"),
        ("json:nope", "cannot load"),
        ("json:__doc__", "not callable"),
    ],
)
def test_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(HandlerLoadError, match=message):
        load_spec(spec)


def test_noop_and_sleep_validation() -> None:
    assert noop({}, CTX) == {}
    with pytest.raises(HandlerParameterError, match="unknown parameter"):
        noop({"x": 1}, CTX)
    assert sleep({"seconds": 0}, CTX)["slept_s"] >= 0
    for bad in (-0.1, "1", None, True, float("nan"), float("inf")):
        with pytest.raises(HandlerParameterError, match="non-negative number"):
            sleep({"seconds": bad}, CTX)


def test_clear_cache_deletes_files_and_reports_bytes(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "nested").mkdir(parents=True)
    (cache / "one").write_bytes(b"1" * 10)
    (cache / "nested" / "two").write_bytes(b"2" * 20)
    outside = tmp_path / "keep.txt"
    outside.write_text("keep me")
    os.symlink(outside, cache / "link")
    out = setup_environment({"clear_cache": True}, HandlerContext("t", 1, cache_dir=cache))
    files = out["cleared"]["cache_dir"]
    assert (files["files_deleted"], files["dirs_deleted"]) == (3, 1)
    assert files["bytes_freed"] == 30 + len(str(outside))  # a symlink's size is its target path
    assert cache.is_dir() and not any(cache.iterdir())
    assert outside.read_text() == "keep me"
    assert out["cleared"]["gc"]["objects_collected"] >= 0


def test_clear_cache_without_dir_and_refusals(tmp_path: Path) -> None:
    out = setup_environment({"clear_cache": True}, CTX)
    assert out["cleared"]["cache_dir"]["reason"] == "no cache directory configured"
    missing = setup_environment({"clear_cache": True}, HandlerContext("t", 1, cache_dir=tmp_path / "nope"))
    assert missing["cleared"]["cache_dir"]["reason"] == "directory does not exist"
    with pytest.raises(RuntimeError, match="refusing to clear"):
        setup_environment({"clear_cache": True}, HandlerContext("t", 1, cache_dir=Path("/")))


@pytest.mark.skipif(os.geteuid() == 0, reason="root can delete read-only entries")
def test_clear_cache_reports_undeletable_paths(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    locked = cache / "locked"
    locked.mkdir(parents=True)
    (locked / "f").write_text("x")
    locked.chmod(0o500)
    try:
        with pytest.raises(RuntimeError, match="could not delete 1 path"):
            setup_environment({"clear_cache": True}, HandlerContext("t", 1, cache_dir=cache))
    finally:
        locked.chmod(0o700)


def test_setup_environment_parameter_validation() -> None:
    for params, message in [
        ({"clear_cache": "yes"}, "clear_cache must be a boolean"),
        ({"prepare_models": "bert"}, "prepare_models must be a list"),
        ({"wipe": True}, "unknown parameter"),
    ]:
        with pytest.raises(HandlerParameterError, match=message):
            setup_environment(params, CTX)


def _snapshot(cache: Path, hf_name: str, files: dict[str, str]) -> Path:
    repo = cache / f"models--{hf_name.replace('/', '--')}"
    snap = repo / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    for name, content in files.items():
        (snap / name).write_text(content)
    return snap


def test_prepare_models_reads_the_local_hf_cache(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    gpt2 = _snapshot(cache, "gpt2", {"config.json": '{"model_type": "gpt2"}', "model.safetensors": "w"})
    _snapshot(cache, "bert-base-uncased", {"config.json": '{"model_type": "bert"}'})
    _snapshot(cache, "google/vit-base-patch16-224", {"config.json": "{not json"})
    names = ["gpt2", "bert", "vit", "t5", "llama"]
    out = setup_environment({"prepare_models": names, "hf_cache_dir": str(cache)}, CTX)["models"]
    assert out["llama"]["status"] == "unknown"
    assert all(known in out["llama"]["reason"] for known in KNOWN_MODELS)
    if importlib.util.find_spec("transformers") is None:
        assert {out[n]["status"] for n in names[:4]} == {"unavailable"}
        assert out["gpt2"]["reason"] == "transformers not installed" and out["gpt2"]["cache"] == "weights"
        return
    assert out["gpt2"] == {
        "hf_name": "gpt2",
        "path": str(gpt2),
        "model_type": "gpt2",
        "status": "cached",
        "reason": None,
    }
    assert out["bert"]["status"] == "config_only"
    assert out["vit"]["status"] == "unavailable" and "cannot read" in out["vit"]["reason"]
    assert out["t5"]["status"] == "unavailable" and "never downloads" in out["t5"]["reason"]


def test_prepare_models_knows_the_benchmarks_model_names_and_every_repo_they_load_from(tmp_path: Path) -> None:
    # docs/tasks.md names benchmark models bert-base-uncased, gpt2, ...: prepare_models must take
    # those names and look where the benchmark loads from (google-bert/... before bert-base-uncased)
    from distributed_testing.bench.hf_models import HF_ENTRIES

    assert KNOWN_MODELS == {e.name: e.repo_ids for e in HF_ENTRIES}
    cache = tmp_path / "hub"
    _snapshot(cache, "google-bert/bert-base-uncased", {"config.json": '{"model_type": "bert"}', "model.safetensors": "w"})
    _snapshot(cache, "t5-small", {"config.json": '{"model_type": "t5"}'})
    names = ["bert-base-uncased", "google-bert/bert-base-uncased", "bert", "t5-small", "resnet-50"]
    out = setup_environment({"prepare_models": names, "hf_cache_dir": str(cache)}, CTX)["models"]
    assert {n: out[n]["status"] != "unknown" for n in names} == dict.fromkeys(names, True), out
    if importlib.util.find_spec("transformers") is None:
        return
    for n in names[:3]:
        assert (out[n]["status"], out[n]["hf_name"]) == ("cached", "google-bert/bert-base-uncased"), out[n]
    assert (out["t5-small"]["status"], out["t5-small"]["hf_name"]) == ("config_only", "t5-small")
    assert (out["resnet-50"]["status"], out["resnet-50"]["hf_name"]) == ("unavailable", "microsoft/resnet-50")


def test_dangling_weight_symlink_is_not_cached(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    snap = _snapshot(cache, "t5-small", {"config.json": '{"model_type": "t5"}'})
    (snap / "model.safetensors").symlink_to(tmp_path / "blob-never-downloaded")
    status = model_status("t5", cache)
    if importlib.util.find_spec("transformers") is not None:
        assert status["status"] == "config_only"
    else:
        assert status["cache"] == "config"
