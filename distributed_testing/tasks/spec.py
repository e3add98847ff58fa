"""The public task JSON format, its JSON Schema, and validation.

A task document is one task object or a list of them::

    {"task_id": "test-bert-001", "type": "test",
     "config": {"test_file": "test_bert.py", "test_args": ["--batch-size", "4"]},
     "requirements": {"hardware": ["cpu"], "tags": ["transformers"], "min_memory_gb": 4},
     "priority": 5, "timeout_s": 600, "max_retries": 2}

``type`` names a kind of the task-kind registry (:mod:`.kinds`: ``benchmark``, ``training``,
``test``, ``custom``), and ``config`` is validated in full, here and only here, against that
kind's config struct and cross-field rules. ``task_id`` may be omitted; the coordinator assigns
one. Validation reports *every* bad field with a path such as ``[1].config.batch_sizes[2]`` and
says what is allowed (:class:`~distributed_testing.errors.ValidationError`), so one round trip
fixes a whole file. The JSON must be strict (RFC 8259: no ``NaN``/``Infinity``, no lone
surrogates), and a config may nest at most ``MAX_NESTING`` levels and hold only integers that fit
64 bits: it is journalled as MessagePack and stored in DuckDB.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import uuid
from typing import Annotated, Any, Literal

import msgspec

from ..errors import ValidationError
from . import kinds, pyreqs

HardwareName = Literal["cpu", "cuda", "rocm", "mps", "openvino"]
TaskId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}$(?!\n)")]
RUN_ID_PATTERN = r"^run-[0-9a-f]{12}$(?!\n)"  # POST /api/v1/runs makes them (coordinator/runs_api.py)
RunId = Annotated[str, msgspec.Meta(pattern=RUN_ID_PATTERN, description="the run this task joins (POST /api/v1/runs)")]
INT64_MAX = 2**63 - 1
PositiveInt = Annotated[int, msgspec.Meta(gt=0, le=INT64_MAX)]
# A config may nest at most this deep, and its integers must fit 64 bits: the journal, DuckDB
# and the wire all store them.
MAX_NESTING = 32


class Requirements(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    hardware: list[HardwareName] = []
    tags: list[str] = []
    min_memory_gb: Annotated[float, msgspec.Meta(ge=0)] | None = None
    # pip requirements of a bundle task (tasks/pyreqs.py; docs/tasks.md, "Python requirements"):
    # the worker builds a virtual environment with them, so they do not narrow placement
    python: Annotated[list[Annotated[str, msgspec.Meta(min_length=1, max_length=pyreqs.MAX_LENGTH)]],
                      msgspec.Meta(max_length=pyreqs.MAX_ENTRIES, description=(
                          "bundle tasks only: pip requirements (PEP 508 without URLs, or ./dir in the bundle) "
                          "the worker installs in a virtual environment; no pip options"))] = []


class _TaskFields(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The fields every task has, whatever its kind."""

    task_id: TaskId | None = None
    requirements: Requirements = Requirements()
    priority: Annotated[int, msgspec.Meta(ge=-1000, le=1000)] = 0
    timeout_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    max_retries: Annotated[int, msgspec.Meta(ge=0, le=100)] = 0
    max_memory_mb: PositiveInt | None = None
    cache: bool = False
    # shipped code: the manifest digest of an uploaded bundle (docs/tasks.md, "Bundles")
    bundle: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")] | None = None
    # the run it belongs to; not part of the body a resubmission is compared by (``spec_digest``)
    run_id: RunId | None = None


class TaskSpec(_TaskFields, frozen=True, kw_only=True):
    """One validated task. ``config`` is the submitted config dict, already checked against its
    kind (:func:`~.kinds.Registry.get`); :func:`config_struct` decodes it."""

    type: str
    config: dict[str, Any]


def _variant_name(kind: str) -> str:
    return "".join(p.capitalize() for p in kind.replace("-", "_").split("_")) + "Task"


def _variants(registry: kinds.Registry) -> list[type[msgspec.Struct]]:
    return [msgspec.defstruct(_variant_name(k.name), [("config", k.config)], bases=(_TaskFields,), tag=k.name,
                              tag_field="type", frozen=True, forbid_unknown_fields=True, kw_only=True)
            for k in registry.kinds]


