"""The environment wrapper every real worker's executors wear keeps what the agent reads of them:
the custom executor's handler names (``Register.handlers``) and batching."""

from __future__ import annotations

import pytest

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


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_killing_a_probe_that_already_ended_is_fine(loop: str) -> None:
    """A worker stopping right after a refused registration cancelled its environment probe as the
    probe ended on its own: uvloop's ``kill`` raised ProcessLookupError through the worker's exit."""
    import asyncio
    import sys

    from distributed_testing.worker.environment import _kill

    async def main() -> int | None:
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
        await proc.wait()
        await _kill(proc)
        return proc.returncode

    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        assert uvloop.run(main()) == 0
    else:
        assert asyncio.run(main()) == 0
