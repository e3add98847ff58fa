"""What pip needs of the worker's host to reach the operator's index from inside the sandbox.

The wheels step of a bundle's environment (:mod:`.pyenv`) runs pip in a sandbox that shows only
what is bound in by name, with ``HOME`` in the task's scratch directory. So the operator's pip
settings, which pip on the host finds by itself, are carried in explicitly,
:meth:`PipAccess.of_host`, read once when the worker starts:

* **Global files** (``$XDG_CONFIG_DIRS/pip/pip.conf``, default ``/etc/xdg/pip/pip.conf``, and
  ``/etc/pip.conf``): bound read-only at their own paths, where pip in the sandbox finds them.
* **Personal files** (the user's ``~/.pip/pip.conf`` and ``$XDG_CONFIG_HOME/pip/pip.conf``, the
  worker's own environment's ``pip.conf`` and the file ``PIP_CONFIG_FILE`` names): pip would not
  find them there (another ``HOME``, another ``sys.prefix``), so they are merged in pip's order of
  precedence into one text (:attr:`PipAccess.merged`), which the wheels step writes into its
  scratch directory (mode 0600: it may hold an index's credentials), names by ``PIP_CONFIG_FILE``
  (which pip ranks above the global files, as it ranks these) and removes as soon as pip is done,
  before any submitter code runs there. Without ``PIP_CONFIG_FILE`` the user files are merged;
  with one that exists, not (pip skips them then). ``PIP_CONFIG_FILE=/dev/null`` (no files at
  all) is passed on as it is.
* **The local paths they name**: every ``find-links``, ``index-url``, ``extra-index-url``,
  ``cert``, ``client-cert`` and ``constraint`` value in those files and in the ``PIP_*``
  variables that is an absolute path or a ``file://`` URL, bound read-only by name if it exists.
  A ``file://`` index is bound with its parent directory: a simple index's pages link the
  files kept beside it (``simple/`` and ``files/``, as dir2pi and the like lay them out).
* **The worker's ``PIP_*`` variables**, except those that would choose where pip installs
  (``PIP_TARGET``, ``PIP_PREFIX``, ``PIP_ROOT``, ``PIP_USER``, ``PIP_SRC``, ``PIP_PYTHON``).

Only the wheels step sees any of it (no submitter code runs there); the step that builds the
bundle's own packages runs the submitter's build backend, and gets none of it: the settings may
hold an index's credentials.
"""

from __future__ import annotations

import configparser
import io
import os
import sys
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

_PATH_KEYS = frozenset({"find-links", "index-url", "extra-index-url", "cert", "client-cert", "constraint"})
_INDEX_KEYS = frozenset({"index-url", "extra-index-url"})
_NOT_PASSED = frozenset({"PIP_TARGET", "PIP_PREFIX", "PIP_ROOT", "PIP_USER", "PIP_SRC", "PIP_PYTHON",
                         "PIP_CONFIG_FILE"})


@dataclass(frozen=True)
class PipAccess:
    """The read-only paths (``ro``), variables (``env``) and merged personal configuration
    (``merged``, ini text; None without one) of the wheels step's sandbox."""

    ro: tuple[Path, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    merged: str | None = None

    @classmethod
    def of_host(cls, environ: Mapping[str, str], prefix: str = sys.prefix) -> PipAccess:
        """The host's pip settings (module docstring)."""
        given = environ.get("PIP_CONFIG_FILE")
        env = {k: v for k, v in environ.items() if k.startswith("PIP_") and k not in _NOT_PASSED}
        if "XDG_CONFIG_DIRS" in environ:
            env["XDG_CONFIG_DIRS"] = environ["XDG_CONFIG_DIRS"]
        if given == os.devnull:
            return cls(_named_paths([], env), {**env, "PIP_CONFIG_FILE": os.devnull})
        dirs = [d for d in (environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":") if d]
        global_files = [f for f in [*(Path(d) / "pip" / "pip.conf" for d in dirs), Path("/etc/pip.conf")]
                        if f.is_file()]
        home = Path(environ.get("HOME") or os.path.expanduser("~"))
        users = [home / ".pip" / "pip.conf",
                 Path(environ.get("XDG_CONFIG_HOME") or home / ".config") / "pip" / "pip.conf"]
        personal = [] if given and Path(given).exists() else users
        personal += [Path(prefix) / "pip.conf", *([Path(given)] if given else [])]
        parsers = [_read([f]) for f in global_files]
        mine = [f for f in personal if f.is_file()]
        merged = _read(mine) if mine else None  # a later file's value wins, as in pip
        text = None
        if merged is not None:
            out = io.StringIO()
            merged.write(out)
            text = out.getvalue()
        ro = [*global_files, *_named_paths([*parsers, *([merged] if merged else [])], env)]
        return cls(tuple(dict.fromkeys(ro)), env, text)

    def write_merged(self, dest: Path) -> dict[str, str]:
        """The step's pip variables, after writing :attr:`merged` (if any) to ``dest`` (0600),
        which they then name as ``PIP_CONFIG_FILE``."""
        if self.merged is None:
            return dict(self.env)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self.merged)
        return {**self.env, "PIP_CONFIG_FILE": str(dest)}


def _read(files: list[Path]) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser()
    try:
        parser.read(files)
    except configparser.Error:
        pass  # pip reports a broken file itself, naming it
    return parser


def _named_paths(parsers: list[configparser.RawConfigParser], env: Mapping[str, str]) -> tuple[Path, ...]:
    """The existing local paths the settings in ``parsers`` and ``env`` name (module docstring)."""
    values: list[tuple[str, str]] = []
    for parser in parsers:
        for section in parser.sections():
            values += [(k.replace("_", "-"), v) for k, v in parser.items(section)]
    values += [(k[4:].lower().replace("_", "-"), v) for k, v in env.items() if k.startswith("PIP_")]
    out: list[Path] = []
    for key, value in values:
        if key not in _PATH_KEYS:
            continue
        for token in value.split():
            if token.startswith("file://"):
                path = Path(urllib.parse.unquote(urllib.parse.urlparse(token).path))
            elif token.startswith("/"):
                path = Path(token)
            else:
                continue
            if key in _INDEX_KEYS and path.parent != Path(path.anchor):  # never the whole root
                path = path.parent
            if path.exists():
                out.append(path)
    return tuple(dict.fromkeys(out))