def _build_schema(registry: kinds.Registry) -> dict[str, Any]:
    variants = _variants(registry)
    (_, defs) = msgspec.json.schema_components(variants, ref_template="#/$defs/{name}")
    for d in defs.values():
        # a struct's docstring as inspect.cleandoc reads it, whichever msgspec wrote the schema
        # (0.23 dedents a docstring's lines; earlier releases kept their indentation)
        if isinstance(d.get("description"), str):
            d["description"] = inspect.cleandoc(d["description"])
    for v in variants:
        d = defs[v.__name__]
        d["required"] = sorted(set(d.get("required", [])) | {"type", "config"})
    task = {"oneOf": [{"$ref": f"#/$defs/{v.__name__}"} for v in variants], "discriminator": {"propertyName": "type"}}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://distributed-testing.dev/schema/task.json",
        "title": "distributed_testing task",
        "$defs": {**defs, "Task": task},
        "oneOf": [{"$ref": "#/$defs/Task"}, {"type": "array", "items": {"$ref": "#/$defs/Task"}, "minItems": 1}],
    }


def task_json_schema() -> dict[str, Any]:
    """The published JSON Schema (draft 2020-12) of one task document (object or list), built
    from the active registry's config structs."""
    registry = kinds.active()
    schema: dict[str, Any] = registry.cached("schema", lambda: _build_schema(registry))
    return schema


def _variant_schema(type_name: str) -> dict[str, Any]:
    full = task_json_schema()
    return {"$defs": full["$defs"], "$ref": f"#/$defs/{_variant_name(type_name)}"}


def _path(prefix: str, parts: Any) -> str:
    out = prefix
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(document)"


_TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "true or false",
               "object": "an object", "array": "a list", "null": "null"}


def _allowed(e: Any) -> str:
    """What a jsonschema error's keyword allows, in words."""
    v = e.validator_value
    words: dict[str, Any] = {
        "exclusiveMinimum": lambda: f"must be > {v}", "minimum": lambda: f"must be >= {v}",
        "exclusiveMaximum": lambda: f"must be < {v}", "maximum": lambda: f"must be <= {v}",
        "enum": lambda: "must be one of " + ", ".join(map(repr, v)), "const": lambda: f"must be {v!r}",
        "minLength": lambda: "must not be empty" if v == 1 else f"must be at least {v} characters",
        "maxLength": lambda: f"must be at most {v} characters",
        "minItems": lambda: f"must hold at least {v} item(s)", "maxItems": lambda: f"must hold at most {v} item(s)",
        "pattern": lambda: f"must match {v}",
        "type": lambda: "must be " + " or ".join(_TYPE_WORDS.get(t, t) for t in ([v] if isinstance(v, str) else v)),
    }
    say = words.get(e.validator)
    return str(say()) if say is not None else str(e.message)


def _explain(e: Any, prefix: str) -> list[dict[str, str]]:
    """One jsonschema error as ``{"field", "error"}`` items that name the field and say what is
    allowed (never "is not valid under any of the given schemas")."""
    where = list(e.absolute_path)
    if e.validator == "additionalProperties":
        allowed = ", ".join(sorted(e.schema.get("properties", {})))
        extra = [k for k in e.instance if k not in e.schema.get("properties", {})]
        return [{"field": _path(prefix, [*where, k]), "error": f"unknown field {k!r}; allowed: {allowed}"} for k in extra]
    if e.validator == "required":
        missing = [k for k in e.validator_value if k not in e.instance]
        return [{"field": _path(prefix, [*where, k]), "error": "required"} for k in missing]
    if e.validator in ("anyOf", "oneOf") and e.context:
        nullable = any(sub.validator == "type" and sub.validator_value == "null" for sub in e.context)
        options = [_allowed(sub) for sub in e.context if not (sub.validator == "type" and sub.validator_value == "null")]
        said = " or ".join(dict.fromkeys(options)) + (" (or null)" if nullable else "")
        return [{"field": _path(prefix, where), "error": f"{said}; got {_short(e.instance)}"}]
    return [{"field": _path(prefix, where), "error": f"{_allowed(e)}; got {_short(e.instance)}"}]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _schema_errors(item: dict[str, Any], prefix: str) -> list[dict[str, str]]:
    import jsonschema  # imported lazily: only invalid input pays for it

    validator = jsonschema.Draft202012Validator(_variant_schema(item["type"]))
    out: list[dict[str, str]] = []
    for e in sorted(validator.iter_errors(item), key=lambda e: list(map(str, e.absolute_path))):
        out += _explain(e, prefix)
    return out


