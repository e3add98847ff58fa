"""The public task JSON format: what the worker guide promises, what the schema publishes, and
that one failed validation reports every bad field with its path."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import msgspec
import pytest

from distributed_testing.errors import ValidationError
from distributed_testing.tasks import spec as specs

# The three examples of the worker guide, verbatim.
BENCHMARK_EXAMPLE = json.loads("""
{
  "task_id": "benchmark-bert-001",
  "type": "benchmark",
  "config": {
    "model": "bert-base-uncased",
    "batch_sizes": [1, 2, 4, 8, 16],
    "precision": "fp32",
    "iterations": 10
  }
}""")
TEST_EXAMPLE = json.loads("""
{
  "task_id": "test-bert-001",
  "type": "test",
  "config": {
    "test_file": "test_bert.py",
    "test_args": ["--batch-size", "4"]
  }
}""")
CUSTOM_EXAMPLE = json.loads("""
{
  "task_id": "custom-001",
  "type": "custom",
  "config": {
    "name": "setup_environment",
    "parameters": {
      "clear_cache": true,
      "prepare_models": ["bert", "vit"]
    }
  }
}""")
EXAMPLES = [BENCHMARK_EXAMPLE, TEST_EXAMPLE, CUSTOM_EXAMPLE]

FULL_EXAMPLE = {
    "task_id": "test-bert-002",
    "type": "test",
    "config": {"test_file": "test_bert.py", "test_args": ["--batch-size", "4"]},
    "requirements": {"hardware": ["cpu"], "tags": ["transformers"], "min_memory_gb": 4},
    "priority": 5,
    "timeout_s": 600,
    "max_retries": 2,
    "max_memory_mb": 2048,
    "cache": True,
}

# (document, the fields that must each be named in the errors)
BAD_DOCS: list[tuple[dict[str, Any], set[str]]] = [
    (
        {"type": "test", "config": {"test_file": ""}, "priority": 5000, "max_retries": -1},
        {"config.test_file", "priority", "max_retries"},
    ),
    (
        {"type": "benchmark", "config": {"model": "m", "batch_sizes": [1, 0, -2]}},
        {"config.batch_sizes[1]", "config.batch_sizes[2]"},
    ),
    ({"type": "benchmark", "config": {"model": "m", "precision": "fp64"}}, {"config.precision"}),
    ({"type": "benchmark", "config": {"model": "m", "batch_sizes": []}}, {"config.batch_sizes"}),
    ({"type": "benchmark", "config": {"model": "m", "device": "tpu"}}, {"config.device"}),
    ({"type": "benchmark", "config": {"model": "m", "iterations": 0}}, {"config.iterations"}),
    ({"type": "benchmark", "config": {"model": "m", "backend": "jax"}}, {"config.backend"}),
    ({"type": "benchmark", "config": {"batch_sizes": [1]}}, {"config.model"}),
    ({"type": "custom", "config": {}}, {"config.name"}),
    ({"type": "custom", "config": {"name": "x", "parameters": []}}, {"config.parameters"}),
    ({"type": "test", "config": {"test_file": "a", "test_args": "--x"}}, {"config.test_args"}),
    ({"type": "test"}, {"config"}),
    ({"type": "nope", "config": {}}, {"type"}),
    ({"config": {"test_file": "a"}}, {"type"}),
    ({"type": "test", "config": {"test_file": "a"}, "task_id": "-starts-with-dash"}, {"task_id"}),
    ({"type": "test", "config": {"test_file": "a"}, "task_id": "x" * 129}, {"task_id"}),
    (
        {"type": "test", "config": {"test_file": "a"}, "requirements": {"hardware": ["gpu"], "min_memory_gb": -1}},
        {"requirements.hardware[0]", "requirements.min_memory_gb"},
    ),
    (
        {"type": "test", "config": {"test_file": "a"}, "timeout_s": 0, "max_memory_mb": 0, "cache": "yes"},
        {"timeout_s", "max_memory_mb", "cache"},
    ),
    ({"type": "test", "config": {"test_file": "a"}, "priority": True}, {"priority"}),
    ({"type": "test", "config": {"test_file": "a"}, "max_retries": 101}, {"max_retries"}),
]


def errors_of(doc: Any) -> list[dict[str, str]]:
    with pytest.raises(ValidationError) as info:
        specs.parse_tasks(doc)
    errors = info.value.errors
    assert errors and all(set(e) == {"field", "error"} and e["error"] for e in errors), errors
    return errors


def fields_of(doc: Any) -> set[str]:
    return {e["field"] for e in errors_of(doc)}


# ------------------------------------------------------------------ the guide's examples


def test_benchmark_example_validates_as_written() -> None:
    (spec,) = specs.parse_tasks(BENCHMARK_EXAMPLE)
    assert spec.type == "benchmark"
    assert spec.task_id == "benchmark-bert-001"
    assert specs.config_dict(spec) == {
        "model": "bert-base-uncased",
        "batch_sizes": [1, 2, 4, 8, 16],
        "precision": "fp32",
        "iterations": 10,
    }
    assert (spec.priority, spec.max_retries, spec.timeout_s, spec.requirements.hardware) == (0, 0, None, [])


def test_test_example_validates_as_written() -> None:
    (spec,) = specs.parse_tasks(TEST_EXAMPLE)
    assert spec.type == "test"
    assert spec.task_id == "test-bert-001"
    cfg = specs.config_struct(spec)
    assert cfg.test_file == "test_bert.py"
    assert cfg.test_args == ["--batch-size", "4"]


def test_custom_example_validates_as_written() -> None:
    (spec,) = specs.parse_tasks(CUSTOM_EXAMPLE)
    assert spec.type == "custom"
    assert spec.task_id == "custom-001"
    cfg = specs.config_struct(spec)
    assert cfg.name == "setup_environment"
    assert cfg.parameters == {"clear_cache": True, "prepare_models": ["bert", "vit"]}


def test_examples_as_a_list_keep_their_order() -> None:
    parsed = specs.parse_tasks(EXAMPLES)
    assert [s.task_id for s in parsed] == ["benchmark-bert-001", "test-bert-001", "custom-001"]
    assert [specs.spec_type(s) for s in parsed] == ["benchmark", "test", "custom"]


def test_documented_full_task_validates() -> None:
    (spec,) = specs.parse_tasks(FULL_EXAMPLE)
    assert spec.requirements == specs.Requirements(hardware=["cpu"], tags=["transformers"], min_memory_gb=4)
    assert (spec.priority, spec.timeout_s, spec.max_retries, spec.max_memory_mb, spec.cache) == (5, 600, 2, 2048, True)


def test_benchmark_passes_unknown_config_keys_through_to_the_worker() -> None:
    doc = {"type": "benchmark", "config": {"model": "gpt2", "sequence_length": 128, "warmup": 3}}
    (spec,) = specs.parse_tasks(doc)
    assert specs.config_dict(spec)["sequence_length"] == 128


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e["task_id"])
def test_missing_task_id_is_allowed_and_assigned_later(example: dict[str, Any]) -> None:
    doc = {k: v for k, v in example.items() if k != "task_id"}
    (spec,) = specs.parse_tasks(doc)
    assert spec.task_id is None
    named = specs.with_id(spec)
    assert named.task_id and named.task_id.startswith(example["type"] + "-")
    assert specs.with_id(spec).task_id != named.task_id  # fresh ids, never reused
    (reparsed,) = specs.parse_tasks(specs.spec_to_dict(named))  # an assigned id is itself valid
    assert reparsed == named


def test_spec_dict_round_trip() -> None:
    for spec in specs.parse_tasks([*EXAMPLES, FULL_EXAMPLE]):
        assert specs.spec_from_dict(specs.spec_to_dict(spec)) == spec


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(("doc", "fields"), BAD_DOCS, ids=[str(sorted(f)) for _, f in BAD_DOCS])
def test_every_bad_field_is_reported_with_its_path(doc: dict[str, Any], fields: set[str]) -> None:
    assert fields_of(doc) == fields


def test_errors_of_every_task_in_a_list_reported_at_once_with_index() -> None:
    doc = [
        TEST_EXAMPLE,
        {"type": "test", "config": {"test_file": ""}, "priority": 5000},
        {"type": "custom", "config": {}},
        {"type": "benchmark", "config": {"model": "m", "batch_sizes": [1, 2, 0]}},
        "not an object",
    ]
    assert fields_of(doc) == {"[1].config.test_file", "[1].priority", "[2].config.name", "[3].config.batch_sizes[2]", "[4]"}


def test_empty_list_is_rejected() -> None:
    assert fields_of([]) == {"(document)"}


@pytest.mark.parametrize("doc", [None, "task", 5, True])
def test_document_that_is_not_an_object_is_rejected(doc: Any) -> None:
    assert fields_of(doc) == {"(document)"}


def test_unknown_top_level_field_is_named() -> None:
    (err,) = errors_of({**TEST_EXAMPLE, "bogus_field": 1})
    assert "bogus_field" in err["error"]


def test_duplicate_ids_in_one_list_are_rejected_naming_the_id() -> None:
    doc = [TEST_EXAMPLE, CUSTOM_EXAMPLE, {**TEST_EXAMPLE, "config": {"test_file": "other.py"}}, CUSTOM_EXAMPLE]
    (err,) = errors_of(doc)
    assert err["field"] == "task_id"
    assert "test-bert-001" in err["error"] and "custom-001" in err["error"]


def test_tasks_without_ids_are_not_duplicates() -> None:
    doc = [{"type": "custom", "config": {"name": "noop"}}] * 3
    assert len(specs.parse_tasks(doc)) == 3


def test_validation_error_message_summarises_every_field() -> None:
    with pytest.raises(ValidationError) as info:
        specs.parse_tasks({"type": "test", "config": {"test_file": ""}, "priority": 5000})
    assert "config.test_file" in str(info.value) and "priority" in str(info.value)


def test_task_id_with_trailing_newline_is_rejected() -> None:
    assert fields_of({**TEST_EXAMPLE, "task_id": "abc\n"}) == {"task_id"}


def test_integral_float_for_an_int_field_is_accepted_as_the_schema_allows() -> None:
    assert fields_of({**TEST_EXAMPLE, "priority": 5.0, "timeout_s": -1}) == {"timeout_s"}
    assert specs.parse_tasks({**TEST_EXAMPLE, "priority": 5.0})[0].priority == 5
    assert fields_of({**TEST_EXAMPLE, "priority": 5.5}) == {"priority"}


# ------------------------------------------------------------------ JSON schema


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = specs.task_json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def test_schema_is_a_valid_draft_2020_12_schema(validator: jsonschema.Draft202012Validator) -> None:
    assert jsonschema.validators.validator_for(specs.task_json_schema()) is jsonschema.Draft202012Validator


def test_schema_is_json_serialisable() -> None:
    assert json.loads(json.dumps(specs.task_json_schema())) == specs.task_json_schema()


@pytest.mark.parametrize(
    "doc",
    [*EXAMPLES, FULL_EXAMPLE, EXAMPLES, [FULL_EXAMPLE]],
    ids=["benchmark", "test", "custom", "full", "list", "list-of-one"],
)
def test_schema_accepts_valid_documents(validator: jsonschema.Draft202012Validator, doc: Any) -> None:
    validator.validate(doc)
    specs.parse_tasks(doc)  # and the parser agrees


@pytest.mark.parametrize(("doc", "fields"), BAD_DOCS, ids=[str(sorted(f)) for _, f in BAD_DOCS])
def test_schema_rejects_what_the_parser_rejects(
    validator: jsonschema.Draft202012Validator, doc: dict[str, Any], fields: set[str]
) -> None:
    assert not validator.is_valid(doc)
    assert not validator.is_valid([TEST_EXAMPLE, doc])


def test_schema_rejects_unknown_fields_and_types(validator: jsonschema.Draft202012Validator) -> None:
    assert not validator.is_valid({**TEST_EXAMPLE, "bogus": 1})
    assert not validator.is_valid({**TEST_EXAMPLE, "type": "benchmark"})  # test config under benchmark
    assert not validator.is_valid("task")


def test_schema_is_the_same_object_shape_each_call() -> None:
    assert specs.task_json_schema() == copy.deepcopy(specs.task_json_schema())


# ------------------------------------------------------------------ digest


def test_spec_digest_equal_for_equal_specs() -> None:
    a = specs.parse_tasks(json.loads(json.dumps(FULL_EXAMPLE)))[0]
    reordered = dict(reversed(list(FULL_EXAMPLE.items())))
    b = specs.parse_tasks(reordered)[0]
    assert specs.spec_digest(a) == specs.spec_digest(b)


def test_spec_digest_equal_when_defaults_are_spelled_out() -> None:
    explicit = {**TEST_EXAMPLE, "priority": 0, "max_retries": 0, "cache": False, "timeout_s": None}
    assert specs.spec_digest(specs.parse_tasks(explicit)[0]) == specs.spec_digest(specs.parse_tasks(TEST_EXAMPLE)[0])


@pytest.mark.parametrize("doc", [
    {"type": "custom", "config": {"name": "noop"}},
    {"type": "custom", "config": {"name": "h", "parameters": {"x": 1.5e-300, "y": "\u00e9\u2028\"", "z": [1, {"a": None}],
                                                           "w": 0.1, "big": 2**63 - 1}},
     "priority": 5, "timeout_s": 1e10, "requirements": {"tags": ["a", "b"]}, "task_id": "abc"},
    {"type": "custom", "config": {"name": "noop"}, "run_id": "run-0123456789ab"},
])
def test_spec_digest_and_size_is_the_digest_and_the_dicts_json_length(doc: dict[str, Any]) -> None:
    """Submit counts a spec's JSON length for the quota from the bytes its digest encoded: the
    same length as the stored dict's JSON, members in another order."""
    s = specs.with_id(specs.parse_tasks(doc)[0])
    digest, size = specs.spec_digest_and_size(s)
    assert digest == specs.spec_digest(s)
    assert size == len(msgspec.json.encode(specs.spec_to_dict(s)))


