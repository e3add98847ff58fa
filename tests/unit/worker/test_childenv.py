"""Task children start without the worker's credentials, whichever executor starts them."""

from __future__ import annotations

import pytest

from distributed_testing.process.childenv import child_environ, scrub_environ
from distributed_testing.training import launch
from distributed_testing.worker.executors.pool import HandlerPool
from distributed_testing.worker.executors.test import TestExecutor

ENV = {"DT_API_KEY": "dtk_a_secret", "DT_API_KEY_FILE": "/k", "DT_TOKEN": "jwt", "DT_SOME_SECRET": "s",
       "COPY": "prefix-dtk_a_secret", "DT_WORKER_NAME": "w", "HF_TOKEN": "hf", "PATH": "/bin"}


def test_credential_variables_are_dropped_by_name_and_by_value() -> None:
    env = child_environ({"EXTRA": "1"}, secrets=["dtk_a_secret"], base=ENV)
    assert env == {"DT_WORKER_NAME": "w", "HF_TOKEN": "hf", "PATH": "/bin", "EXTRA": "1"}
    mutable = dict(ENV)
    removed = scrub_environ(mutable, ["dtk_a_secret", ""])
    assert sorted(removed) == ["COPY", "DT_API_KEY", "DT_API_KEY_FILE", "DT_SOME_SECRET", "DT_TOKEN"]
    assert "COPY" not in mutable and mutable["HF_TOKEN"] == "hf"


def test_every_executor_builds_its_child_environment_without_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DT_API_KEY", "dtk_a_secret")
    monkeypatch.setenv("DT_TOKEN", "jwt")
    envs = {"pytest": TestExecutor()._env, "pool": HandlerPool._child_env(()), "training": launch._child_env(None)}
    for name, env in envs.items():
        assert env is not None and "DT_API_KEY" not in env and "DT_TOKEN" not in env, name
        assert "PATH" in env, name
