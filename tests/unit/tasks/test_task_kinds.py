"""The task-kind registry: the published defaults are the runner's, every config error names its
field and says what is allowed, and the registry refuses a kind declared twice."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest

from distributed_testing.bench.task_config import KNOWN_KEYS, BenchConfig
from distributed_testing.errors import ValidationError
from distributed_testing.tasks import kinds, spec
from distributed_testing.tasks.configs import BenchmarkConfig


def errors_of(doc: object) -> list[dict[str, str]]:
    with pytest.raises(ValidationError) as info:
        spec.parse_tasks(doc)
    return info.value.errors


def test_the_published_benchmark_defaults_are_the_runners() -> None:
    props = spec.task_json_schema()["$defs"]["BenchmarkConfig"]["properties"]
    runner = {f.name: f.default for f in dataclasses.fields(BenchConfig) if f.default is not dataclasses.MISSING}
    assert props["iterations"]["default"] == runner["iterations"] == 30
    for name, field in props.items():
        if "default" in field and field["default"] is not None and name in runner and name != "batch_sizes":
            assert field["default"] == runner[name], name
    assert set(props) == {f.name for f in msgspec.structs.fields(BenchmarkConfig)}


def test_the_benchmark_struct_accepts_every_key_the_runner_reads() -> None:
    # a key the runner knows but the struct lacks is refused at submission although documented
    assert {f.name for f in msgspec.structs.fields(BenchmarkConfig)} == set(KNOWN_KEYS)


def test_a_typo_in_a_benchmark_config_is_refused_naming_the_field() -> None:
    [error] = errors_of({"type": "benchmark", "config": {"model": "bert-base-uncased", "batchsize": 4}})
    assert error["field"] == "config.batchsize" and error["error"].startswith("unknown field 'batchsize'; allowed:")
    [error] = errors_of({"type": "test", "config": {"test_file": "a.py"}, "timeout_s": -1})
    assert error == {"field": "timeout_s", "error": "must be > 0 (or null); got -1"}
    [error] = errors_of({"type": "test", "config": {"test_file": "a.py", "timeout_s": -1}})
    assert error == {"field": "config.timeout_s", "error": "must be > 0 (or null); got -1"}
    [error] = errors_of({"type": "benchmark", "config": {"model": "mlp", "learning_rate": 0.1}})
    assert error == {"field": "config.learning_rate", "error": "only applies to mode: training"}


def test_a_kind_cannot_be_declared_twice_and_unknown_types_list_the_known() -> None:
    with pytest.raises(ValueError, match="declared twice"):
        kinds.BUILTIN.with_kind(kinds.BUILTIN.get("custom"))
    with pytest.raises(KeyError, match="known: benchmark, custom, test, training"):
        kinds.BUILTIN.get("echo")


def test_the_submit_time_model_names_are_the_benchmark_runners() -> None:
    """tasks/configs.py names the runner's models without importing it (no torch in the coordinator)."""
    from distributed_testing.bench import hf_models, models
    from distributed_testing.tasks import configs

    assert configs.BENCHMARK_REGISTRY_MODELS == {e.name: e.aliases for e in hf_models.HF_ENTRIES}
    assert configs.BENCHMARK_BUILTIN_MODELS == models.BUILTIN_MODELS
    assert configs.BENCHMARK_BUILTIN_FIELDS == {"mlp": tuple(sorted(models.MLP_DEFAULTS)),
                                                "cnn": tuple(sorted(models.CNN_DEFAULTS))}


@pytest.mark.parametrize(("config", "field", "said"), [
    ({"model": "bert-large"}, "config.model", "unknown model 'bert-large'; known: bert-base-uncased, gpt2"),
    ({"model": "mlp", "weights": "pretrained"}, "config.weights", "built-in model mlp has no pretrained weights"),
    ({"model": "mlp", "model_config": {"hidden": 64}}, "config.model_config",
     "'hidden' is not a field of built-in model mlp (fields: hidden_size, in_features"),
])
def test_a_model_no_worker_can_build_is_refused_at_submit(config: dict[str, object], field: str, said: str) -> None:
    [error] = errors_of({"type": "benchmark", "config": config})
    assert error["field"] == field and error["error"].startswith(said), error
    for fine in ("google-bert/bert-base-uncased", "gpt2", "cnn", "mypkg.models:make"):
        assert spec.parse_tasks({"type": "benchmark", "config": {"model": fine}})
