"""The registry of named custom handlers run by the ``custom`` task type.

A handler is a plain function ``(parameters: dict, ctx: HandlerContext) -> dict`` whose result is
JSON-able. It runs inside a pool child process (see :mod:`.pool_child`), never in the worker's
event loop. It reports bad parameters by raising :class:`HandlerParameterError` (the task then
errors with that message); any other exception means the task failed.

Handlers come from three places, looked up in this order:

1. the built-ins in :data:`BUILTIN_HANDLERS`;
2. extra ``name -> "module:function"`` specs given to the executor (same format as entry points);
3. the entry-point group :data:`ENTRY_POINT_GROUP` of installed distributions, each entry point
   registering its function under the entry point's name.

Entry points are discovered by name when the registry is built but imported only when first used,
so one broken plugin makes only its own tasks error.
"""

from __future__ import annotations

import importlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import msgspec

from distributed_testing.errors import ExecutionError

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "distributed_testing.custom_handlers"


class HandlerContext(msgspec.Struct, frozen=True):
    """What a handler may know about the task it serves (read-only).

    ``cache_dir`` is the handlers' cache directory (``<worker cache directory>/handlers``; None
    when the worker has none);
    ``work_dir`` a scratch directory for this task, when the agent gives one. A msgspec Struct
    rather than a dataclass because one is built per task and a frozen dataclass costs ~30x more.
    """

    task_id: str
    attempt: int
    cache_dir: Path | None = None
    work_dir: Path | None = None
    timeout_s: float | None = None


Handler = Callable[[dict[str, Any], HandlerContext], dict[str, Any]]


class HandlerParameterError(ValueError):
    """A handler's parameters are invalid; the task errors with this message (not 'failed')."""


class HandlerLoadError(ExecutionError):
    """A handler named in the registry could not be imported."""


def check_keys(parameters: Mapping[str, Any], allowed: set[str]) -> None:
    """Raise :class:`HandlerParameterError` naming any key of ``parameters`` not in ``allowed``."""
    unknown = sorted(set(parameters) - allowed)
    if unknown:
        raise HandlerParameterError(
            f"unknown parameter(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed)) or 'none'}"
        )


def noop(parameters: dict[str, Any], ctx: HandlerContext) -> dict[str, Any]:
    """Do nothing and return ``{}``; takes no parameters."""
    check_keys(parameters, set())
    return {}


def sleep(parameters: dict[str, Any], ctx: HandlerContext) -> dict[str, Any]:
    """Sleep ``parameters["seconds"]`` (a finite number >= 0); returns ``{"slept_s": measured}``."""
    check_keys(parameters, {"seconds"})
    seconds = parameters.get("seconds")
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or seconds < 0
    ):
        raise HandlerParameterError(f"seconds must be a non-negative number, got {seconds!r}")
    start = time.monotonic()
    time.sleep(seconds)
    return {"slept_s": round(time.monotonic() - start, 6)}



BUILTIN_HANDLERS: Mapping[str, Handler] = {
    "noop": noop,
    "sleep": sleep,
}
# Built-ins that live in their own module, loaded by name on first use like any spec (that module
# imports this one, so this one never imports it).
BUILTIN_SPECS: Mapping[str, str] = {
    "setup_environment": "distributed_testing.worker.executors.setup_env:setup_environment",
}


def load_spec(spec: str) -> Handler:
    """Import ``"module:function"`` (``module:obj.attr`` also works) and return the callable."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise HandlerLoadError(f"handler spec {spec!r} is not of the form 'module:function'")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr_path.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise HandlerLoadError(f"cannot load handler {spec!r}: {exc}") from exc
    if not callable(obj):
        raise HandlerLoadError(f"handler {spec!r} is not callable")
    handler: Handler = obj
    return handler


class HandlerRegistry:
    """Name -> handler lookup; imports extra specs and entry points lazily on first use."""

    def __init__(self, extra: Mapping[str, str] | None = None, *, use_entry_points: bool = True) -> None:
        self._loaded: dict[str, Handler] = dict(BUILTIN_HANDLERS)
        self._specs: dict[str, str] = dict(BUILTIN_SPECS)
        for name, spec in (extra or {}).items():
            self._add_spec(name, spec, source="executor config")
        if use_entry_points:
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                self._add_spec(ep.name, ep.value, source=f"entry point of {_dist_name(ep)}")

    def _add_spec(self, name: str, spec: str, *, source: str) -> None:
        if name in self._loaded or name in self._specs:
            logger.warning("ignoring custom handler %r = %r from %s: name already registered", name, spec, source)
            return
        self._specs[name] = spec

    def names(self) -> list[str]:
        """Every registered handler name, sorted."""
        return sorted({*self._loaded, *self._specs})

    def __contains__(self, name: object) -> bool:
        return name in self._loaded or name in self._specs

    def resolve(self, name: str) -> Handler:
        """The handler for ``name``; ExecutionError for an unknown name, HandlerLoadError if it won't import."""
        handler = self._loaded.get(name)
        if handler is not None:
            return handler
        spec = self._specs.get(name)
        if spec is None:
            raise ExecutionError(f"unknown custom handler {name!r}; known handlers: {', '.join(self.names())}")
        handler = load_spec(spec)
        self._loaded[name] = handler
        return handler


def _dist_name(ep: Any) -> str:
    dist = getattr(ep, "dist", None)
    return str(getattr(dist, "name", "unknown distribution"))
