"""Python requirements of a bundle task: what a submitter may ask a worker to ``pip install``.

Pure: no I/O. Both sources obey one grammar, checked by :func:`check` (at submit for the task's
``requirements.python`` list, at the worker for a bundle's root ``requirements.txt``, read by
:func:`parse_file`):

* a requirement as PEP 508 writes it without a URL: a name, optional extras, version specifiers
  and an environment marker (``numpy>=1.26``, ``transformers[torch]==5.23.0; python_version>"3.10"``);
* or a path to a directory inside the bundle, written ``./dir`` (the bundle ships its own package);
  no ``..`` and nothing absolute.

Refused, each with a reason: pip options (``-e``, ``-r``, ``--index-url``, ``-f``, ``--hash``, any
token starting with ``-``): they would choose where code comes from, which the worker's operator
decides (``/etc/pip.conf``); URLs and direct references (``pkg @ https://...``, ``git+...``): code
fetched from anywhere, past the operator's index. At most :data:`MAX_ENTRIES` entries of at most
:data:`MAX_LENGTH` characters each.

:func:`normalise` gives the canonical list (stripped, de-duplicated, sorted) that names a
virtual environment together with the worker's interpreter.
"""

from __future__ import annotations

import posixpath
import re

from packaging.requirements import InvalidRequirement, Requirement

MAX_ENTRIES = 500  # a captured environment (bundles/environment.py) lists every installed distribution
MAX_LENGTH = 200
_LOCAL = re.compile(r"^\./[A-Za-z0-9._/-]*$")


def is_local(entry: str) -> bool:
    """Whether ``entry`` names a directory of the bundle (``./dir``) rather than a package."""
    return entry.startswith("./")


def check(entry: str) -> str | None:
    """None when ``entry`` may be installed; otherwise why not (one sentence)."""
    if not entry.strip():
        return "must not be empty"
    if len(entry) > MAX_LENGTH:
        return f"must be at most {MAX_LENGTH} characters"
    text = entry.strip()
    if text.startswith("-"):
        return (f"pip options are not allowed ({text.split()[0]!r}): the worker's operator chooses the index "
                "and how packages are installed")
    if is_local(text):
        if not _LOCAL.match(text):
            return "a bundle directory is ./ followed by letters, digits and . _ / - only"
        if ".." in text.split("/"):
            return "a bundle directory must stay inside the bundle (no '..')"
        return None
    if "://" in text or text.startswith(("/", "~", ".")) or re.match(r"^(git|hg|svn|bzr)\+", text):
        return "URLs and file paths are not allowed: name a package (name[extras] specifiers) or ./dir in the bundle"
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        return f"not a valid requirement: {str(exc).splitlines()[0]}"
    if req.url is not None:
        return "direct references (name @ URL) are not allowed: name a package with version specifiers"
    return None


def errors(entries: list[str]) -> list[tuple[int | None, str]]:
    """(index, reason) for every bad entry; index None for the list as a whole."""
    out: list[tuple[int | None, str]] = []
    if len(entries) > MAX_ENTRIES:
        out.append((None, f"must hold at most {MAX_ENTRIES} requirements; got {len(entries)}"))
    for i, e in enumerate(entries):
        reason = check(e)
        if reason is not None:
            out.append((i, reason))
    return out


def parse_file(text: str) -> tuple[list[str], list[str]]:
    """A ``requirements.txt``'s entries (blank lines and ``#`` comments dropped) and the errors,
    each naming its line: ``requirements.txt line 3: ...``."""
    entries: list[str] = []
    problems: list[str] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        reason = check(line)
        if reason is not None:
            problems.append(f"requirements.txt line {n}: {reason}: {line[:80]!r}")
        entries.append(line)
    if len(entries) > MAX_ENTRIES:
        problems.append(f"requirements.txt holds {len(entries)} requirements; at most {MAX_ENTRIES}")
    return entries, problems


def normalise(entries: list[str]) -> list[str]:
    """The canonical list: each entry stripped, each ``./dir`` in its normal form
    (:func:`local_path`: ``./mypkg/.`` and ``./mypkg/`` are ``./mypkg``, so the environment's name
    covers that directory's files), duplicates dropped, sorted."""
    out = set()
    for e in entries:
        text = e.strip()
        if text:
            out.add("./" + local_path(text) if is_local(text) else text)
    return sorted(out)


def local_path(entry: str) -> str:
    """The bundle directory a ``./dir`` entry names, relative to the bundle's root and normal
    (no ``.`` parts, no empty parts, no trailing ``/``); ``""`` for the root itself."""
    path = posixpath.normpath(entry.strip()[2:].lstrip("/") or ".")
    return "" if path == "." else path
