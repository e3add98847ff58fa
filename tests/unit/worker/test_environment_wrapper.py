"""The environment wrapper every real worker's executors wear keeps what the agent reads of them:
the custom executor's handler names (``Register.handlers``) and batching."""

from __future__ import annotations

from distributed_testing.worker.environment import EnvironmentProbe, with_environment
from distributed_testing.worker.executors import default_executors
from distributed_testing.worker.executors.base import advertised_handlers


def test_wrapped_executors_advertise_the_same_handlers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    executors = default_executors(1, cache_dir=tmp_path)
    wrapped = with_environment(executors, EnvironmentProbe())
    assert advertised_handlers(wrapped) == advertised_handlers(executors)
    assert {"noop", "sleep"} <= set(advertised_handlers(wrapped))
    for kind, inner in executors.items():
        assert hasattr(wrapped[kind], "run_batch") == hasattr(inner, "run_batch"), kind
