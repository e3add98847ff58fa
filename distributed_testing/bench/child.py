"""Benchmark child process: newline-delimited JSON requests on stdin, one JSON line per response.

Started by the worker (with its own ``CUDA_VISIBLE_DEVICES``) as::

    python -m distributed_testing.bench.child [--threads N] [--interop-threads N]
                                              [--mixed-precision] [--device D]
                                              [--hf-cache-dir DIR] [--allow-model-modules P,...]

``--threads`` defaults to ``$DT_BENCH_THREADS`` (unset: 1, as ``torch.utils.benchmark``) and is
the torch intra-op thread count of every task that sets no ``threads`` itself; ``--interop-threads`` (``$DT_BENCH_INTEROP_THREADS``) sets
``torch.set_num_interop_threads`` once at start, before any parallel work. ``--mixed-precision``
makes autocast the default (see RunnerDefaults), ``--device`` the default device.
``--allow-model-modules`` lists the module prefixes ``module:callable`` models may be imported
from (default: none, so only registry and built-in models build).

Requests (one JSON object per line)::

    {"id": ..., "configs": [config, ...]}          op "run" (the default)
    {"id": ..., "op": "status"}                   -> {"id", "pid", "cached_models", "threads"}
    {"id": ..., "op": "clear_cache"}              -> {"id", "cleared": n}
    {"id": ..., "op": "fingerprint", "device": D, "backend": B, "threads": N}
                                                  -> {"id", "environment", "fingerprint_hash"}

``fingerprint`` answers the environment (``bench/env.py``) that a run of a task with that
``backend`` (default eager), ``device`` (default the child's ``--device``) and ``threads``
(default the child's ``--threads``) would report, without
building a model; a device that is absent or unusable answers an error naming the reason.

A run answers ``{"id": ..., "results": [result | error entry, ...]}`` (see runner.py). Before it,
each measured batch size sends ``{"id": ..., "progress": {"index": i, "done": k, "total": n,
"line": "cnn b8 fp32: 1.23 ms (3 of 6)"}}`` (config ``i``'s ``k``-th batch size of ``n``), and
prints that line to the child's output, where the worker's log (and a task's output) shows it. The
model cache lives as long as the process, so later requests reuse loaded models. A request
that cannot be parsed answers ``{"id": <id or null>, "error": {"type", "message"}}``. Any
exception inside a task, out-of-memory included, becomes an error entry; only a hard crash
ends the process. The process exits 0 at end of input.

Only protocol lines go to the real stdout: file descriptor 1 is pointed at stderr at start, so
output printed by libraries (progress bars, C++ messages) cannot corrupt the stream.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import IO, Any

import torch

from distributed_testing.bench.backends import resolve_torch_device
from distributed_testing.bench.env import collect_environment
from distributed_testing.bench.runner import ModelCache, apply_threads, run_benchmark_batch
from distributed_testing.bench.task_config import BACKENDS, DEFAULT_THREADS, RunnerDefaults
from distributed_testing.errors import ConfigError, DTError, ExecutionError
from distributed_testing.process.childout import end_request
from distributed_testing.tasks.usercode import parse_module_prefixes

logger = logging.getLogger("distributed_testing.bench.child")


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{name} must be a positive integer, got {raw!r}")
    return int(raw)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m distributed_testing.bench.child", description="Benchmark child process (JSON lines)."
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=_env_int("DT_BENCH_THREADS") or DEFAULT_THREADS,
        help=f"torch intra-op threads of tasks that set none (env DT_BENCH_THREADS; default {DEFAULT_THREADS})",
    )
    parser.add_argument(
        "--interop-threads",
        type=int,
        default=_env_int("DT_BENCH_INTEROP_THREADS"),
        help="torch inter-op threads (env DT_BENCH_INTEROP_THREADS)",
    )
    parser.add_argument("--mixed-precision", action="store_true", help="autocast by default for fp32 torch tasks")
    parser.add_argument("--device", default="cpu", help="device for tasks that name none")
    parser.add_argument("--hf-cache-dir", default=None, help="Hugging Face hub cache directory")
    parser.add_argument("--bundle-root", default=None,
                        help="a shipped tree whose modules 'module:callable' models import: appended to sys.path, "
                             "after the standard library and the installed packages, which it cannot shadow")
    parser.add_argument("--allow-model-modules", default="",
                        help="comma-separated module prefixes a 'module:callable' model may come from (default: none)")
    args = parser.parse_args(argv)
    for flag in ("threads", "interop_threads"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    return args


def _error(request_id: Any, kind: str, message: str) -> dict[str, Any]:
    return {"id": request_id, "error": {"type": kind, "message": message}}


def environment_for(backend: str, device: str, threads: int) -> dict[str, Any]:
    """The environment a run with ``backend`` on ``device`` with ``threads`` reports (same fields
    and hash as runner.py's result); ExecutionError when the device cannot be used here."""
    if backend not in BACKENDS:
        raise ExecutionError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})")
    apply_threads(threads)
    name = device.strip().lower()
    if backend != "openvino":
        return collect_environment(resolve_torch_device(name))
    from distributed_testing.bench.openvino_backend import _openvino, resolve_ov_device

    core = _openvino().Core()
    ov_device = resolve_ov_device(core, name)
    full_name = core.get_property(ov_device, "FULL_DEVICE_NAME")
    return collect_environment(None, f"{full_name} (OpenVINO {ov_device})", f"openvino:{ov_device}")