def test_spec_digest_independent_of_config_key_order() -> None:
    cfg = BENCHMARK_EXAMPLE["config"]
    other = {**BENCHMARK_EXAMPLE, "config": dict(reversed(list(cfg.items())))}
    assert specs.spec_digest(specs.parse_tasks(other)[0]) == specs.spec_digest(specs.parse_tasks(BENCHMARK_EXAMPLE)[0])


@pytest.mark.parametrize(
    "change",
    [
        {"priority": 1},
        {"config": {"test_file": "test_bert.py"}},
        {"max_retries": 1},
        {"task_id": "test-bert-002"},
        {"cache": True},
    ],
)
def test_spec_digest_differs_when_anything_differs(change: dict[str, Any]) -> None:
    base = specs.parse_tasks(TEST_EXAMPLE)[0]
    changed = specs.parse_tasks({**TEST_EXAMPLE, **change})[0]
    assert specs.spec_digest(base) != specs.spec_digest(changed)


@pytest.mark.parametrize("tag", ["", " ", " gpu", "gpu ", "gpu,cuda"])
def test_a_tag_no_worker_can_have_is_refused_naming_it(tag: str) -> None:
    """Workers split --tags on commas and strip the spaces around each tag: such a task would wait for ever."""
    doc = {**TEST_EXAMPLE, "requirements": {"tags": ["transformers", tag]}}
    for body in (doc, [doc]):
        with pytest.raises(ValidationError) as info:
            specs.parse_task_json(json.dumps(body).encode())
        (error,) = info.value.errors
        assert error["field"].endswith("requirements.tags[1]") and "without commas or spaces around it" in error["error"]
    assert specs.parse_tasks({**TEST_EXAMPLE, "requirements": {"tags": ["a b", "x86_64"]}})


@pytest.mark.parametrize(("change", "warned"), [
    ({"cache": True}, "[0]: cache: true has no effect on a test task (only benchmark results are cached)"),
    ({"cache": False}, None),
])
def test_cache_on_a_kind_without_a_result_cache_is_accepted_with_a_warning(change: dict[str, Any], warned: str | None) -> None:
    doc = [{**TEST_EXAMPLE, **change}]
    for parsed, warnings in (specs.parse_task_json_with_warnings(json.dumps(doc).encode()),
                             specs.parse_tasks_with_warnings(doc)):
        assert len(parsed) == 1 and warnings == ([warned] if warned else [])
    bundled = {**BENCHMARK_EXAMPLE, "cache": True, "bundle": "a" * 64}
    assert specs.parse_task_json_with_warnings(json.dumps(bundled).encode())[1] == [
        "task: cache: true has no effect on a task with a bundle (the cache key cannot tell the bundle's code apart)"]
    assert specs.parse_task_json_with_warnings(json.dumps({**BENCHMARK_EXAMPLE, "cache": True}).encode())[1] == []
