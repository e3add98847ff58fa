"""A pool child's ``run_request`` (worker/executors/pool_child.py) in-process: the context a
handler gets. The child keeps one ``Path`` per directory it is told of (they repeat on every
request), so the paths must be the ones the request named, request after request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from distributed_testing.worker.executors import pool_child
from distributed_testing.worker.executors.handlers import HandlerContext, HandlerRegistry


def _seen_by_handler(req: pool_child.Request) -> HandlerContext:
    seen: list[HandlerContext] = []

    def handler(params: dict[str, Any], ctx: HandlerContext) -> dict[str, Any]:
        seen.append(ctx)
        return {}

    registry = HandlerRegistry(use_entry_points=False)
    registry._loaded["probe"] = handler
    reply = pool_child.run_request(registry, req, msgspec.json.Encoder())
    assert reply.kind == "ok", reply
    return seen[0]


def test_the_context_names_the_requests_directories_each_time(tmp_path: Path) -> None:
    dirs = [(str(tmp_path / f"cache{i % 2}"), str(tmp_path / f"work{i % 3}")) for i in range(8)]
    for i, (cache, work) in enumerate(dirs):
        ctx = _seen_by_handler(pool_child.Request(i, "probe", {}, f"t{i}", 1, cache, work, 5.0))
        assert (ctx.task_id, ctx.attempt, ctx.timeout_s) == (f"t{i}", 1, 5.0)
        assert ctx.cache_dir == Path(cache) and ctx.work_dir == Path(work)
        assert isinstance(ctx.cache_dir, Path) and isinstance(ctx.work_dir, Path)


def test_no_directory_is_none() -> None:
    ctx = _seen_by_handler(pool_child.Request(1, "probe", {}, "t", 2))
    assert ctx.cache_dir is None and ctx.work_dir is None and ctx.timeout_s is None


def test_the_paths_kept_are_bounded(tmp_path: Path) -> None:
    for i in range(200):
        ctx = _seen_by_handler(pool_child.Request(i, "probe", {}, "t", 1, None, str(tmp_path / str(i))))
        assert ctx.work_dir == tmp_path / str(i)
    assert len(pool_child._PATHS) <= 64
