"""Layers point one way (docs/architecture.md, "Layers"): every ``import`` in the package, read
with ``ast`` (nothing is imported), goes to a strictly lower layer or stays in its own unit;
inside ``worker`` only ``worker.executors`` uses the runners; no two modules import each other,
directly or round a longer loop; every ``core`` package (``coordinator/core``, and any other
``*/core/``) stays pure. Imports under ``if TYPE_CHECKING:`` and inside functions count."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "distributed_testing"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

# Lowest first. A unit is a top-level module or package of distributed_testing.
LAYERS: list[tuple[str, ...]] = [
    ("errors",),
    ("process", "retry", "config"),  # process: event loop, child environment, NICs, the metrics endpoint, relayed streams
    ("durable", "protocol", "tasks", "bundles"),  # durable: the journal, DuckDB file helpers, fsync_dir
    ("security",),
    ("client",),  # the one coordinator client: dashboard, worker, cli and testing use it
    ("bench", "training", "dashboard"),  # the runners, used by worker executors; the web app the coordinator mounts
    ("coordinator", "worker"),
    ("cli",),
    ("plugin",),  # the pytest plugin's parts: the invocation it passes on, the reports it replays
    ("testing", "pytest_plugin"),
]
LAYER = {unit: i for i, units in enumerate(LAYERS) for unit in units}
RUNNERS = ("bench", "training")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (ROOT.parent / rel).with_suffix(".py").exists() or (ROOT.parent / rel / "__init__.py").exists()


def imports_of(path: Path) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import of our package in ``path``."""
    return imports_in(path.read_text(), module_name(path), path.name == "__init__.py")


def imports_in(source: str, name: str, is_package: bool) -> Iterator[tuple[int, str]]:
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            targets = [f"{target}.{a.name}" if is_module(f"{target}.{a.name}") else target for a in node.names]
        else:
            continue
        for t in targets:
            if t == PACKAGE or t.startswith(PACKAGE + "."):
                yield node.lineno, t


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


@functools.cache
def graph() -> dict[str, list[tuple[int, str]]]:
    return {module_name(p): sorted(set(imports_of(p))) for p in sorted(ROOT.rglob("*.py"))}


def test_every_unit_has_a_layer() -> None:
    units = {unit_of(m) for m in graph()} - {""}
    assert units <= LAYER.keys(), f"give these a layer in LAYERS and docs/architecture.md: {sorted(units - LAYER.keys())}"


def violations(g: dict[str, list[tuple[int, str]]]) -> list[str]:
    bad = []
    for module, targets in g.items():
        here = unit_of(module)
        for line, target in targets:
            there = unit_of(target)
            if here in ("", there) or there == "":
                continue
            if LAYER[there] >= LAYER[here]:
                bad.append(f"{module} (line {line}) imports {target}: {here} (layer {LAYER[here]}) may import "
                           f"only lower layers, and {there} is layer {LAYER[there]}")
            elif here == "worker" and there in RUNNERS and not module.startswith(f"{PACKAGE}.worker.executors"):
                bad.append(f"{module} (line {line}) imports {target}: only worker.executors runs the runners")
    return bad


def test_imports_go_down_the_layers() -> None:
    bad = violations(graph())
    assert not bad, "\n".join(bad)


