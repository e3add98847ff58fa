"""The ``setup_environment`` built-in handler: clear this worker's caches, check model readiness.

It runs inside a custom-handler pool child. It never downloads anything: workers may have no
network, so model preparation reports what the local Hugging Face cache already holds.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from distributed_testing.tasks.configs import BENCHMARK_REGISTRY_REPOS
from distributed_testing.worker.executors.handlers import (
    HandlerContext,
    HandlerParameterError,
    check_keys,
)

logger = logging.getLogger(__name__)

# The benchmark's registry models: name -> the Hugging Face repo ids a benchmark loads, in its order
KNOWN_MODELS = BENCHMARK_REGISTRY_REPOS
# other names a task may use: the repo ids, and the short names this handler took first
ALIASES: dict[str, str] = {
    **{repo: name for name, repos in KNOWN_MODELS.items() for repo in repos},
    "bert": "bert-base-uncased", "t5": "t5-small", "vit": "vit-base-patch16-224", "resnet": "resnet-50",
}

_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "tf_model.h5",
    "flax_model.msgpack",
)


def setup_environment(parameters: dict[str, Any], ctx: HandlerContext) -> dict[str, Any]:
    """Prepare this worker for the tasks that follow.

    Parameters: ``clear_cache: bool`` (default False) clears Python's garbage, this process's
    CUDA cache and every file under ``ctx.cache_dir``; ``prepare_models: list[str]`` reports per
    model whether it can run offline; ``hf_cache_dir: str`` overrides the Hugging Face hub cache
    location. Returns ``{"cleared": {...}}`` and/or ``{"models": {name: {"status", "reason", ...}}}``.
    """
    check_keys(parameters, {"clear_cache", "prepare_models", "hf_cache_dir"})
    clear_cache = parameters.get("clear_cache", False)
    if not isinstance(clear_cache, bool):
        raise HandlerParameterError(f"clear_cache must be a boolean, got {clear_cache!r}")
    models = parameters.get("prepare_models", [])
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise HandlerParameterError(f"prepare_models must be a list of model names, got {models!r}")
    hf_cache = parameters.get("hf_cache_dir")
    if hf_cache is not None and not isinstance(hf_cache, str):
        raise HandlerParameterError(f"hf_cache_dir must be a path string, got {hf_cache!r}")

    output: dict[str, Any] = {}
    if clear_cache:
        output["cleared"] = clear_caches(ctx.cache_dir)
    if models:
        cache_root = Path(hf_cache) if hf_cache else default_hf_cache_dir()
        output["models"] = {name: model_status(name, cache_root) for name in models}
    return output


# --- clearing ---------------------------------------------------------------------------------


def clear_caches(cache_dir: Path | None) -> dict[str, Any]:
    """Clear gc garbage, this process's CUDA cache and the files under ``cache_dir``.

    Raises RuntimeError naming the paths that could not be deleted (after trying all of them).
    """
    collected = gc.collect()
    cuda = _clear_cuda_cache()
    files = _clear_cache_dir(cache_dir)
    return {
        "gc": {"objects_collected": collected},
        "cuda": cuda,
        "cache_dir": files,
        "bytes_freed": cuda["bytes_freed"] + files["bytes_freed"],
    }


def _clear_cuda_cache() -> dict[str, Any]:
    torch = sys.modules.get("torch")
    if torch is None:
        return {"cleared": False, "bytes_freed": 0, "reason": "torch not loaded in this process: no CUDA cache"}
    if not torch.cuda.is_available():
        return {"cleared": False, "bytes_freed": 0, "reason": f"CUDA not available to torch {torch.__version__}"}
    if not torch.cuda.is_initialized():
        return {"cleared": False, "bytes_freed": 0, "reason": "CUDA not initialised in this process: no cache"}
    devices = range(torch.cuda.device_count())
    before = sum(torch.cuda.memory_reserved(d) for d in devices)
    torch.cuda.empty_cache()
    after = sum(torch.cuda.memory_reserved(d) for d in devices)
    return {"cleared": True, "bytes_freed": int(before - after), "reason": None}


def _clear_cache_dir(cache_dir: Path | None) -> dict[str, Any]:
    if cache_dir is None:
        return {"path": None, "files_deleted": 0, "bytes_freed": 0, "reason": "no cache directory configured"}
    root = cache_dir.resolve()
    if root == Path(root.anchor) or root == Path.home().resolve():
        raise RuntimeError(f"refusing to clear cache directory {root}: it is the filesystem root or home")
    if not root.is_dir():
        return {"path": str(root), "files_deleted": 0, "bytes_freed": 0, "reason": "directory does not exist"}
    stats = {"files": 0, "dirs": 0, "bytes": 0}
    failures: list[str] = []
    _empty_dir(root, stats, failures)
    if failures:
        raise RuntimeError(
            f"could not delete {len(failures)} path(s) under {root} "
            f"({stats['files']} files, {stats['bytes']} bytes were freed): " + "; ".join(failures[:5])
        )
    logger.info("cleared cache dir %s: %d files, %d bytes", root, stats["files"], stats["bytes"])
    return {
        "path": str(root),
        "files_deleted": stats["files"],
        "dirs_deleted": stats["dirs"],
        "bytes_freed": stats["bytes"],
        "reason": None,
    }


def _empty_dir(directory: Path, stats: dict[str, int], failures: list[str]) -> None:
    """Delete everything inside ``directory`` (not following symlinks), recording failures."""
    with os.scandir(directory) as entries:
        for entry in entries:
            path = Path(entry.path)
            try:
                if entry.is_dir(follow_symlinks=False):
                    _empty_dir(path, stats, failures)
                    path.rmdir()
                    stats["dirs"] += 1
                else:
                    size = entry.stat(follow_symlinks=False).st_size
                    path.unlink()
                    stats["files"] += 1
                    stats["bytes"] += size
            except OSError as exc:
                failures.append(f"{path}: {exc.strerror or exc}")


# --- models -----------------------------------------------------------------------------------


def default_hf_cache_dir() -> Path:
    """The Hugging Face hub cache directory, resolved the way huggingface_hub resolves it.

    Uses ``huggingface_hub.constants.HF_HUB_CACHE`` when the library is installed; otherwise
    follows its documented variables (HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME), which are the
    Hugging Face ecosystem's own contract rather than configuration of this project.
    """
    if importlib.util.find_spec("huggingface_hub") is not None:
        from huggingface_hub import constants

        return Path(constants.HF_HUB_CACHE)
    env = os.environ
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    xdg = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    hf_home = Path(env.get("HF_HOME") or xdg / "huggingface").expanduser()
    return hf_home / "hub"


def model_status(name: str, cache_root: Path) -> dict[str, Any]:
    """Whether model ``name`` (a benchmark model name, or an alias) can be loaded offline: status
    cached/config_only/unavailable/unknown. Each of the model's repo ids is looked at, as the
    benchmark does; ``hf_name`` is the one found (the first with weights), else the first."""
    repos = KNOWN_MODELS.get(ALIASES.get(name, name))
    if repos is None:
        known = ", ".join(KNOWN_MODELS)
        return {"status": "unknown", "hf_name": None, "reason": f"unknown model {name!r}; known models: {known}"}
    found = [(repo, *_find_snapshot(cache_root, repo)) for repo in repos]
    hf_name, snapshot, cached = next((f for f in found if f[2] == "weights"),
                                     next((f for f in found if f[2] == "config"), found[0]))
    result: dict[str, Any] = {"hf_name": hf_name, "path": str(snapshot) if snapshot else None}
    if importlib.util.find_spec("transformers") is None:
        return {**result, "status": "unavailable", "cache": cached, "reason": "transformers not installed"}
    if snapshot is None or cached == "absent":
        reason = (f"{' nor '.join(repos)} is not in the local Hugging Face cache {cache_root}; "
                  "this worker never downloads")
        return {**result, "status": "unavailable", "reason": reason}
    config_path = snapshot / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return {**result, "status": "unavailable", "reason": f"cannot read {config_path}: {exc}"}
    result["model_type"] = config.get("model_type") if isinstance(config, dict) else None
    if cached == "config":
        return {**result, "status": "config_only", "reason": f"config.json cached but no weights in {snapshot}"}
    return {**result, "status": "cached", "reason": None}


def _find_snapshot(cache_root: Path, hf_name: str) -> tuple[Path | None, str]:
    """The best snapshot dir of ``hf_name`` and what it holds: "weights", "config" or "absent"."""
    repo_dir = cache_root / f"models--{hf_name.replace('/', '--')}"
    snapshots_dir = repo_dir / "snapshots"
    if not snapshots_dir.is_dir():
        return None, "absent"
    ref = repo_dir / "refs" / "main"
    candidates = []
    if ref.is_file():
        candidates.append(snapshots_dir / ref.read_text(encoding="utf-8").strip())
    candidates.extend(sorted(p for p in snapshots_dir.iterdir() if p.is_dir()))
    best: tuple[Path | None, str] = (None, "absent")
    for snap in candidates:
        if not (snap / "config.json").is_file():
            continue
        weights = [snap / f for f in _WEIGHT_FILES] + list(snap.glob("*.safetensors"))
        if any(w.is_file() for w in weights):  # is_file() is False for a dangling blob link
            return snap, "weights"
        if best[0] is None:
            best = (snap, "config")
    return best