def _whole(v: Any) -> Any:
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _is_int(prop: dict[str, Any]) -> bool:
    return prop.get("type") == "integer" or any(o.get("type") == "integer" for o in prop.get("anyOf", []))


def _normalize_ints(item: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema's ``integer`` admits ``5.0``; so do we, for every field the schema types int
    (the task's own and its config's, one list level deep)."""
    defs = task_json_schema()["$defs"]
    variant = defs[_variant_name(item["type"])]

    def fix(obj: dict[str, Any], props: dict[str, Any]) -> dict[str, Any]:
        out = dict(obj)
        for k, prop in props.items():
            if k not in out:
                continue
            if _is_int(prop):
                out[k] = _whole(out[k])
            elif prop.get("type") == "array" and _is_int(prop.get("items", {})) and isinstance(out[k], list):
                out[k] = [_whole(x) for x in out[k]]
        return out

    out = fix(item, variant["properties"])
    conf_ref = variant["properties"]["config"].get("$ref", "")
    if isinstance(out.get("config"), dict) and conf_ref:
        out["config"] = fix(out["config"], defs[conf_ref.rsplit("/", 1)[-1]].get("properties", {}))
    return out


def _check_config(spec: TaskSpec, prefix: str) -> None:
    """Decode the config into its kind's struct and apply the kind's rules and the free-form
    limits; ValidationError naming ``config.<field>`` otherwise."""
    kind = kinds.active().get(spec.type)
    cfg = kind.decode(spec.config)
    errors = [{"field": _path(prefix, ["config", f]), "error": e} for f, e in kind.check(spec.config, cfg)]
    errors += _free_form_errors(spec.config, _path(prefix, ["config"]))
    errors += _python_errors(spec, prefix)
    errors += _tag_errors(spec, prefix)
    if getattr(cfg, "env", None) and spec.bundle is None:
        errors.append({"field": _path(prefix, ["config", "env"]), "error": "needs a bundle: environment variables are "
                       "set for shipped code, in its sandbox, only (dt submit --bundle DIR)"})
    if errors:
        raise ValidationError(errors)


def _python_errors(spec: TaskSpec, prefix: str) -> list[dict[str, str]]:
    """``requirements.python``: each entry a requirement pip may install (:mod:`.pyreqs`), and
    only on a task that ships a bundle (the environment is built for shipped code only)."""
    wanted = spec.requirements.python
    if not wanted:
        return []
    where = _path(prefix, ["requirements", "python"])
    out = [{"field": where, "error": reason} if i is None else
           {"field": f"{where}[{i}]", "error": f"{reason}; got {_short(wanted[i])}"}
           for i, reason in pyreqs.errors(wanted)]
    if spec.bundle is None:
        out.append({"field": where, "error": "needs a bundle: Python requirements are installed for shipped code "
                    "only (dt submit --bundle DIR)"})
    return out


def _tag_errors(spec: TaskSpec, prefix: str) -> list[dict[str, str]]:
    """``requirements.tags`` a worker can never have: workers split ``--tags`` on commas and strip
    the spaces around each tag, so an empty tag, one with a comma or with spaces around it would
    leave the task pending for ever."""
    bad = [(i, tag) for i, tag in enumerate(spec.requirements.tags) if not tag or "," in tag or tag != tag.strip()]
    if not bad:  # the hot path: most tasks have no tags
        return []
    where = _path(prefix, ["requirements", "tags"])
    return [{"field": f"{where}[{i}]", "error": "a tag is one name, without commas or spaces around it (workers "
             f"split --tags on commas and strip spaces, so no worker has it); got {_short(tag)}"} for i, tag in bad]


def _no_effect(specs: list[TaskSpec], listed: bool) -> list[str]:
    """Warnings for accepted fields that change nothing for their task."""
    registry = kinds.active()
    out = []
    for i, s in enumerate(specs):
        if not s.cache:
            continue
        where = f"[{i}]" if listed else "task"
        if not registry.get(s.type).cacheable:
            out.append(f"{where}: cache: true has no effect on a {s.type} task (only benchmark results are cached)")
        elif s.bundle is not None:
            out.append(f"{where}: cache: true has no effect on a task with a bundle (the cache key cannot "
                       "tell the bundle's code apart)")
    return out


def _parse_one(item: Any, prefix: str) -> tuple[TaskSpec, str | None]:
    item, warning = kinds.upgrade(item)
    if not isinstance(item, dict):
        raise ValidationError([{"field": prefix or "(document)", "error": "a task must be a JSON object"}])
    names = kinds.active().names()
    if not isinstance(item.get("type"), str) or item["type"] not in names:
        raise ValidationError([{"field": _path(prefix, ["type"]),
                                "error": f"must be one of {', '.join(names)}; got {item.get('type')!r}"}])
    try:
        spec = msgspec.convert(item, TaskSpec)
        _check_config(spec, prefix)
        return spec, warning
    except msgspec.ValidationError:
        pass  # the slow path below names every bad field
    item = _normalize_ints(item)
    errors = _schema_errors(item, prefix)
    if errors:
        raise ValidationError(errors)
    try:
        spec = msgspec.convert(item, TaskSpec)
        _check_config(spec, prefix)
    except msgspec.ValidationError as exc:  # the schema and the struct disagree: name the struct's view
        raise ValidationError([{"field": prefix or "(document)", "error": str(exc)}]) from exc
    return spec, warning


def _free_form_errors(value: Any, path: str) -> list[dict[str, str]]:
    """Where ``value`` nests deeper than MAX_NESTING or holds an integer outside 64 bits."""
    if _free_form_ok(value, 0):  # the hot path: nothing to name, so no path is built
        return []
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]  # the config object itself is level 0
    while stack:
        v, where, depth = stack.pop()
        if isinstance(v, dict | list):
            if depth > MAX_NESTING:
                return [{"field": where, "error": f"nested deeper than {MAX_NESTING} levels"}]
            items = v.items() if isinstance(v, dict) else enumerate(v)
            stack.extend((child, f"{where}[{k}]" if isinstance(k, int) else f"{where}.{k}", depth + 1)
                         for k, child in items)
        elif isinstance(v, int) and not isinstance(v, bool) and not -INT64_MAX - 1 <= v <= INT64_MAX:
            return [{"field": where, "error": "integer does not fit in 64 bits"}]
    return []


def _free_form_ok(value: Any, depth: int) -> bool:
    """Whether :func:`_free_form_errors` finds nothing in ``value`` at ``depth``, without naming
    paths. Recursive, but stops one level past MAX_NESTING."""
    cls = value.__class__
    if cls is dict or cls is list:
        if depth > MAX_NESTING:
            return False
        for child in (value.values() if cls is dict else value):
            c = child.__class__
            if c is str or c is bool or c is float or child is None:
                continue
            if not _free_form_ok(child, depth + 1):
                return False
        return True
    if isinstance(value, dict | list):  # a subclass: as the full walk sees it
        return _free_form_ok(dict(value) if isinstance(value, dict) else list(value), depth)
    return not (isinstance(value, int) and not isinstance(value, bool) and not -INT64_MAX - 1 <= value <= INT64_MAX)


def parse_tasks_with_warnings(doc: Any) -> tuple[list[TaskSpec], list[str]]:
    """Validate a task document (one object or a list) into specs, with the deprecation warnings
    of what was accepted; raises ValidationError listing every bad field of every task."""
    items = doc if isinstance(doc, list) else [doc]
    if not items:
        raise ValidationError([{"field": "(document)", "error": "the task list is empty"}])
    specs: list[TaskSpec] = []
    warnings: list[str] = []
    errors: list[dict[str, str]] = []
    for i, item in enumerate(items):
        prefix = f"[{i}]" if isinstance(doc, list) else ""
        try:
            spec, warning = _parse_one(item, prefix)
        except ValidationError as exc:
            errors.extend(exc.errors)
            continue
        specs.append(spec)
        if warning is not None:
            warnings.append(f"{prefix or 'task'}: {warning}")
    if errors:
        raise ValidationError(errors)
    ids = [s.task_id for s in specs if s.task_id is not None]
    dup = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) != len(ids) else []
    if dup:
        raise ValidationError([{"field": "task_id", "error": f"duplicate ids in one submission: {dup}"}])
    return specs, warnings + _no_effect(specs, isinstance(doc, list))


def parse_tasks(doc: Any) -> list[TaskSpec]:
    """:func:`parse_tasks_with_warnings` without the warnings."""
    return parse_tasks_with_warnings(doc)[0]


_ID_PREFIX = uuid.uuid4().hex[:8]  # random per process; with the counter, ids never repeat
_id_counter = itertools.count()
_FAST_DECODER: msgspec.json.Decoder[Any] = msgspec.json.Decoder(list[TaskSpec] | TaskSpec)


def _fast(body: bytes) -> list[TaskSpec] | None:
    """Valid, current-spelling input decoded in one pass; None sends it down the full path."""
    decoded = _FAST_DECODER.decode(body)
    items = decoded if isinstance(decoded, list) else [decoded]
    registry = kinds.active()
    for i, s in enumerate(items):
        if registry.find(s.type) is None or (s.type == "benchmark" and "kind" in s.config):
            return None
        _check_config(s, f"[{i}]" if isinstance(decoded, list) else "")
    if items and len({s.task_id for s in items if s.task_id is not None}) == sum(s.task_id is not None for s in items):
        return items
    return None


def parse_task_json_with_warnings(body: bytes) -> tuple[list[TaskSpec], list[str]]:
    """Validate a JSON task document given as bytes; (specs, deprecation warnings)."""
    try:
        fast = _fast(body)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError, ValidationError, UnicodeDecodeError):
        fast = None  # the full path below names every bad field
    if fast is not None:
        return fast, _no_effect(fast, is_list(body))
    return parse_tasks_with_warnings(decode_json(body))


def is_list(body: bytes) -> bool:
    """Whether a task document (JSON bytes) is a list: its errors then say ``[i].``."""
    return body.lstrip()[:1] == b"["


def parse_task_json(body: bytes) -> list[TaskSpec]:
    """:func:`parse_task_json_with_warnings` without the warnings."""
    return parse_task_json_with_warnings(body)[0]


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
    return msgspec.structs.replace(spec, task_id=f"{spec.type}-{_ID_PREFIX}{next(_id_counter):08x}")


def spec_type(spec: TaskSpec) -> str:
    return spec.type


def kind_of(spec: TaskSpec) -> kinds.Kind:
    return kinds.active().get(spec.type)


def config_struct(spec: TaskSpec) -> Any:
    """The spec's config decoded into its kind's struct (defaults filled in)."""
    return kind_of(spec).decode(spec.config)


def config_dict(spec: TaskSpec) -> dict[str, Any]:
    return spec.config


_SORTED = msgspec.json.Encoder(order="sorted").encode


def spec_digest(spec: TaskSpec) -> str:
    """Stable hash of the whole spec but its ``run_id``: same id + same digest is an idempotent
    resubmission (the task stays in the run it joined first), a different digest a conflict. The
    bytes hashed are the spec's sorted JSON without the ``run_id`` member, so a spec's digest is
    what it was before tasks had runs. That member is cut from the encoded bytes (a third of the
    cost of building a dict without it, on every submitted task): in sorted order the top-level
    ``run_id`` is always followed by ``task_id`` (a string or null) and then by members whose
    values hold no such key, so its member is the last ``,"run_id":`` up to ``,"task_id":``."""
    return spec_digest_and_size(spec)[0]


def spec_digest_and_size(spec: TaskSpec) -> tuple[str, int]:
    """:func:`spec_digest`, and the length of the spec as JSON (the run_id included): what
    ``json.encode(spec_to_dict(spec))`` is long, its members in another order (the quota's
    :func:`~distributed_testing.coordinator.core.quota.payload_size` counts it, and submit has
    just encoded it here)."""
    data = _SORTED(spec)
    start = data.rfind(b',"run_id":')
    end = data.index(b',"task_id":', start)
    return hashlib.sha256(data[:start] + data[end:]).hexdigest(), len(data)


def spec_to_dict(spec: TaskSpec) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(spec)
    return out


def spec_from_dict(d: dict[str, Any]) -> TaskSpec:
    """A stored spec (the old training spelling is upgraded, without a warning: it was accepted)."""
    spec: TaskSpec = msgspec.convert(kinds.upgrade(d)[0], TaskSpec)
    return spec
