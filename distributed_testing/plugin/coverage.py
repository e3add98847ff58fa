"""pytest-cov through the fleet: the run's coverage is measured where its tests run and reported
here, as pytest-xdist's workers send theirs to its controller.

Where pytest-cov measures the local run (``--cov``, from the command line or the ini file's
``addopts``) and travels with it (a shipped tree with the captured environment, which holds
pytest-cov), the plugin passes pytest-cov's options that say what to measure on to the workers
(:data:`.invocation.COVERAGE`, with ``--cov-report=``: no report there). Each worker's session
sends, with each task's result, what coverage measured since its previous task
(``worker/executors/pytest_serve.py``), its files named by where the submitter has them
(``tree/REL``, ``site/REL``: ``worker/executors/session_coverage.py``). :class:`Combined` gathers
them and, before pytest-cov's own end of the run, writes them as a parallel data file beside
pytest-cov's (``.coverage.dt.HOST.PID.N``), which pytest-cov combines with its own as it
combines a subprocess's: its report, ``--cov-fail-under`` and its data files are then the run's.

Not carried: the contexts of ``--cov-context=test`` (the lines are, without them) and what a
test's subprocesses measured on a worker. Where the coverage cannot travel (``--dt-shared-tree``,
``--dt-no-env``) the local report covers only what ran here, collection, and the plugin says so.
"""

from __future__ import annotations

import itertools
import os
import socket
import sysconfig
from pathlib import Path
from typing import Any

import pytest

COV_PLUGIN = "_cov"  # the name pytest-cov registers its plugin under
_counter = itertools.count()


def measuring(config: pytest.Config) -> Any:
    """pytest-cov's controller where it measures this run (None: it is not installed, ``--cov`` is
    not given, or ``--no-cov``)."""
    plugin = config.pluginmanager.get_plugin(COV_PLUGIN)
    return getattr(plugin, "cov_controller", None) if plugin is not None else None


def _package_dir(name: str) -> Path | None:
    """Where this interpreter imports the top-level package ``name`` from (without importing it)."""
    import importlib.util

    if not name.isidentifier():
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(getattr(spec, "submodule_search_locations", None) or [])
    return Path(locations[0]) if len(locations) == 1 else None


def _local_sites() -> list[Path]:
    paths = sysconfig.get_paths()
    return [Path(p) for p in dict.fromkeys((paths["purelib"], paths["platlib"]))]


class Combined:
    """The coverage the tasks of a run sent back, in the submitter's paths."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.sites = _local_sites()
        self.files: dict[str, set[Any]] = {}  # path: line numbers, or (from, to) arcs
        self.arcs: bool | None = None
        self.tasks = 0  # tasks that sent coverage
        self.unplaced: set[str] = set()  # files measured there that are not here
        self._placed: dict[str, str | None] = {}  # each name's place here, looked up once per run
        self.problems: list[str] = []

    def add(self, task_id: str, output: dict[str, Any]) -> None:
        """A finished task's result output: its ``coverage``, if any."""
        cov = output.get("coverage")
        if not isinstance(cov, dict):
            return
        if "error" in cov:
            self.problems.append(f"task {task_id}: {cov['error']}")
            return
        self.tasks += 1
        arcs = bool(cov.get("arcs"))
        if self.arcs is None:
            self.arcs = arcs
        elif self.arcs != arcs:
            self.problems.append(f"task {task_id}: measured {'arcs' if arcs else 'lines'} where the others "
                                 f"measured {'arcs' if self.arcs else 'lines'}; left out")
            return
        for name, data in (cov.get("files") or {}).items():
            name = str(name)
            if name not in self._placed:
                self._placed[name] = self._place(name)
            path = self._placed[name]
            if path is None:
                self.unplaced.add(name)
                continue
            got = self.files.setdefault(path, set())
            if arcs:
                got.update((int(a), int(b)) for a, b in data)
            else:
                for first, last in data:
                    got.update(range(int(first), int(last) + 1))

    def _place(self, name: str) -> str | None:
        """A file named ``tree/REL`` or ``site/REL`` where it is here, if it is."""
        kind, _, rel = name.partition("/")
        if not rel or ".." in rel.split("/"):
            return None
        bases = [self.root] if kind == "tree" else self.sites if kind == "site" else []
        for base in bases:
            path = base / rel
            if path.is_file():
                return str(path)
        if kind == "site":  # installed there, and here imported from elsewhere (an editable install)
            top, _, below = rel.partition("/")
            where = _package_dir(top)
            if where is not None and below and (where / below).is_file():
                return str(where / below)
        return None

    def write(self, controller: Any) -> str | None:
        """Writes the combined coverage as a parallel data file beside pytest-cov's, for it to
        combine at the run's end; a line that says what was written or why not."""
        if not self.files:
            return None
        local = getattr(getattr(controller, "cov", None), "config", None)
        data_file = getattr(local, "data_file", None)
        if not isinstance(data_file, str):
            return "coverage: pytest-cov's data file is not known here; the workers' coverage is left out"
        branch = bool(getattr(local, "branch", False))
        if self.arcs is not None and branch != self.arcs:
            return (f"coverage: the workers measured {'arcs' if self.arcs else 'lines'} and this run "
                    f"{'arcs' if branch else 'lines'}; the workers' coverage is left out")
        import coverage

        suffix = f"dt.{socket.gethostname()}.{os.getpid()}.{next(_counter)}"
        data = coverage.CoverageData(basename=os.path.abspath(data_file), suffix=suffix)
        if self.arcs:
            data.add_arcs({path: sorted(got) for path, got in self.files.items()})
        else:
            data.add_lines({path: sorted(got) for path, got in self.files.items()})
        data.write()
        return None

    def lines(self, controller: Any) -> list[str]:
        """What the terminal summary says of the run's coverage: what is missing from it."""
        out = [f"coverage: {p}" for p in self.problems]
        if self.unplaced:
            sample = ", ".join(sorted(self.unplaced)[:3])
            out.append(f"coverage: {len(self.unplaced)} files measured on the workers are not here and are left out "
                       f"({sample}{', ...' if len(self.unplaced) > 3 else ''})")
        if controller is not None and not self.tasks:
            out.append("coverage: no coverage came back from the workers, so pytest-cov's report covers only what "
                       "ran here (collection); it travels with a shipped tree and its environment (not with "
                       "--dt-shared-tree or --dt-no-env)")
        return out
