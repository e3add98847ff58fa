"""The config struct of each built-in task kind, with the defaults its runner really uses, and
the cross-field rules a JSON Schema cannot say. Pure: imports no runner.

Each ``check_*`` function takes the raw config dict (it knows which keys were given) and the
struct decoded from it, and returns ``(field, error)`` pairs; an empty list means valid. The
worker decodes the same struct from the assignment and never validates again.
"""

from __future__ import annotations

import functools
import posixpath
import re
from typing import Annotated, Any, Literal

import msgspec

from .pytest_args import bad_test_file, path_error, refused_test_args
from .usercode import bundle_modules, is_user_model, model_name_error, shipped_handler_error

INT64_MAX = 2**63 - 1
PositiveInt = Annotated[int, msgspec.Meta(gt=0, le=INT64_MAX)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
Problems = list[tuple[str, str]]

# torch devices (cuda/rocm may carry an index) and the openvino device names
DEVICE_PATTERN = r"^(cpu|mps|gpu|npu|(cuda|rocm)(:[0-9]+)?)$"
TORCH_HARDWARE = ("cpu", "cuda", "rocm", "mps")
TRAINING_BUILTIN_MODELS = ("cnn", "mlp", "transformer")
# The benchmark models a worker builds by name (bench/hf_models.HF_ENTRIES), with their aliases
# and the Hugging Face repo ids it loads them from, in its order (the setup handler looks for
# them: worker/executors/setup_env.py), and the built-ins without published weights
# (bench/models.BUILTIN_MODELS): checked at submit. Unit tests keep these equal to the runner's,
# which this layer does not import (it imports torch).
BENCHMARK_REGISTRY_MODELS: dict[str, tuple[str, ...]] = {
    "bert-base-uncased": ("google-bert/bert-base-uncased",),
    "gpt2": ("openai-community/gpt2",),
    "t5-small": ("google-t5/t5-small",),
    "vit-base-patch16-224": ("google/vit-base-patch16-224",),
    "resnet-50": ("microsoft/resnet-50",),
}
BENCHMARK_REGISTRY_REPOS: dict[str, tuple[str, ...]] = {
    "bert-base-uncased": ("google-bert/bert-base-uncased", "bert-base-uncased"),
    "gpt2": ("openai-community/gpt2", "gpt2"),
    "t5-small": ("google-t5/t5-small", "t5-small"),
    "vit-base-patch16-224": ("google/vit-base-patch16-224",),
    "resnet-50": ("microsoft/resnet-50",),
}
BENCHMARK_BUILTIN_MODELS = ("mlp", "cnn")
# the model_config fields each built-in takes (bench/models.py MLP_DEFAULTS, CNN_DEFAULTS)
BENCHMARK_BUILTIN_FIELDS: dict[str, tuple[str, ...]] = {
    "mlp": ("hidden_size", "in_features", "num_classes", "num_layers"),
    "cnn": ("channels", "num_classes"),
}


class BenchmarkConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One inference (or single-node training-mode) benchmark; every key the runner reads
    (``bench.task_config.KNOWN_KEYS``). ``device``, ``autocast`` and ``threads`` left out take
    the worker's defaults."""

    model: NonEmpty
    batch_sizes: Annotated[list[PositiveInt], msgspec.Meta(min_length=1)] = msgspec.field(default_factory=lambda: [1])
    backend: Literal["eager", "compile", "openvino"] = "eager"
    device: Annotated[str, msgspec.Meta(pattern=DEVICE_PATTERN)] | None = None
    precision: Literal["fp32", "fp16", "bf16", "int8"] = "fp32"
    autocast: bool | None = None
    mode: Literal["inference", "training"] = "inference"
    optimizer: Literal["sgd", "adamw"] = "sgd"
    learning_rate: Annotated[float, msgspec.Meta(gt=0)] = 1e-4
    warmup: PositiveInt = 3
    iterations: PositiveInt = 30
    min_duration_s: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    sequence_length: PositiveInt = 128
    image_size: PositiveInt = 224
    input_shape: Annotated[list[PositiveInt], msgspec.Meta(min_length=1)] | None = None
    tiny: bool = False
    model_config: dict[str, Any] = {}
    weights: Literal["auto", "pretrained", "random"] = "auto"
    # absent: the worker's --optimize-for / --cuda-streams when it was started with them
    optimize_for: Annotated[Literal["latency", "throughput"], msgspec.Meta(
        description="absent: the worker's --optimize-for if it has one, else latency")] = "latency"
    cuda_streams: Annotated[PositiveInt, msgspec.Meta(
        description="absent: the worker's --cuda-streams if it has one, else 1")] = 1
    seed: NonNegativeInt = 0
    threads: PositiveInt | None = None  # None: the worker's --bench-threads (itself 1 by default)
    name: str | None = None


TRAINING_ONLY_KEYS = ("optimizer", "learning_rate")


def combination_problems(*, autocast: bool | None, precision: str, backend: str, mode: str,
                         cuda_streams: int | None, optimize_for: str | None) -> Problems:
    """Benchmark settings that cannot go together whatever the machine. Checked at submission with
    what the task sets (None: left to the worker's default) and by the worker with its defaults
    applied (``bench.backends.check_config_combination``)."""
    torch_backend = backend in ("eager", "compile")
    out: Problems = []
    if autocast and precision != "fp32":
        out.append(("autocast", "autocast runs an fp32 model in mixed precision; it cannot be combined with "
                                f"precision {precision}"))
    if autocast and not torch_backend:
        out.append(("autocast", f"autocast is a torch feature; backend {backend} does not support it"))
    if mode == "training" and backend == "openvino":
        out.append(("mode", "backend openvino is inference-only; mode training needs eager or compile"))
    if precision == "int8" and backend == "compile":
        out.append(("precision", "precision int8 (dynamic quantization) is an eager-mode path; "
                                 "torch.compile of quantized modules is not supported here"))
    if precision == "int8" and torch_backend and mode == "training":
        out.append(("precision", "precision int8 is inference-only (dynamic quantization)"))
    if cuda_streams is not None and cuda_streams > 1:
        if optimize_for is not None and optimize_for != "throughput":
            out.append(("cuda_streams", "cuda_streams > 1 requires optimize_for: throughput"))
        if mode != "inference" or backend == "openvino":
            out.append(("cuda_streams", "cuda_streams > 1 applies to torch inference only"))
    return out


def check_benchmark(raw: dict[str, Any], cfg: BenchmarkConfig) -> Problems:
    out: Problems = []
    if cfg.mode != "training":
        out += [(k, "only applies to mode: training") for k in TRAINING_ONLY_KEYS if k in raw]
    out += combination_problems(autocast=cfg.autocast, precision=cfg.precision, backend=cfg.backend, mode=cfg.mode,
                                cuda_streams=cfg.cuda_streams if "cuda_streams" in raw else None,
                                optimize_for=cfg.optimize_for if "optimize_for" in raw else None)
    if is_user_model(cfg.model):
        if (bad := model_name_error(cfg.model)) is not None:
            out.append(("model", bad))
    elif cfg.model in BENCHMARK_BUILTIN_MODELS:
        if cfg.weights == "pretrained":
            out.append(("weights", f"built-in model {cfg.model} has no pretrained weights; use random (or auto)"))
        fields = BENCHMARK_BUILTIN_FIELDS[cfg.model]
        out += [("model_config", f"{k!r} is not a field of built-in model {cfg.model} (fields: {', '.join(fields)})")
                for k in cfg.model_config if k not in fields]
    elif not any(cfg.model == name or cfg.model in aliases for name, aliases in BENCHMARK_REGISTRY_MODELS.items()):
        out.append(("model", f"unknown model {cfg.model!r}; known: {', '.join([*BENCHMARK_REGISTRY_MODELS, *BENCHMARK_BUILTIN_MODELS])} "
                             "(or a registry alias such as google-bert/bert-base-uncased), or a user model "
                             "'package.module:callable'"))
    return out


def benchmark_hardware(cfg: BenchmarkConfig) -> tuple[str, ...]:
    """A torch device names its hardware; the openvino backend needs openvino."""
    base = (cfg.device or "").partition(":")[0]
    needs = [base] if base in TORCH_HARDWARE else []
    if cfg.backend == "openvino":
        needs.append("openvino")
    return tuple(needs)


def benchmark_batch_key(cfg: BenchmarkConfig) -> tuple[object, ...]:
    """Benchmarks equal in these share one model load on one worker."""
    return (cfg.model, cfg.backend, cfg.precision, str(cfg.device), cfg.mode, cfg.tiny)


class TrainingConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A multi-node DDP training benchmark; ``batch_size`` is the GLOBAL batch per optimizer step
    (see docs/tasks.md). ``rebalance_interval`` applies to ``dynamic``/``hybrid`` only and
    defaults to 10 there."""

    model: NonEmpty
    nodes: PositiveInt
    batch_size: PositiveInt
    steps: PositiveInt
    nproc_per_node: PositiveInt | Literal["auto"] = "auto"
    warmup_steps: NonNegativeInt = 5
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    load_balance: Literal["none", "proportional", "dynamic", "hybrid"] = "none"
    rebalance_interval: PositiveInt | None = None


def check_training(raw: dict[str, Any], cfg: TrainingConfig) -> Problems:
    out: Problems = []
    if cfg.model not in TRAINING_BUILTIN_MODELS:
        if not is_user_model(cfg.model):
            out.append(("model", f"{cfg.model!r} is neither a built-in model ({', '.join(TRAINING_BUILTIN_MODELS)}) "
                                 "nor a 'package.module:factory' path"))
        elif (bad := model_name_error(cfg.model)) is not None:
            out.append(("model", bad))
    if cfg.batch_size < cfg.nodes:
        out.append(("batch_size", f"global batch {cfg.batch_size} is smaller than nodes={cfg.nodes}"))
    elif isinstance(cfg.nproc_per_node, int) and cfg.batch_size < cfg.nodes * cfg.nproc_per_node:
        out.append(("batch_size", f"global batch {cfg.batch_size} is smaller than the world size "
                                  f"{cfg.nodes * cfg.nproc_per_node}"))
    if cfg.load_balance in ("proportional", "hybrid") and cfg.warmup_steps < 1:
        out.append(("warmup_steps", f"{cfg.load_balance} profiles during warmup; needs warmup_steps >= 1"))
    if cfg.load_balance not in ("dynamic", "hybrid") and "rebalance_interval" in raw:
        out.append(("rebalance_interval", f"only applies to dynamic or hybrid, not {cfg.load_balance!r}"))
    return out


def training_hardware(cfg: TrainingConfig) -> tuple[str, ...]:
    """nccl and fp16 need CUDA on every node."""
    return ("cuda",) if cfg.backend == "nccl" or cfg.precision == "fp16" else ()


class TestConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A pytest run: ``test_file`` under the worker's test root (``path::node`` allowed).
    ``timeout_s`` bounds the pytest run; the task's own ``timeout_s`` applies too (the lower wins).
    ``cwd``: the directory under the test root pytest runs in (default the root; one the root
    lacks falls back to the root), where the pytest plugin ran locally. ``tests``: more test paths
    or node ids after ``test_file``. ``session``: in a task with a bundle, the run these tests
    belong to (the pytest plugin's run id): the worker runs them in a pytest session it keeps for
    that run, submitter, bundle, environment and options (``worker/executors/test_session.py``)
    instead of a pytest of their own; without a bundle it changes nothing. ``collect``: what that
    session collects when it starts, before any test runs (the paths the run's pytest collected
    locally), as plain pytest collects everything first; default the task's own tests. ``warm``:
    the task only starts that session (it runs no test), so that it is ready when the run's tests
    come; without a session to start it does nothing. ``env``: environment variables the tests
    run with, in a task with a bundle only (its sandbox starts from a fixed minimum, not the
    worker's variables: :func:`env_errors` says which names a task may set). ``safe_path``: start
    pytest without its working directory first on ``sys.path`` (Python's ``-P``), as the ``pytest``
    command starts; default as ``python -m pytest`` does, with it there. The pytest plugin sets it
    from how the local pytest was started: a package in the tree then shadows the installed one
    (built, with its compiled parts) there exactly where it did here. ``write_bytecode``: whether
    a session's pytest writes byte code into its tree (``__pycache__``), which its worker keeps
    for the next session of the submitter's key, tree and environment (``bundles/bytecode.py``);
    ``false`` as Python's ``-B`` or ``PYTHONDONTWRITEBYTECODE``, and then none is kept or given to
    it. The pytest plugin sets it from the local pytest (``sys.dont_write_bytecode``). A pytest
    of a task's own never writes any (its tree is thrown away)."""

    __test__ = False  # not a pytest test class

    test_file: NonEmpty
    test_args: list[str] = []
    timeout_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    cwd: str | None = None
    tests: list[NonEmpty] = []
    session: Annotated[str, msgspec.Meta(min_length=1, max_length=200)] | None = None
    collect: list[NonEmpty] = []
    warm: bool = False
    env: dict[str, str] = {}
    safe_path: bool = False
    write_bytecode: bool = True


MAX_TASK_ENV = 64  # variables a test task may set
MAX_TASK_ENV_VALUE = 4096  # characters of one value
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# What the worker sets for the sandbox (sandbox.task_environ: where the task's home, scratch and
# Python environment are, the GPUs its limits allow) or that would change how its pytest starts,
# loads code or what it passes on (its options travel as test_args, checked there): not a task's
RESERVED_ENV = frozenset({
    "PATH", "HOME", "TMPDIR", "TMP", "TEMP", "USER", "LOGNAME", "SHELL", "PWD", "VIRTUAL_ENV",
    "PYTHONPATH", "PYTHONHOME", "PYTHONNOUSERSITE", "PYTHONDONTWRITEBYTECODE", "PYTHONSTARTUP",
    "PYTHONEXECUTABLE", "PYTHONSAFEPATH", "PYTHONPLATLIBDIR",
    "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_DISABLE_PLUGIN_AUTOLOAD", "PYTEST_CURRENT_TEST",
    "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES",
})
RESERVED_ENV_PREFIXES = ("DT_", "LD_")


def env_errors(env: dict[str, str]) -> list[str]:
    """Why a test task's ``env`` cannot be set, one line per variable (empty: it can)."""
    out = []
    if len(env) > MAX_TASK_ENV:
        out.append(f"{len(env)} variables; at most {MAX_TASK_ENV}")
    for name, value in env.items():
        if not _ENV_NAME.fullmatch(name):
            out.append(f"{name[:60]!r}: a variable's name is letters, digits and '_', not starting with a digit")
        elif name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
            out.append(f"{name}: set by the worker for the task's sandbox, or read by pytest or Python at start "
                       f"(reserved: {', '.join(sorted(RESERVED_ENV))} and names starting with "
                       f"{' or '.join(RESERVED_ENV_PREFIXES)}); pass pytest options as test_args")
        elif "\x00" in value or len(value) > MAX_TASK_ENV_VALUE:
            out.append(f"{name}: a value is at most {MAX_TASK_ENV_VALUE} characters, without NUL")
    return out


def check_test(raw: dict[str, Any], cfg: TestConfig) -> Problems:
    out: Problems = [("env", e) for e in env_errors(cfg.env)]
    bad = bad_test_file(cfg.test_file) or path_error(None, cfg.test_file, "test_file")
    if bad is not None:
        out.append(("test_file", bad))
    out += [("test_args", e) for e in refused_test_args(cfg.test_args)]
    if cfg.cwd is not None and (bad := path_error(None, cfg.cwd, "cwd")) is not None:
        out.append(("cwd", bad))
    for field, tests in (("tests", cfg.tests), ("collect", cfg.collect)):
        for i, test in enumerate(tests):
            if (bad := bad_test_file(test) or path_error(None, test, field)) is not None:
                out.append((f"{field}[{i}]", bad))
    return out


def shipped_test(cfg: TestConfig, files: frozenset[str]) -> Problems:
    """In a task with a bundle listing ``files``: ``test_file`` (``path`` or ``path::node``) must
    be one of them or a directory holding some (the bundle's tree is the test root); so must each
    of ``tests``."""
    for field, tests in (("tests", cfg.tests), ("collect", cfg.collect)):
        for test in tests:
            if (bad := _not_in_bundle(test, files)) is not None:
                return [(field, bad)]
    bad = _not_in_bundle(cfg.test_file, files)
    return [] if bad is None else [("test_file", bad)]


def _not_in_bundle(test: str, files: frozenset[str]) -> str | None:
    part = posixpath.normpath(test.partition("::")[0] or ".")
    if part == "." or part in files or part in _directories(files):
        return None
    tests = sorted(f for f in files if f.endswith(".py") and (posixpath.basename(f).startswith("test_")
                                                               or f.endswith("_test.py")))
    return (f"{part!r} is not in the bundle ({len(files)} file(s); its test files: "
            f"{', '.join(tests[:10]) + (', ...' if len(tests) > 10 else '') if tests else 'none named test_*.py or *_test.py'})")


def shipped_custom(cfg: CustomConfig, files: frozenset[str]) -> Problems:
    """In a task with a bundle listing ``files``: ``name`` is a ``module:function`` of the bundle."""
    bad = shipped_handler_error(cfg.name, _modules(files))
    return [] if bad is None else [("name", bad)]


# once per bundle, not per task: a submission of many tasks names one bundle (a frozenset keeps its hash)
@functools.lru_cache(maxsize=8)
def _directories(files: frozenset[str]) -> frozenset[str]:
    return frozenset(f[:i] for f in files for i, c in enumerate(f) if c == "/")


@functools.lru_cache(maxsize=8)
def _modules(files: frozenset[str]) -> tuple[str, ...]:
    return bundle_modules(files)


class CustomConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A named handler the worker's operator installed, called with ``parameters``; in a task with a
    ``bundle``, ``name`` is ``module:function`` inside the bundle, run in a sandboxed child of its own."""

    name: NonEmpty
    parameters: dict[str, Any] = {}
