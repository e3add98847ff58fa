"""Training tasks at the door: submit-time validation naming the field, the published schema, and
the coordinator's gang policy flags reaching the state machine."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from distributed_testing.cli import coordinator as coord_cli
from distributed_testing.coordinator.runtime import Runtime
from distributed_testing.coordinator.store.memory import MemoryStore
from distributed_testing.errors import ConfigError, ValidationError
from distributed_testing.tasks import spec as specs

GOOD = {"model": "mlp", "nodes": 2, "batch_size": 64, "steps": 5}


def doc(**config: Any) -> dict[str, Any]:
    return {"type": "training", "config": {**GOOD, **config}}


def old_doc(**config: Any) -> dict[str, Any]:
    """The deprecated spelling: a benchmark whose config says ``"kind": "training"``."""
    return {"type": "benchmark", "config": {"kind": "training", **GOOD, **config}}


def errors_of(document: Any) -> list[dict[str, str]]:
    with pytest.raises(ValidationError) as info:
        specs.parse_task_json(json.dumps(document).encode())
    return info.value.errors


def test_a_valid_training_task_is_accepted_both_ways() -> None:
    full = doc(nproc_per_node=1, warmup_steps=2, backend="gloo", precision="bf16", load_balance="dynamic",
               rebalance_interval=4)
    for parsed in (specs.parse_task_json(json.dumps(full).encode()), specs.parse_tasks(full)):
        (spec,) = parsed
        assert spec.type == "training" and spec.config["rebalance_interval"] == 4
    assert specs.parse_task_json(json.dumps(doc(nodes=2.0)).encode())[0].config["nodes"] == 2


def test_the_old_spelling_becomes_a_training_task_with_a_deprecation_warning() -> None:
    for parsed, warnings in (specs.parse_task_json_with_warnings(json.dumps(old_doc()).encode()),
                             specs.parse_tasks_with_warnings([doc(), old_doc()])):
        assert [s.type for s in parsed][-1] == "training" and "kind" not in parsed[-1].config
        assert len(warnings) == 1 and "deprecated" in warnings[0] and '"type": "training"' in warnings[0]
    assert specs.parse_task_json_with_warnings(json.dumps(doc()).encode())[1] == []
    errs = errors_of(old_doc(batch_size=1))
    assert [e["field"] for e in errs] == ["config.batch_size"]


@pytest.mark.parametrize(("config", "field", "needle"), [
    ({"batch_size": 1}, "[1].config.batch_size", "smaller than nodes=2"),
    ({"nproc_per_node": 64}, "[1].config.batch_size", "world size 128"),
    ({"nodes": 0}, "[1].config.nodes", ""),
    ({"backend": "mpi"}, "[1].config.backend", "mpi"),
    ({"precision": "int8"}, "[1].config.precision", "int8"),
    ({"rebalance_interval": 3}, "[1].config.rebalance_interval", "only applies to dynamic or hybrid"),
    ({"load_balance": "proportional", "warmup_steps": 0}, "[1].config.warmup_steps", "profiles during warmup"),
    ({"model": "no such model"}, "[1].config.model", "neither a built-in model"),
    ({"extra": 1}, "[1].config.extra", "unknown field 'extra'; allowed: backend, batch_size"),
])
def test_a_bad_training_config_is_refused_naming_the_field(config: dict[str, Any], field: str, needle: str) -> None:
    errs = errors_of([{"type": "custom", "config": {"name": "noop"}}, doc(**config)])
    assert [e["field"] for e in errs] == [field], errs
    assert needle in errs[0]["error"]


def test_a_missing_required_key_is_named() -> None:
    errs = errors_of({"type": "training", "config": {"model": "mlp", "nodes": 2, "batch_size": 8}})
    assert errs == [{"field": "config.steps", "error": "required"}]


def test_inference_benchmarks_are_validated_as_before() -> None:
    assert specs.parse_tasks({"type": "benchmark", "config": {"model": "mlp", "batch_sizes": [1, 2]}})
    errs = errors_of({"type": "benchmark", "config": {"model": "mlp", "backend": "gloo"}})
    assert [e["field"] for e in errs] == ["config.backend"]


def test_the_published_schema_knows_training_configs() -> None:
    v = jsonschema.Draft202012Validator(specs.task_json_schema())
    assert v.is_valid(doc())
    assert v.is_valid({"type": "benchmark", "config": {"model": "bert-base-uncased", "backend": "eager"}})
    assert not v.is_valid(doc(backend="eager"))
    assert not v.is_valid(doc(nodes=0))
    assert not v.is_valid({"type": "training", "config": {"model": "mlp"}})
    assert not v.is_valid(old_doc())  # the deprecated spelling is accepted by the API, not published


# ---------------------------------------------------------------- policy flags


def cfg(*argv: str) -> Any:
    return coord_cli.config_from_args(coord_cli.build_parser().parse_args(list(argv)), {})


def test_gang_flags_default_and_reach_the_policy() -> None:
    assert (cfg().gang_max_wait_s, cfg().gang_ports) == (60.0, (29500, 29999))
    c = cfg("--gang-max-wait", "5", "--gang-ports", "40000-40010")
    assert (c.gang_max_wait_s, c.gang_ports) == (5.0, (40000, 40010))
    policy = Runtime(c, MemoryStore()).state.policy
    assert (policy.gang_max_wait_s, policy.gang_port_range) == (5.0, (40000, 40010))


@pytest.mark.parametrize(("argv", "needle"), [
    (["--gang-max-wait", "-1"], "--gang-max-wait:"),
    (["--gang-ports", "29500"], "--gang-ports:"),
    (["--gang-ports", "a-b"], "--gang-ports:"),
    (["--gang-ports", "30000-29000"], "--gang-ports:"),
    (["--gang-ports", "0-10"], "--gang-ports:"),
    (["--gang-ports", "65000-70000"], "--gang-ports:"),
])
def test_bad_gang_flags_are_refused_naming_the_flag(argv: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        cfg(*argv)
    assert str(info.value).startswith(needle), str(info.value)
