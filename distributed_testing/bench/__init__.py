"""The PyTorch/OpenVINO benchmark engine that a worker runs inside a child process.

Public API: :func:`run_benchmark`, :func:`run_benchmark_batch`, :class:`RunnerDefaults`,
:func:`known_models`; the child process is ``python -m distributed_testing.bench.child``.
Module map: config (keys, validation), models / hf_models (registry), backends (devices,
precisions, torch eager/compile), openvino_backend, measure (timing, statistics, memory),
disturbance (was the measurement disturbed: verdicts), env (environment fingerprint), runner (entry points), child (JSON-lines process).
"""

from distributed_testing.bench.models import known_models
from distributed_testing.bench.runner import run_benchmark, run_benchmark_batch
from distributed_testing.bench.task_config import RunnerDefaults

__all__ = ["RunnerDefaults", "known_models", "run_benchmark", "run_benchmark_batch"]
