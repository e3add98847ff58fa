"""Task documents found by fuzzing the REST API (tests/fuzz): each is a ValidationError naming
the field, never another exception and never an accepted task the store cannot hold."""

from __future__ import annotations

import pytest

from distributed_testing.errors import ValidationError
from distributed_testing.tasks import spec as spec_module
from distributed_testing.tasks.spec import MAX_NESTING, parse_task_json

NOOP = b'{"type":"custom","config":{"name":"noop"%s}%s}'


def params(inner: bytes) -> bytes:
    return NOOP % (b',"parameters":' + inner, b"")


def nested(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


@pytest.mark.parametrize(("body", "field", "error"), [
    (b'{"type":[],"config":{"name":"noop"}}', "type", "must be one of"),  # was TypeError: unhashable list
    (b'{"type":{},"config":{"name":"noop"}}', "type", "must be one of"),
    (b"[" * 100_000, "(body)", "nested too deeply"),  # was RecursionError
    (params(b'{"a":NaN}'), "(body)", "not valid JSON"),  # NaN and Infinity are not JSON: were accepted
    (NOOP % (b"", b',"timeout_s":Infinity'), "(body)", "not valid JSON"),
    (params(b'{"a":1e999}'), "(body)", "not valid JSON"),
    ((NOOP % (b"", b"")).replace(b"noop", b"x\\ud800"), "(body)", "not valid JSON"),  # was UnicodeEncodeError
    (params(b'{"a":123456789012345678901234567890}'), "config.parameters.a", "64 bits"),  # was a 500 StoreError
    (params(b'{"a":[9223372036854775808]}'), "config.parameters.a[0]", "64 bits"),
    (NOOP % (b"", b',"max_memory_mb":9223372036854775808'), "max_memory_mb", ""),
    (b'{"type":"benchmark","config":{"model":"m","iterations":1e300}}', "config.iterations", "must be <= 9223372036854775807"),
    (params(nested(MAX_NESTING + 1)), "config.parameters" + ".a" * MAX_NESTING, f"deeper than {MAX_NESTING}"),
])
def test_is_a_validation_error_naming_the_field(body: bytes, field: str, error: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_task_json(body)
    fields = [e["field"] for e in info.value.errors]
    assert field in fields, info.value.errors
    assert error in str(info.value)


def test_limits_themselves_are_accepted() -> None:
    [spec] = parse_task_json(params(b'{"min":-9223372036854775808,"max":9223372036854775807,"deep":' +
                                    nested(MAX_NESTING - 1) + b"}"))
    assert spec.config["parameters"]["max"] == 2**63 - 1


def test_every_bad_task_of_a_list_is_named() -> None:
    body = b"[" + params(b'{"a":18446744073709551616}') + b"," + params(b'{"b":' + nested(40) + b"}") + b"]"
    with pytest.raises(ValidationError) as info:
        parse_task_json(body)
    assert [e["field"].split(".")[0] for e in info.value.errors] == ["[0]", "[1]"]


class _Dict(dict):  # type: ignore[type-arg]
    """A dict subclass: the free-form check walks it as the full walk does."""


def _deep(depth: int, leaf: object) -> object:
    value = leaf
    for i in range(depth):
        value = {"a": value} if i % 2 else [value]
    return value


@pytest.mark.parametrize("value", [
    {}, {"name": "noop"}, {"a": [1, 2.5, None, True, "x"]}, {"a": 2**63 - 1, "b": -(2**63)},
    {"a": 2**63}, {"a": [[-(2**63) - 1]]}, {"a": True}, _Dict(a=2**64), {"a": _Dict(b=[1])},
    _deep(MAX_NESTING, 1), _deep(MAX_NESTING + 1, 1), _deep(MAX_NESTING + 1, "x"), _deep(MAX_NESTING - 1, 2**70),
    {"a": _deep(MAX_NESTING, {})}, {"a": _deep(MAX_NESTING - 1, [])},
])
def test_free_form_fast_check_agrees_with_the_full_walk(value: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hot path (no paths built) finds a problem exactly where the walk that names it does,
    so every config it passes is one the walk passes, and every other gets the walk's message."""
    got = spec_module._free_form_errors(value, "config")
    monkeypatch.setattr(spec_module, "_free_form_ok", lambda v, depth: False)  # always the naming walk
    assert got == spec_module._free_form_errors(value, "config")
