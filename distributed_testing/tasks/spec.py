"""The public task JSON format, its JSON Schema, and validation.

A task document is one task object or a list of them::

    {"task_id": "test-bert-001", "type": "test",
     "config": {"test_file": "test_bert.py", "test_args": ["--batch-size", "4"]},
     "requirements": {"hardware": ["cpu"], "tags": ["transformers"], "min_memory_gb": 4},
     "priority": 5, "timeout_s": 600, "max_retries": 2}

``task_id`` may be omitted; the coordinator assigns one. Validation reports *every* bad field with
a path such as ``[1].config.batch_sizes[2]`` (:class:`~distributed_testing.errors.ValidationError`),
so one round trip fixes a whole file. Benchmark configs are checked here for the fields the
coordinator schedules on (``model``, ``batch_sizes``, ``precision``, ``device``, ``backend``,
``iterations``); the worker's benchmark runner validates the rest. A benchmark whose config has
``"kind": "training"`` is a multi-node training task, validated in full by
:func:`distributed_testing.training.config.parse_config` (errors name ``config.<key>``).
The JSON must be strict (RFC 8259: no ``NaN``/``Infinity``, no lone surrogates), and the free-form
parts (custom ``parameters``, benchmark ``config``) may nest at most ``MAX_NESTING`` levels and hold
only integers that fit 64 bits: they are journalled as MessagePack and stored in DuckDB.
"""

from __future__ import annotations

import hashlib
import itertools
import uuid
from functools import cache
from typing import Annotated, Any, Literal

import msgspec

from ..errors import ValidationError
from ..training.config import TASK_KIND as TRAINING_KIND
from ..training.config import parse_config as parse_training_config
from ..training.errors import InvalidTrainingConfig
from . import usercode
from .pytest_args import bad_test_file, path_error, refused_test_args

HardwareName = Literal["cpu", "cuda", "rocm", "mps", "openvino"]
TaskId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}$(?!\n)")]
INT64_MAX = 2**63 - 1
PositiveInt = Annotated[int, msgspec.Meta(gt=0, le=INT64_MAX)]
# Free-form parts (custom ``parameters``, benchmark ``config``) may nest at most this deep, and
# their integers must fit 64 bits: the journal, DuckDB and the wire all store them.
MAX_NESTING = 32