def _fingerprint(request: dict[str, Any], defaults: RunnerDefaults) -> dict[str, Any]:
    request_id = request.get("id")
    backend, device = request.get("backend", "eager"), request.get("device", defaults.device)
    threads = request.get("threads", defaults.threads)
    if not isinstance(backend, str) or not isinstance(device, str) or not device:
        return _error(request_id, "BadRequest", "'backend' and 'device' must be non-empty strings")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        return _error(request_id, "BadRequest", f"'threads' must be a positive integer, got {threads!r}")
    try:
        environment = environment_for(backend, device, threads)
    except DTError as exc:
        return _error(request_id, type(exc).__name__, str(exc))
    return {"id": request_id, "environment": environment, "fingerprint_hash": environment["fingerprint_hash"]}


Progress = Callable[[Any, int, int, int, str], None]
"""Told (request id, config index, done, total, line) as each batch size of a run finishes."""


def handle_request(request: Any, defaults: RunnerDefaults, cache: ModelCache,
                   progress: Progress | None = None) -> dict[str, Any]:
    """One decoded request -> its response (never raises for a bad request)."""
    if not isinstance(request, dict):
        return _error(None, "BadRequest", "a request must be a JSON object")
    request_id = request.get("id")
    op = request.get("op", "run")
    if op == "status":
        return {"id": request_id, "pid": os.getpid(), "cached_models": len(cache), "threads": torch.get_num_threads()}
    if op == "clear_cache":
        cleared = len(cache)
        cache.clear()
        return {"id": request_id, "cleared": cleared}
    if op == "fingerprint":
        return _fingerprint(request, defaults)
    if op != "run":
        return _error(request_id, "BadRequest", f"unknown op {op!r} (run, status, clear_cache, fingerprint)")
    configs = request.get("configs")
    if not isinstance(configs, list):
        return _error(request_id, "BadRequest", "'configs' must be a list of benchmark configs")
    each = None if progress is None else functools.partial(progress, request_id)
    return {"id": request_id, "results": run_benchmark_batch(configs, defaults=defaults, model_cache=cache,
                                                             progress=each)}


def handle_line(line: str, defaults: RunnerDefaults, cache: ModelCache,
                progress: Progress | None = None) -> dict[str, Any]:
    try:
        request = json.loads(line)
    except json.JSONDecodeError as exc:
        return _error(None, "BadRequest", f"invalid JSON: {exc}")
    return handle_request(request, defaults, cache, progress)


def _reporter(out: IO[str]) -> Progress:
    """Writes each progress report to the protocol stream and its line to the child's output."""
    def report(request_id: Any, index: int, done: int, total: int, line: str) -> None:
        print(line, flush=True)  # fd 1 is stderr here (_protocol_stdout): the worker's log, the task's output
        progress = {"index": index, "done": done, "total": total, "line": line}
        out.write(json.dumps({"id": request_id, "progress": progress}) + "\n")
        out.flush()
    return report


def serve(stdin: IO[str], out: IO[str], defaults: RunnerDefaults) -> None:
    """Answer requests until end of input, keeping one model cache."""
    cache: ModelCache = {}
    report = _reporter(out)
    for line in stdin:
        if not line.strip():
            continue
        response = handle_line(line, defaults, cache, report)
        end_request()  # this request's output before its reply, never in the next one's (worker's stderr_tail)
        out.write(json.dumps(response) + "\n")
        out.flush()


def _protocol_stdout() -> IO[str]:
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1, encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return protocol


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        args = parse_args(argv)
        if args.interop_threads is not None:
            torch.set_num_interop_threads(args.interop_threads)
        defaults = RunnerDefaults(
            autocast=args.mixed_precision, device=args.device, threads=args.threads, hf_cache_dir=args.hf_cache_dir,
            allow_model_modules=parse_module_prefixes(args.allow_model_modules, "--allow-model-modules"),
        )
    except (ConfigError, ExecutionError) as exc:
        logger.error("%s", exc)
        return 2
    if args.bundle_root is not None:
        sys.path.append(args.bundle_root)
    apply_threads(defaults.threads)
    out = _protocol_stdout()
    logger.info("benchmark child %d ready (threads=%d)", os.getpid(), torch.get_num_threads())
    serve(sys.stdin, out, defaults)
    return 0


if __name__ == "__main__":
    sys.exit(main())
