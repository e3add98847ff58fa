"""A test task's ``env``: names a task may set, and only with a bundle (its sandbox's environment
starts from a fixed minimum); what the worker sets for the sandbox, or what changes how pytest or
Python starts, is refused at submit with the variable's name."""

from __future__ import annotations

import pytest

from distributed_testing.errors import ValidationError
from distributed_testing.tasks.configs import env_errors
from distributed_testing.tasks.spec import parse_tasks


def test_names_a_task_may_set() -> None:
    assert env_errors({"APP_STAGE": "x", "PYTHONHASHSEED": "0", "LANG": "de_DE.UTF-8", "_X1": ""}) == []


@pytest.mark.parametrize(("env", "needle"), [
    ({"PATH": "/tmp"}, "PATH: set by the worker"),
    ({"PYTEST_ADDOPTS": "-p evil"}, "PYTEST_ADDOPTS: set by the worker"),
    ({"LD_PRELOAD": "/x.so"}, "LD_PRELOAD: set by the worker"),
    ({"DT_API_KEY": "k"}, "DT_API_KEY: set by the worker"),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, "CUDA_VISIBLE_DEVICES: set by the worker"),
    ({"1BAD": "x"}, "'1BAD': a variable's name"),
    ({"A B": "x"}, "'A B': a variable's name"),
    ({"BIG": "x" * 5000}, "BIG: a value is at most 4096"),
    ({f"V{i}": "" for i in range(65)}, "65 variables; at most 64"),
])
def test_what_a_task_may_not_set_is_named(env: dict[str, str], needle: str) -> None:
    errors = env_errors(env)
    assert errors and needle in errors[0], errors


def test_env_needs_a_bundle() -> None:
    doc = {"type": "test", "config": {"test_file": "t.py", "env": {"APP_STAGE": "x"}}}
    with pytest.raises(ValidationError) as e:
        parse_tasks(doc)
    assert "needs a bundle" in str(e.value) and "config.env" in str(e.value)
    ok = {**doc, "bundle": "0" * 64}
    assert parse_tasks(ok)[0].config["env"] == {"APP_STAGE": "x"}
    with pytest.raises(ValidationError) as e:
        parse_tasks({**ok, "config": {"test_file": "t.py", "env": {"HOME": "/root"}}})
    assert "HOME: set by the worker" in str(e.value)