class Requirements(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    hardware: list[HardwareName] = []
    tags: list[str] = []
    min_memory_gb: Annotated[float, msgspec.Meta(ge=0)] | None = None


class TestConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    test_file: Annotated[str, msgspec.Meta(min_length=1)]
    test_args: list[str] = []


class CustomConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: Annotated[str, msgspec.Meta(min_length=1)]
    parameters: dict[str, Any] = {}


class BenchmarkConfig(msgspec.Struct, frozen=True):
    """Scheduling-relevant benchmark fields; other keys pass through to the worker's runner."""

    model: Annotated[str, msgspec.Meta(min_length=1)]
    batch_sizes: Annotated[list[PositiveInt], msgspec.Meta(min_length=1)] = msgspec.field(default_factory=lambda: [1])
    precision: Literal["fp32", "fp16", "bf16", "int8"] = "fp32"
    iterations: PositiveInt = 10
    backend: Literal["eager", "compile", "openvino"] = "eager"
    device: HardwareName | None = None


class TrainingTaskConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A multi-node DDP training benchmark (``"kind": "training"``); ``batch_size`` is the GLOBAL
    batch per optimizer step. Published in the schema; :func:`parse_training_config` is the
    full check (combinations such as ``batch_size`` >= world size)."""

    kind: Literal["training"]
    model: Annotated[str, msgspec.Meta(min_length=1)]
    nodes: PositiveInt
    batch_size: PositiveInt
    steps: PositiveInt
    nproc_per_node: PositiveInt | Literal["auto"] = "auto"
    warmup_steps: Annotated[int, msgspec.Meta(ge=0)] = 5
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    load_balance: Literal["none", "proportional", "dynamic", "hybrid"] = "none"
    rebalance_interval: PositiveInt | None = None


class _Task(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="type", kw_only=True):
    task_id: TaskId | None = None
    requirements: Requirements = Requirements()
    priority: Annotated[int, msgspec.Meta(ge=-1000, le=1000)] = 0
    timeout_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    max_retries: Annotated[int, msgspec.Meta(ge=0, le=100)] = 0
    max_memory_mb: PositiveInt | None = None
    cache: bool = False


class TestTask(_Task, frozen=True, tag="test"):
    config: TestConfig


class CustomTask(_Task, frozen=True, tag="custom"):
    config: CustomConfig


class BenchmarkTask(_Task, frozen=True, tag="benchmark"):
    config: dict[str, Any]


TaskSpec = BenchmarkTask | TestTask | CustomTask
TASK_TYPES: dict[str, type[_Task]] = {"benchmark": BenchmarkTask, "test": TestTask, "custom": CustomTask}


@cache
def task_json_schema() -> dict[str, Any]:
    """The published JSON Schema (draft 2020-12) of one task document (object or list)."""
    (_, defs) = msgspec.json.schema_components(
        [TestTask, CustomTask, BenchmarkTask, BenchmarkConfig, TrainingTaskConfig], ref_template="#/$defs/{name}"
    )
    training = {"if": {"type": "object", "properties": {"kind": {"const": TRAINING_KIND}}, "required": ["kind"]},
                "then": {"$ref": "#/$defs/TrainingTaskConfig"}, "else": {"$ref": "#/$defs/BenchmarkConfig"}}
    variants = []
    for name, conf in (("TestTask", "TestConfig"), ("CustomTask", "CustomConfig"), ("BenchmarkTask", "BenchmarkConfig")):
        d = defs[name]
        d["properties"]["config"] = training if name == "BenchmarkTask" else {"$ref": f"#/$defs/{conf}"}
        d["required"] = sorted(set(d.get("required", [])) | {"type", "config"})
        variants.append({"$ref": f"#/$defs/{name}"})
    task = {"oneOf": variants, "discriminator": {"propertyName": "type"}}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://distributed-testing.dev/schema/task.json",
        "title": "distributed_testing task",
        "$defs": {**defs, "Task": task},
        "oneOf": [{"$ref": "#/$defs/Task"}, {"type": "array", "items": {"$ref": "#/$defs/Task"}, "minItems": 1}],
    }


def _variant_schema(type_name: str) -> dict[str, Any]:
    full = task_json_schema()
    name = {"test": "TestTask", "custom": "CustomTask", "benchmark": "BenchmarkTask"}[type_name]
    return {"$defs": full["$defs"], "$ref": f"#/$defs/{name}"}


def _path(prefix: str, parts: Any) -> str:
    out = prefix
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(document)"


def _collect_errors(item: Any, prefix: str) -> list[dict[str, str]]:
    import jsonschema  # imported lazily: only invalid input pays for it

    if not isinstance(item, dict):
        return [{"field": prefix or "(document)", "error": "a task must be a JSON object"}]
    type_name = item.get("type")
    if not isinstance(type_name, str) or type_name not in TASK_TYPES:
        return [{"field": _path(prefix, ["type"]), "error": f"must be one of {sorted(TASK_TYPES)}, got {type_name!r}"}]
    validator = jsonschema.Draft202012Validator(_variant_schema(type_name))
    errors = [
        {"field": _path(prefix, list(e.absolute_path)), "error": e.message}
        for e in sorted(validator.iter_errors(item), key=lambda e: list(map(str, e.absolute_path)))
    ]
    if not errors and type_name == "benchmark":
        errors = _benchmark_errors(item.get("config"), prefix)
    return errors


def _is_training(config: Any) -> bool:
    return isinstance(config, dict) and config.get("kind") == TRAINING_KIND


def _check_benchmark_config(config: Any) -> None:
    """Raise msgspec.ValidationError when a benchmark config (inference or training) is invalid."""
    if not _is_training(config):
        msgspec.convert(config, BenchmarkConfig)
        return
    try:
        parse_training_config(config)
    except InvalidTrainingConfig as exc:
        raise msgspec.ValidationError(str(exc)) from exc


def _benchmark_errors(config: Any, prefix: str) -> list[dict[str, str]]:
    if _is_training(config):
        try:
            parse_training_config(config)
        except InvalidTrainingConfig as exc:
            return [{"field": _path(prefix, ["config", exc.field] if exc.field else ["config"]), "error": e["error"]}
                    for e in exc.errors]
        return []
    try:
        msgspec.convert(config, BenchmarkConfig)
    except msgspec.ValidationError as exc:
        return [{"field": _path(prefix, ["config"]), "error": str(exc)}]
    return []


_INT_FIELDS = ("priority", "max_retries", "max_memory_mb")
_BENCH_INT_FIELDS = ("iterations", "warmup", "batch_size", "steps", "warmup_steps", "nodes", "sequence_length", "image_size",
                     "nproc_per_node", "rebalance_interval")


def _whole(v: Any) -> Any:
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _normalize_ints(item: Any) -> Any:
    """JSON Schema's ``integer`` admits ``5.0``; so do we, for the fields typed int."""
    if not isinstance(item, dict):
        return item
    out = {k: (_whole(v) if k in _INT_FIELDS else v) for k, v in item.items()}
    cfg = out.get("config")
    if out.get("type") == "benchmark" and isinstance(cfg, dict):
        cfg = {k: (_whole(v) if k in _BENCH_INT_FIELDS else v) for k, v in cfg.items()}
        if isinstance(cfg.get("batch_sizes"), list):
            cfg["batch_sizes"] = [_whole(v) for v in cfg["batch_sizes"]]
        out["config"] = cfg
    return out


def _convert(item: Any) -> TaskSpec:
    spec: TaskSpec = msgspec.convert(item, TaskSpec)
    if isinstance(spec, BenchmarkTask):
        _check_benchmark_config(spec.config)
    return spec


def _parse_one(item: Any, prefix: str) -> TaskSpec:
    try:
        spec = _convert(item)
    except msgspec.ValidationError:
        item = _normalize_ints(item)  # only the slow path pays for normalising
        try:
            spec = _convert(item)
        except msgspec.ValidationError as exc:
            errors = _collect_errors(item, prefix) or [{"field": prefix or "(document)", "error": str(exc)}]
            raise ValidationError(errors) from exc
    _check_free_form(spec, prefix)
    _check_user_code(spec, prefix)
    return spec


def _check_user_code(spec: TaskSpec, prefix: str) -> None:
    """Raise ValidationError for what no worker would run: a malformed ``module:callable`` model
    name, ``test_args`` with an '@' file, an unknown short option, or a path climbing out of the
    test root with '..' (the worker checks the rest against its own root and permissions)."""
    errors: list[dict[str, str]] = []
    if isinstance(spec, BenchmarkTask):
        name = spec.config.get("model")
        bad = usercode.model_name_error(name) if isinstance(name, str) and usercode.is_user_model(name) else None
        if bad is not None:
            errors.append({"field": _path(prefix, ["config", "model"]), "error": bad})
    elif isinstance(spec, TestTask):
        bad = bad_test_file(spec.config.test_file) or path_error(None, spec.config.test_file, "test_file")
        if bad is not None:
            errors.append({"field": _path(prefix, ["config", "test_file"]), "error": bad})
        errors += [{"field": _path(prefix, ["config", "test_args"]), "error": e}
                   for e in refused_test_args(spec.config.test_args)]
    if errors:
        raise ValidationError(errors)


def _check_free_form(spec: TaskSpec, prefix: str) -> None:
    """Raise ValidationError if the free-form part of ``spec`` nests deeper than MAX_NESTING or
    holds an integer outside 64 bits (the typed fields are bounded by their annotations)."""
    if isinstance(spec, CustomTask):
        value, path = spec.config.parameters, _path(prefix, ["config", "parameters"])
    elif isinstance(spec, BenchmarkTask):
        value, path = spec.config, _path(prefix, ["config"])
    else:
        return
    stack: list[tuple[Any, str, int]] = [(value, path, 1)]
    while stack:
        v, where, depth = stack.pop()
        if isinstance(v, dict | list):
            if depth > MAX_NESTING:
                raise ValidationError([{"field": where, "error": f"nested deeper than {MAX_NESTING} levels"}])
            items = v.items() if isinstance(v, dict) else enumerate(v)
            stack.extend((child, f"{where}[{k}]" if isinstance(k, int) else f"{where}.{k}", depth + 1)
                         for k, child in items)
        elif isinstance(v, int) and not isinstance(v, bool) and not -INT64_MAX - 1 <= v <= INT64_MAX:
            raise ValidationError([{"field": where, "error": "integer does not fit in 64 bits"}])


def parse_tasks(doc: Any) -> list[TaskSpec]:
    """Validate a task document (one object or a list) into specs; raises ValidationError
    listing every bad field of every task."""
    items = doc if isinstance(doc, list) else [doc]
    if not items:
        raise ValidationError([{"field": "(document)", "error": "the task list is empty"}])
    specs: list[TaskSpec] = []
    errors: list[dict[str, str]] = []
    for i, item in enumerate(items):
        try:
            specs.append(_parse_one(item, f"[{i}]" if isinstance(doc, list) else ""))
        except ValidationError as exc:
            errors.extend(exc.errors)
    if errors:
        raise ValidationError(errors)
    ids = [s.task_id for s in specs if s.task_id is not None]
    dup = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) != len(ids) else []
    if dup:
        raise ValidationError([{"field": "task_id", "error": f"duplicate ids in one submission: {dup}"}])
    return specs


