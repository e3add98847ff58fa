"""The submitter's Python environment as requirements a worker builds again (docs/tasks.md,
"The environment travels with the run").

:func:`capture` lists what is installed where pytest (or ``dt``) runs, so that the worker's
environment for the run (:mod:`distributed_testing.worker.pyenv`) holds the same distributions at
the same versions, and nothing else. The rule, chosen to be simple and to refuse rather than guess:

* **What counts.** The distributions installed in the running interpreter's site directories
  (``site.getsitepackages()``, and the user site when Python enables it): what ``pip list`` shows.
  Directories that ``PYTHONPATH`` or a ``sys.path`` edit adds are not installations and do not
  travel.
* **As what.** ``name==version`` each (``name===version`` for a version PEP 440 cannot read),
  one per name (the first on ``sys.path`` wins, as for import), sorted. The worker's index must
  have a wheel of each for its platform.
* **Left out.** ``distributed_testing`` itself: the worker brings its own report writer, and the
  plugin is disabled there.
* **Local installs.** A distribution installed from a local directory (editable or not: PEP 610's
  ``direct_url.json`` with ``dir_info``) becomes ``./dir`` when that directory lies inside the
  shipped tree (the worker builds it from the bundle's copy); one outside the tree is refused
  (:class:`LocalInstallError` naming each): the worker cannot have it, and leaving it out would
  make the remote run differ from the local one without a word.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import site
import urllib.parse
import urllib.request
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

SKIPPED = frozenset({"distributed-testing"})


class LocalInstallError(ValueError):
    """Distributions installed from local directories outside the shipped tree."""


def site_dirs() -> list[str]:
    """The running interpreter's site directories: where its distributions are installed."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dirs if Path(d).is_dir()]


def capture(tree: Path, paths: list[str] | None = None) -> list[str]:
    """The requirements that rebuild the environment of the distributions under ``paths``
    (default :func:`site_dirs`) for a run of ``tree`` (module docstring)."""
    root = tree.resolve()
    seen: dict[str, str] = {}
    outside: list[str] = []
    for dist in md.distributions(path=paths if paths is not None else site_dirs()):
        name = dist.metadata["Name"] if dist.metadata is not None else None
        if not name:
            continue  # a broken install without metadata: pip list skips it too
        key = canonicalize_name(name)
        if key in seen or key in SKIPPED:
            continue
        local = _local_dir(dist)
        if local is None:
            seen[key] = _pin(name, dist.version)
        elif local == root or local.is_relative_to(root):
            seen[key] = "./" + local.relative_to(root).as_posix() if local != root else "./"
        else:
            seen[key] = ""
            outside.append(f"{name} ({local})")
    if outside:
        raise LocalInstallError(
            f"installed from local directories outside the shipped tree {root}: {', '.join(sorted(outside))}; "
            "a worker cannot install those. Ship them inside the tree, install them from an index, or "
            "choose the environment yourself (a requirements.txt at the tree's root)")
    return sorted(e for e in seen.values() if e)


def _pin(name: str, version: str) -> str:
    try:
        Version(version)
    except InvalidVersion:
        return f"{name}==={version}"
    return f"{name}=={version}"


def _local_dir(dist: md.Distribution) -> Path | None:
    """The local directory ``dist`` was installed from (PEP 610), None for an index install."""
    text = dist.read_text("direct_url.json")
    if not text:
        return None
    try:
        info = json.loads(text)
    except ValueError:
        return None
    url = info.get("url") if isinstance(info, dict) else None
    if not isinstance(url, str) or "dir_info" not in info or not url.startswith("file:"):
        return None
    return Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path)).resolve()