def test_no_import_cycles() -> None:
    edges = {m: {t for _, t in ts if t != m} for m, ts in graph().items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    described = [" <-> ".join(c) + ": " + "; ".join(f"{a} imports {b}" for a in c for b in sorted(edges[a] & set(c)))
                 for c in cycles]
    assert not cycles, "\n".join(described)


def test_the_checker_names_an_offending_import() -> None:
    """The rule itself: a task-format module importing a runner, and the worker's agent importing
    one, are each reported with the module, the line and the import."""
    probe = f"{PACKAGE}.tasks.probe"
    found = list(imports_in("import os\n\nfrom ..training import task_config\n", probe, False))
    assert found == [(3, f"{PACKAGE}.training.task_config")]
    agent = f"{PACKAGE}.worker.agent"
    bad = violations({probe: found, agent: [(7, f"{PACKAGE}.training.preflight")],
                      f"{PACKAGE}.worker.executors.training": [(9, f"{PACKAGE}.training.launch")]})
    assert bad == [f"{probe} (line 3) imports {PACKAGE}.training.task_config: tasks (layer 2) may import only lower "
                   f"layers, and training is layer 5",
                   f"{agent} (line 7) imports {PACKAGE}.training.preflight: only worker.executors runs the runners"]


# A core package is pure (docs/architecture.md, "Layers"): events in, commands out, no awaits, no
# clock, no sockets, no logging, no store. It may import the standard library less these, its own
# core package, and the pure units below: errors, protocol, tasks, and retry (for ``Backoff``, whose
# jitter comes from an injectable ``random.Random``). Anything else of the package is refused.
IMPURE = frozenset({
    "asyncio", "socket", "selectors", "ssl", "time", "datetime", "logging", "threading", "multiprocessing",
    "concurrent", "subprocess", "signal", "os", "shutil", "pathlib", "tempfile", "random",
    "aiohttp", "websockets", "duckdb", "asyncpg", "psycopg", "pyarrow", "torch", "psutil",
})
PURE_UNITS = ("errors", "protocol", "tasks", "retry")


def core_packages() -> list[Path]:
    return sorted(p.parent for p in ROOT.rglob("core/__init__.py"))


def every_import(source: str, name: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, module) for every import in ``source``: ours (relative ones resolved) as
    ``imports_in`` reads them, the others by their absolute name."""
    ours = set(imports_in(source, name, is_package))
    yield from ours
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names if not a.name.startswith(PACKAGE))
        elif isinstance(node, ast.ImportFrom) and not node.level and not (node.module or "").startswith(PACKAGE):
            yield node.lineno, node.module or ""


def impurities(core: str, imports: list[tuple[int, str]], module: str) -> list[str]:
    bad = []
    for line, target in imports:
        top = target.split(".")[0]
        if top == PACKAGE:
            if target == core or target.startswith(core + ".") or unit_of(target) in PURE_UNITS:
                continue
            why = "a core imports only its own core and " + ", ".join(PURE_UNITS)
        elif top in IMPURE:
            why = f"{top} is I/O, a clock, logging or a store"
        else:
            continue
        bad.append(f"{module} (line {line}) imports {target}: {why}")
    return bad


def test_every_core_package_is_pure() -> None:
    cores = core_packages()
    assert ROOT / "coordinator" / "core" in cores
    bad = []
    for core in cores:
        for path in sorted(core.rglob("*.py")):
            name = module_name(path)
            found = sorted(every_import(path.read_text(), name, path.name == "__init__.py"))
            bad += impurities(module_name(core / "__init__.py"), found, name)
    assert not bad, "\n".join(bad)


def test_the_purity_check_names_an_offending_import() -> None:
    """The rule itself: a core module importing asyncio, the store, or a module of its unit
    outside the core is reported; its own core, protocol and the standard library pass."""
    core = f"{PACKAGE}.coordinator.core"
    source = ("import asyncio\nimport heapq\nfrom ..store.base import Store\nfrom ...protocol import messages\n"
              "from . import rows\nfrom ..events import EventHub\n")
    found = sorted(every_import(source, f"{core}.probe", False))
    assert impurities(core, found, f"{core}.probe") == [
        f"{core}.probe (line 1) imports asyncio: asyncio is I/O, a clock, logging or a store",
        f"{core}.probe (line 3) imports {PACKAGE}.coordinator.store.base: a core imports only its own core and "
        + ", ".join(PURE_UNITS),
        f"{core}.probe (line 6) imports {PACKAGE}.coordinator.events: a core imports only its own core and "
        + ", ".join(PURE_UNITS),
    ]
