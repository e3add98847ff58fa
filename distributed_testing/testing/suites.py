"""Third-party test suites taken from the registry, run locally and through the pytest plugin.

What the e2e test of a faithful shipped run (tests/e2e/test_registry_suites.py) and the suites
benchmark (``python -m benchmarks suites``) share:

* :func:`fetch` downloads a project's sdist (``pip download --no-binary :all:``) and unpacks it:
  the tree a user would have checked out.
* :func:`submitter_env` makes the virtual environment a user would run pytest in: the suite's own
  test dependencies installed in it (so they travel with the run), and this package's code and
  its dependencies importable from a directory of links that holds no distribution metadata, so
  that neither they nor the plugins of this checkout's environment are taken for the user's
  (they are not installed there, and pytest's plugin autoload does not see them). The plugin is
  loaded by name (``-p distributed_testing.pytest_plugin``).
* :func:`run_pytest` runs pytest there with ``--junitxml`` and returns the wall time and the
  per-test outcomes read from the report, keyed by test id, for local and remote runs alike.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from .suite_registry import SUITES as SUITES  # the registry, where the suites' users have imported it
from .suite_registry import Suite

PLUGIN = "distributed_testing.pytest_plugin"


def plugin_args() -> list[str]:
    """What a pytest run by this interpreter needs to load the plugin: nothing where pytest loads it
    by its entry point (the package installed), else ``-p distributed_testing.pytest_plugin``."""
    registered = any(e.value == PLUGIN for e in md.entry_points(group="pytest11"))
    return [] if registered else ["-p", PLUGIN]


def short_summary(out: str) -> tuple[list[str], str]:
    """pytest's short test summary (``-r``) in ``out``: its lines, sorted (a fleet run reports tests in
    the order they end on the workers, as xdist does, so only the set is local pytest's), and the
    final line without its time or the ``=`` around it (their width follows the time's: a run of
    10 s or more has one fewer)."""
    short = out.split("short test summary info")[1].splitlines()[1:]
    return sorted(line for line in short if not line.startswith("=")), short[-1].strip("= ").rsplit(" in ", 1)[0]


def plugin_pytest(python: Path, tree: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m pytest -rA ARGS`` in ``tree`` with this package's plugin loaded and no cache
    (what the e2e plugin tests compare, locally and with ``--dt-coordinator``); ``env`` on top of
    this process's environment."""
    return subprocess.run([str(python), "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", "-rA", *args],
                          cwd=tree, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=300, check=False)




def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 900) -> str:
    done = subprocess.run(argv, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:6])} ... exit {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout


def fetch(suite: Suite, dest: Path) -> Path:
    """The unpacked sdist of ``suite`` under ``dest`` (downloaded once)."""
    dest.mkdir(parents=True, exist_ok=True)
    have = [p for p in dest.glob("*.tar.gz")
            if re.sub(r"[-_.]+", "-", p.name).lower().startswith(re.sub(r"[-_.=]+", "-", suite.sdist).lower())]
    if not have:
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--disable-pip-version-check",
              "-d", str(dest), suite.sdist], dest)
        have = sorted(dest.glob("*.tar.gz"), key=lambda p: p.stat().st_mtime)[-1:]
    archive = have[0]
    root = dest / archive.name.removesuffix(".tar.gz")
    if not root.exists():
        with tarfile.open(archive) as tar:
            tar.extractall(dest, filter="data")
    return root


def dependency_closure(name: str, seen: set[str] | None = None) -> set[str]:
    """The normalised names of distribution ``name`` and of everything it requires, recursively,
    extras left out (those installed here: a requirement for another platform is not)."""
    seen = set() if seen is None else seen
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in seen:
        return seen
    seen.add(key)
    for req in md.requires(name) or []:
        spec, _, marker = req.partition(";")
        if "extra" in marker:
            continue
        dep = re.split(r"[\s<>=!~\[(]", spec.strip(), maxsplit=1)[0]
        try:
            md.distribution(dep)
        except md.PackageNotFoundError:
            continue
        dependency_closure(dep, seen)
    return seen