_ID_PREFIX = uuid.uuid4().hex[:8]  # random per process; with the counter, ids never repeat
_id_counter = itertools.count()
_TYPE_OF: dict[type[Any], str] = {cls: name for name, cls in TASK_TYPES.items()}


_FAST_DECODER: msgspec.json.Decoder[Any] = msgspec.json.Decoder(list[TaskSpec] | TaskSpec)


def parse_task_json(body: bytes) -> list[TaskSpec]:
    """Validate a JSON task document given as bytes. Valid input is decoded straight into typed
    specs in one pass; anything else goes through :func:`parse_tasks` for the full error list."""
    try:
        decoded = _FAST_DECODER.decode(body)
        items = decoded if isinstance(decoded, list) else [decoded]
        for i, s in enumerate(items):
            if isinstance(s, BenchmarkTask):
                _check_benchmark_config(s.config)
            _check_free_form(s, f"[{i}]" if isinstance(decoded, list) else "")
            _check_user_code(s, f"[{i}]" if isinstance(decoded, list) else "")
        if items and len({s.task_id for s in items if s.task_id is not None}) == sum(s.task_id is not None for s in items):
            return items
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError, ValidationError, UnicodeDecodeError):
        pass  # the slow path below names every bad field
    return parse_tasks(decode_json(body))


