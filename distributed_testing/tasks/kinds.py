"""The task-kind registry: every task type declared once.

A :class:`Kind` says, for one value of a task's ``type``:

- ``config``: the msgspec struct its ``config`` must decode into (unknown keys refused; its
  defaults are the ones the runner uses). The published JSON Schema is generated from it.
- ``check``: cross-field rules over ``(raw dict, struct)``, returning ``(field, error)`` pairs.
- ``hardware``: the hardware kinds its config implies (added to ``requirements.hardware``).
- ``gang_size``: how many distinct workers one task needs at once (0: an ordinary task).
- ``batch_key``: tasks with equal keys may run as one batch on one worker (None: never batched).
- ``handler``: the custom handler a task calls (None: none); placement waits for a worker that
  reports it (``Register.handlers``), and ``--strict`` refuses it at submit when no connected
  worker has it, naming ``config.<handler_field>``.
- ``imports_model``: its ``config.model`` may name a ``module:callable`` (placement checks the
  workers' ``--allow-model-modules``).
- ``pipelined``: a task of this kind may be sent to a busy worker ahead of a free slot, to run
  there once the tasks before it finish (``--pipeline-depth``; docs/protocol.md, "Pipelining").
  Off for kinds that must run alone on their worker (benchmark, training): they are placed only
  on a free slot, and no task is queued behind one.
- ``shipped``: rules over ``(struct, files)`` for a task with a bundle whose manifest lists
  ``files`` (relative paths), checked by the coordinator at submit: what the config names in the
  shipped code must be there.
- ``cacheable``: its results may be answered from the worker's result cache (``"cache": true``;
  accepted on other kinds with a warning that it changes nothing).
- ``executor``: ``"package.module:factory"``, the worker-side factory that builds its executor
  from :class:`~distributed_testing.worker.executors.base.ExecutorSettings`. It is a string so
  that this package imports no runner.

Adding a kind is one :class:`Kind` here (or in a registry built with :meth:`Registry.with_kind`)
and one executor module. :func:`active` is the registry the coordinator and workers of this
process use; :func:`installed` swaps it for a block (tests, embedders that add kinds).

The old spelling of a training task, ``{"type": "benchmark", "config": {"kind": "training", ...}}``,
is still accepted: :func:`upgrade` rewrites it to ``{"type": "training", ...}`` and says so in a
deprecation warning.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from . import configs as c

Problems = list[tuple[str, str]]


def _no_check(raw: dict[str, Any], cfg: Any) -> Problems:
    return []


def _no_hardware(cfg: Any) -> tuple[str, ...]:
    return ()


def _no_gang(cfg: Any) -> int:
    return 0


def _no_batch(cfg: Any) -> tuple[Any, ...] | None:
    return None


def _no_handler(cfg: Any) -> str | None:
    return None


def _no_shipped(cfg: Any, files: frozenset[str]) -> Problems:
    return []


@dataclass(frozen=True)
class Kind:
    """One task type; see the module docstring for each field's contract."""

    name: str
    config: type[msgspec.Struct]
    executor: str
    check: Callable[[dict[str, Any], Any], Problems] = _no_check
    hardware: Callable[[Any], tuple[str, ...]] = _no_hardware
    gang_size: Callable[[Any], int] = _no_gang
    batch_key: Callable[[Any], tuple[Any, ...] | None] = _no_batch
    handler: Callable[[Any], str | None] = _no_handler
    handler_field: str = "name"
    imports_model: bool = False
    pipelined: bool = False
    cacheable: bool = False
    shipped: Callable[[Any, frozenset[str]], Problems] = _no_shipped

    def decode(self, raw: dict[str, Any]) -> Any:
        """The config struct of a config that passed submit validation (raises
        msgspec.ValidationError otherwise)."""
        return msgspec.convert(raw, self.config)


@dataclass(frozen=True)
class Registry:
    """An immutable set of kinds by name."""

    kinds: tuple[Kind, ...]
    _by_name: dict[str, Kind] = field(init=False, repr=False, compare=False)
    _cache: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [k.name for k in self.kinds]
        if len(set(names)) != len(names):
            raise ValueError(f"task kinds declared twice: {sorted(n for n in set(names) if names.count(n) > 1)}")
        object.__setattr__(self, "_by_name", {k.name: k for k in self.kinds})
        object.__setattr__(self, "_cache", {})

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def get(self, name: str) -> Kind:
        """The kind called ``name``; KeyError naming the known kinds otherwise."""
        kind = self._by_name.get(name)
        if kind is None:
            raise KeyError(f"unknown task type {name!r}; known: {', '.join(self.names())}")
        return kind

    def find(self, name: str) -> Kind | None:
        return self._by_name.get(name)

    def with_kind(self, kind: Kind) -> Registry:
        """A new registry with ``kind`` added (ValueError if the name is taken)."""
        return Registry((*self.kinds, kind))

    def cached(self, key: str, build: Callable[[], Any]) -> Any:
        """Per-registry memo for things derived from it (schema, decoders)."""
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]


BUILTIN = Registry((
    Kind("benchmark", c.BenchmarkConfig, "distributed_testing.worker.executors.benchmark:build",
         check=c.check_benchmark, hardware=c.benchmark_hardware, batch_key=c.benchmark_batch_key,
         imports_model=True, cacheable=True),
    Kind("training", c.TrainingConfig, "distributed_testing.worker.executors.training:build",
         check=c.check_training, hardware=c.training_hardware, gang_size=lambda cfg: cfg.nodes,
         imports_model=True),
    Kind("test", c.TestConfig, "distributed_testing.worker.executors.test_session:build", check=c.check_test, pipelined=True,
         shipped=c.shipped_test),
    Kind("custom", c.CustomConfig, "distributed_testing.worker.executors.custom:build", handler=lambda cfg: cfg.name,
         pipelined=True, shipped=c.shipped_custom),
))

_active: list[Registry] = [BUILTIN]


def active() -> Registry:
    """The registry in use in this process."""
    return _active[-1]


@contextlib.contextmanager
def installed(registry: Registry) -> Iterator[Registry]:
    """Use ``registry`` for submit validation, placement and executors inside the block."""
    _active.append(registry)
    try:
        yield registry
    finally:
        _active.remove(registry)


DEPRECATED_TRAINING = ('{"type": "benchmark", "config": {"kind": "training", ...}} is deprecated: '
                       'submit {"type": "training", "config": {...}} (same config without "kind")')


def upgrade(item: Any) -> tuple[Any, str | None]:
    """``item`` with the old training spelling rewritten to the ``training`` type, and the
    deprecation warning (None when nothing was rewritten)."""
    if (isinstance(item, dict) and item.get("type") == "benchmark" and isinstance(item.get("config"), dict)
            and item["config"].get("kind") == "training"):
        config = {k: v for k, v in item["config"].items() if k != "kind"}
        return {**item, "type": "training", "config": config}, DEPRECATED_TRAINING
    return item, None