def _links(dest: Path, exclude: set[str], package: Path | None = None) -> Path:
    """A directory of links to this package (``package``: another checkout's copy of it) and the
    modules of its dependencies (without their metadata), less the distributions ``exclude`` names."""
    dest.mkdir(parents=True, exist_ok=True)
    wanted = dependency_closure("distributed_testing") - exclude
    owners = md.packages_distributions()
    here = Path(str(md.distribution("aiohttp").locate_file("")))  # this interpreter's site directory
    for module, dists in owners.items():
        if not {re.sub(r"[-_.]+", "-", d).lower() for d in dists} & wanted:
            continue
        for entry in here.glob(f"{module}*"):
            stem = entry.name.split(".")[0]
            if stem == module and not entry.name.endswith((".dist-info", ".egg-info", ".pth")) \
                    and not (dest / entry.name).exists():
                (dest / entry.name).symlink_to(entry)
    package = package or Path(__file__).resolve().parents[1]
    if not (dest / package.name).exists():
        (dest / package.name).symlink_to(package)
    return dest


def submitter_env(where: Path, requirements: list[str], package: Path | None = None) -> Path:
    """A virtual environment at ``where`` with pytest and ``requirements`` installed, and this
    package (``package``: another checkout's) importable from links (module docstring); its interpreter."""
    python = where / "bin" / "python"
    if not python.exists():
        _run([sys.executable, "-m", "venv", "--without-pip", str(where)], where.parent)
        _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-input",
              "--disable-pip-version-check", "pytest", *requirements], where.parent)
        purelib = next((where / "lib").glob("python*/site-packages"))
        mine = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower() for d in md.distributions(path=[str(purelib)])}
        links = _links(where / "dt-links", mine | {"pytest", "pluggy", "iniconfig", "pygments", "packaging"}, package)
        (purelib / "zz_dt_links.pth").write_text(f"{links}\n")  # after its own packages: a path, not an install
    return python


@dataclass
class Run:
    seconds: float
    outcomes: dict[str, str]
    output: str


def outcomes(junit: Path) -> dict[str, str]:
    """Each test case's outcome in a JUnit report (passed, failed, error, skipped), by class and name;
    a name's second and later cases (items that share a node id: docopt-ng's) as ``name #N``, so a
    run that reports one more or fewer of them, or another outcome for one, differs."""
    out: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = next((k for k in ("error", "failure", "skipped") if k in kinds), "passed")
        key = name = f"{case.get('classname')}::{case.get('name')}"
        n = 1
        while key in out:
            n += 1
            key = f"{name} #{n}"
        out[key] = {"failure": "failed"}.get(outcome, outcome)
    return out


def run_pytest(python: Path, tree: Path, args: list[str], junit: Path, env: dict[str, str] | None = None,
               cache: Path | None = None) -> Run:
    """pytest in ``tree`` with ``args`` and this package's plugin loadable, in the virtual
    environment of ``python`` activated (its scripts first on ``PATH``, as a user's shell, tox or
    ``uv run`` has them); its wall time and outcomes. ``cache``: pytest's cache directory (where
    the plugin keeps the tests' durations), else none."""
    caching = ["-o", f"cache_dir={cache}"] if cache is not None else ["-p", "no:cacheprovider"]
    argv = [str(python), "-m", "pytest", "-p", PLUGIN, "-q", *caching, f"--junitxml={junit}", *args]
    activated = {"VIRTUAL_ENV": str(python.parent.parent),
                 "PATH": os.pathsep.join([str(python.parent), *filter(None, [os.environ.get("PATH")])])}
    started = time.monotonic()
    done = subprocess.run(argv, cwd=tree, env={**os.environ, **activated, **(env or {})}, capture_output=True,
                          text=True, timeout=1800, check=False)
    took = time.monotonic() - started
    if not junit.exists():
        raise RuntimeError(f"pytest wrote no report (exit {done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    return Run(took, outcomes(junit), done.stdout + done.stderr)