_ANY_JSON: msgspec.json.Decoder[Any] = msgspec.json.Decoder()


def decode_json(body: bytes) -> Any:
    """Strict RFC 8259 JSON (an empty body reads as ``null``): no NaN or Infinity, no number
    beyond a double, no lone surrogate. Raises ValidationError on ``(body)`` otherwise, also for
    nesting deeper than the decoder's recursion limit and for a string that is not UTF-8."""
    try:
        return _ANY_JSON.decode(body or b"null")
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValidationError([{"field": "(body)", "error": f"not valid JSON: {exc}"}]) from exc
    except RecursionError as exc:
        raise ValidationError([{"field": "(body)", "error": "not valid JSON: nested too deeply"}]) from exc
    except UnicodeDecodeError as exc:  # msgspec's answer to a string that is not UTF-8
        raise ValidationError([{"field": "(body)", "error": "not valid JSON: a string is not valid UTF-8"}]) from exc


def with_id(spec: TaskSpec) -> TaskSpec:
    """The spec with a coordinator-assigned id (``<type>-<16 hex>``) when the submitter gave none."""
    if spec.task_id is not None:
        return spec
    return msgspec.structs.replace(spec, task_id=f"{spec_type(spec)}-{_ID_PREFIX}{next(_id_counter):08x}")


def spec_type(spec: TaskSpec) -> str:
    return _TYPE_OF[type(spec)]


def config_dict(spec: TaskSpec) -> dict[str, Any]:
    cfg = spec.config
    return cfg if isinstance(cfg, dict) else msgspec.to_builtins(cfg)


def spec_digest(spec: TaskSpec) -> str:
    """Stable hash of the whole spec: same id + same digest is an idempotent resubmission."""
    return hashlib.sha256(msgspec.json.encode(spec, order="sorted")).hexdigest()


def spec_to_dict(spec: TaskSpec) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(spec)
    return out


def spec_from_dict(d: dict[str, Any]) -> TaskSpec:
    spec: TaskSpec = msgspec.convert(d, TaskSpec)
    return spec
