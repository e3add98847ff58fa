"""Which ``test_args`` a submitter may pass to pytest on a worker. Pure: no I/O beyond resolving
paths under the test root.

The rule, token by token:

* A **positional** argument (a test path, optionally ``path::node``) must resolve under the
  worker's test root: no absolute path outside it, no ``..`` climbing out, no symlink pointing out.
* A token starting with ``@`` is refused anywhere: pytest would read more arguments from that file.
* ``-p`` is read as pytest reads it: pytest scans *every* token for ``-p NAME`` and ``-pNAME``
  before it parses options (``PytestPluginManager.consider_preparse``), those after ``--``
  included, so after ``--`` such a token is still the guarded ``-p``, not a path.
* The options of this project's own pytest plugin (``--dt-coordinator``, ``--dt-api-key``, any
  ``--dt-*``) are refused outright: test tasks run with that plugin disabled
  (``-p no:distributed_testing``), and with it a task could make the worker submit its tests, and
  a key, to any URL.
* pytest's own options that only select, report or stop (``-k``, ``-m``, ``-x``, ``--maxfail``,
  ``-q``, ``-v``, ``-s``, ``--tb``, ``-r``, ``--durations``, ``--strict-markers``, ...) are allowed
  (:data:`SAFE_FLAGS`, :data:`SAFE_VALUED`); ``--ignore``, ``--ignore-glob``, ``--deselect`` and
  ``--doctest-glob`` take a path that must stay under the root too.
* pytest's options that write files, load code, or change where pytest looks for its
  configuration (:data:`GUARDED`: ``--debug``, ``--junitxml``, ``-p``, ``-c``, ``--rootdir``,
  ``--basetemp``, ``-o``, ``--pyargs``, ``-W``, ``--log-file``, ``--pdb``, the cache options,
  pytest-cov's and pytest-html's ...) are refused unless the worker's operator lists them in
  ``--allow-test-options``. Any other short option is refused.
* A task with a bundle runs in the bundle sandbox, where what its pytest loads or reads acts on
  that run alone: it may also use :data:`SANDBOXED` (``-p``, ``-o``, ``-W``, ``-c``,
  ``--rootdir``, ``--confcutdir``, ``--import-mode``, ``--junitxml``, pytest-cov's ``--cov``, ...), the paths of
  ``-c``, ``--rootdir``, ``--confcutdir`` and ``--cov-config`` under its tree. Its other guarded options follow the rule above.
* Any other long option is taken as one a ``conftest.py`` under the test root defines (the README's
  ``["--batch-size", "4"]``) and passed on. pytest cannot tell us whether it takes a value, so the
  token after it, when not itself an option, is checked as a path; give such a value as
  ``--name=value`` to pass it unchecked.

Paths (test paths, the values of ``-c``, ``--rootdir``, ``--confcutdir``, ``--ignore``) are relative
to the test root; :func:`rebase_test_paths` rewrites them for a pytest that runs in a directory
below it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

ALLOW_TEST_OPTIONS_FLAG = "--allow-test-options"
OWN_PLUGIN = "distributed_testing"  # the pytest11 entry point name in pyproject.toml
OWN_OPTION_PREFIX = "--dt-"
_NEGATIVE = re.compile(r"-\d+(?:\.\d*)?|-\.\d+")

SAFE_FLAGS = frozenset({
    "-x", "--exitfirst", "--strict-config", "--strict-markers", "--strict", "-s", "--runxfail",
    "-v", "--verbose", "-q", "--quiet", "--no-header", "--no-summary", "--no-fold-skipped",
    "--force-short-summary", "--disable-warnings", "--disable-pytest-warnings", "-l", "--showlocals",
    "--no-showlocals", "--fulltrace", "--full-trace", "--collectonly", "--collect-only", "--co",
    "--continue-on-collection-errors", "--doctest-modules", "--doctest-ignore-import-errors",
    "--doctest-continue-on-failure", "--setuponly", "--setup-only", "--setupshow", "--setup-show",
    "--setupplan", "--setup-plan", "--fixtures", "--funcargs", "--fixtures-per-test", "--markers",
})
SAFE_VALUED = frozenset({
    "-k", "-m", "--maxfail", "--durations", "--durations-min", "--verbosity", "-r", "--report-chars",
    "--tb", "--xfail-tb", "--show-capture", "--color", "--code-highlight", "--capture", "--max-warnings",
    "--doctest-report", "--log-level", "--log-cli-level", "--log-format", "--log-date-format",
    "--log-cli-format", "--log-cli-date-format", "--log-auto-indent", "--log-disable",
    "--timeout", "--timeout-method",  # pytest-timeout
})
PATH_VALUED = frozenset({"--ignore", "--ignore-glob", "--deselect", "--doctest-glob"})
# option -> whether it takes a value (``--debug`` takes an optional one: the next token counts)
GUARDED: dict[str, bool] = {
    "--debug": True, "--junitxml": True, "--junit-xml": True, "--junitprefix": True, "--junit-prefix": True,
    "--resultlog": True, "--result-log": True, "--report-log": True, "-p": True, "-c": True,
    "--config-file": True, "--inifile": True, "--rootdir": True, "--confcutdir": True, "--basetemp": True,
    "-o": True, "--override-ini": True, "--pyargs": False, "--import-mode": True, "--noconftest": False,
    "--keepduplicates": False, "--keep-duplicates": False, "--collect-in-virtualenv": False,
    "-W": True, "--pythonwarnings": True, "--assert": True, "--pdb": False, "--pdbcls": True, "--trace": False,
    "--lf": False, "--last-failed": False, "--ff": False, "--failed-first": False, "--nf": False,
    "--new-first": False, "--lfnf": True, "--last-failed-no-failures": True, "--cache-show": False,
    "--cache-clear": False, "--sw": False, "--stepwise": False, "--sw-skip": False, "--stepwise-skip": False,
    "--sw-reset": False, "--stepwise-reset": False, "--pastebin": True, "--disable-plugin-autoload": False,
    "--traceconfig": False, "--trace-config": False, "-V": False, "--version": False, "-h": False, "--help": False,
    "--log-file": True, "--log-file-mode": True, "--log-file-level": True, "--log-file-format": True,
    "--log-file-date-format": True,
    "--cov": True, "--cov-report": True, "--cov-config": True, "--cov-append": False, "--cov-context": True,
    "--html": True, "--css": True, "--self-contained-html": False, "--json-report": False,
    "--json-report-file": True,
}
# guarded options a shipped tree may use (it runs in the bundle sandbox, where they act on that
# run alone); the paths of TREE_PATHS must lie in the tree
SANDBOXED = frozenset({
    "-p", "-o", "--override-ini", "-W", "--pythonwarnings", "-c", "--config-file", "--inifile", "--rootdir",
    "--confcutdir", "--import-mode", "--noconftest", "--keepduplicates", "--keep-duplicates",
    "--collect-in-virtualenv", "--assert", "--pyargs", "--disable-plugin-autoload",
    # pytest-json-report: the plugin's shipped runs make its details there (their file: none)
    "--json-report", "--json-report-file",
    # junitxml: the plugin's shipped runs turn it on there (file /dev/null) so its fixtures act alike
    "--junitxml", "--junit-xml",
    # pytest-cov: the run's coverage is measured where its tests run, its data written in the task's tree
    "--cov", "--cov-report", "--cov-config", "--cov-context",
})
TREE_PATHS = frozenset({"-c", "--config-file", "--inifile", "--rootdir", "--confcutdir", "--cov-config"})
REBASED = TREE_PATHS | {"--ignore"}  # their values are paths, given relative to the test root


def parse_test_options(text: str, source: str) -> tuple[str, ...]:
    """``--allow-test-options``: a comma-separated list of :data:`GUARDED` option names, with or
    without their dashes (``junitxml,p`` is ``--junitxml,-p``)."""
    items = [_dashed(o.strip()) for o in text.split(",") if o.strip()]
    for item in items:
        if item not in GUARDED:
            known = ", ".join(sorted(GUARDED))
            raise ConfigError(f"{source}: {item!r} is not a guarded pytest option (safe options need no "
                              f"permission; guarded ones: {known})")
    return tuple(dict.fromkeys(items))


def _dashed(name: str) -> str:
    """``junitxml`` -> ``--junitxml``, ``p`` -> ``-p`` (a value starting with '-' needs
    ``--allow-test-options=...`` on a command line); dashed names are kept."""
    if name.startswith("-"):
        return name
    return f"-{name}" if len(name) == 1 else f"--{name}"


def bad_test_file(test_file: str) -> str | None:
    """Why ``test_file`` cannot be handed to pytest as its first argument (None: it can): one
    starting with '-' or '@' would be read as an option or an argument file."""
    if test_file.startswith(("-", "@")):
        return f"test_file {test_file!r} starts with {test_file[0]!r}: pytest would read it as an option or a file of arguments"
    return None


def path_error(root: Path | None, arg: str, what: str) -> str | None:
    """Why test path ``arg`` (``path`` or ``path::node``) is refused under ``root`` (None: allowed).
    With ``root`` None (the coordinator, which does not know the root) only lexical checks run."""
    part = arg.partition("::")[0]
    if "\0" in part:
        return f"{what} {arg!r} holds a NUL byte"
    if root is None:
        norm = os.path.normpath(part) if part else "."
        if norm == ".." or norm.startswith("../"):
            return f"{what} {arg!r} climbs out of the test root with '..'"
        return None
    try:
        candidate = (root / part).resolve()
    except (OSError, ValueError) as exc:
        return f"{what} {arg!r} cannot be resolved under the test root {root}: {exc}"
    if not candidate.is_relative_to(root):
        return f"{what} {arg!r} resolves to {candidate}, outside the test root {root}"
    return None


@dataclass(frozen=True)
class _Arg:
    """One argument of ``test_args`` as pytest reads it. ``kind``: ``path`` (a positional),
    ``maybe`` (a bare token after an option pytest's core does not know: its value or a path),
    ``option`` (``name``, with ``value`` or None for a flag), ``own`` (a ``--dt-*`` option),
    ``short`` (an unknown short option). ``at``: the index of the token holding ``value``,
    ``prefix``: what precedes the value in that token (``--rootdir=``, ``-c``, or "")."""

    kind: str
    name: str = ""
    value: str | None = None
    at: int = -1
    prefix: str = ""


def _scan(tokens: Sequence[str]) -> Iterator[_Arg]:
    """The arguments of ``tokens`` in order; ``@FILE`` tokens are left out (refused by the caller)."""
    i = 0
    positional_only = False
    unknown_before = False  # the previous token was an option pytest's core does not know
    while i < len(tokens):
        token = tokens[i]
        maybe, unknown_before = unknown_before, False
        i += 1
        if token.startswith("@"):
            continue
        if positional_only and token.startswith("-p"):  # pytest's preparse ignores '--'
            if token == "-p":
                value, i = (tokens[i], i + 1) if i < len(tokens) else (None, i)
                yield _Arg("option", "-p", value, i - 1 if value is not None else -1)
            else:
                yield _Arg("option", "-p", token[2:], i - 1, "-p")
        elif positional_only or token == "-" or not token.startswith("-"):
            yield _Arg("maybe" if maybe else "path", value=token, at=i - 1)
        elif token == "--":
            positional_only = True
        elif token.startswith("--"):
            arg, i = _long_option(tokens, i, token)
            unknown_before = arg.kind == "option" and arg.name not in KNOWN and arg.value is None
            yield arg
        else:
            args, i = _short_options(tokens, i, token)
            yield from args


KNOWN = SAFE_FLAGS | SAFE_VALUED | PATH_VALUED | GUARDED.keys()


def _valued(name: str) -> bool:
    return name in SAFE_VALUED or name in PATH_VALUED or GUARDED.get(name, False)


def _value(tokens: Sequence[str], i: int) -> tuple[str | None, int]:
    """The value token at ``i`` and the index after it. Like argparse, a token that looks like an
    option (other than a negative number) is never taken as a value: it is checked on its own."""
    if i < len(tokens) and (not tokens[i].startswith("-") or _NEGATIVE.fullmatch(tokens[i])):
        return tokens[i], i + 1
    return None, i


def _long_option(tokens: Sequence[str], i: int, token: str) -> tuple[_Arg, int]:
    name, eq, value = token.partition("=")
    if name.startswith(OWN_OPTION_PREFIX):
        return _Arg("own", name), i
    if eq:
        return _Arg("option", name, value, i - 1, name + "="), i
    if not _valued(name):
        return _Arg("option", name), i
    found, after = _value(tokens, i)
    return _Arg("option", name, found, i if found is not None else -1), after


def _short_options(tokens: Sequence[str], i: int, token: str) -> tuple[list[_Arg], int]:
    out: list[_Arg] = []
    for j in range(1, len(token)):
        option = "-" + token[j]
        rest = token[j + 1:]
        if option not in KNOWN:
            return [*out, _Arg("short", option, token)], i
        if not _valued(option):
            out.append(_Arg("option", option))
            continue
        if rest:
            return [*out, _Arg("option", option, rest, i - 1, token[:j + 1])], i
        found, after = _value(tokens, i)
        return [*out, _Arg("option", option, found, i if found is not None else -1)], after
    return out, i


def refused_test_args(args: Sequence[str], allowed: Iterable[str] = (), root: Path | None = None, *,
                      bundle: bool = False) -> list[str]:
    """Every refused argument of ``args`` with the reason, in order (empty: all allowed).

    ``allowed`` holds the :data:`GUARDED` options the worker permits; ``root`` is the resolved test
    root (None at submit: guarded options and absolute paths are then left to the worker).
    ``bundle``: the task runs a shipped tree in the bundle sandbox, where the options of
    :data:`SANDBOXED` are allowed too (their paths under ``root``)."""
    permitted = frozenset(allowed) | (SANDBOXED if bundle else frozenset())
    # pytest expands '@FILE' wherever it stands, option values included, before parsing
    errors = [f"test_args {t!r}: an argument starting with '@' makes pytest read arguments from that file"
              for t in args if t.startswith("@")]
    for a in _scan(args):
        if a.kind in ("path", "maybe"):
            _add(errors, path_error(root, str(a.value), "test path"))
        elif a.kind == "own":
            errors.append(f"test_args {a.name!r}: the options of distributed_testing's own pytest plugin are not "
                          "available to test tasks (the plugin is disabled in them)")
        elif a.kind == "short":
            errors.append(f"test_args {a.value!r}: {a.name} is not a pytest option a test task may pass")
        elif a.name in PATH_VALUED or (bundle and a.name in TREE_PATHS):
            if a.value is not None:
                _add(errors, path_error(root, a.value, f"{a.name} path"))
        if a.name in GUARDED and a.kind == "option":
            _guarded(a.name, permitted, root, errors)
    return errors


# In a node id's part after '::', the path of the tree where the test runs: a test whose id holds
# its tree's absolute path (a parametrize over data files, ``ids=str``) has another id on each
# machine, so the pytest plugin sends such an id with its local root as this mark
TREE_MARK = "{dt-tree}"


def rebase_test_paths(args: Sequence[str], root: Path, cwd: Path) -> list[str]:
    """``args`` for a pytest that runs in ``cwd`` (under ``root``): each relative test path, and
    the value of each option of :data:`REBASED`, given relative to ``root``, made relative to
    ``cwd``; :data:`TREE_MARK` in a node id becomes ``root``. A bare token after an option
    pytest's core does not know may be that option's value and is left as it is (give such values
    as ``--name=value``)."""
    out = [_placed(a, root) for a in args]
    if cwd == root:
        return out
    for a in _scan(out):
        if a.value is not None and (a.kind == "path" or (a.kind == "option" and a.name in REBASED)):
            out[a.at] = a.prefix + _rebase(a.value, root, cwd)
    return out


def _placed(arg: str, root: Path) -> str:
    """``arg`` with :data:`TREE_MARK` in its node id's part replaced by ``root``."""
    path, sep, node = arg.partition("::")
    return path + sep + node.replace(TREE_MARK, str(root)) if sep and TREE_MARK in node else arg


def _rebase(arg: str, root: Path, cwd: Path) -> str:
    path, sep, node = arg.partition("::")
    if os.path.isabs(path) or not path:
        return arg
    return os.path.relpath(root / path, cwd) + sep + node


def _add(errors: list[str], error: str | None) -> None:
    if error is not None:
        errors.append(f"test_args: {error}")


def _guarded(name: str, permitted: frozenset[str], root: Path | None, errors: list[str]) -> None:
    """Records why guarded option ``name`` may not run, unless it may."""
    if name in permitted or root is None:
        return
    errors.append(f"test_args {name!r}: pytest option {name} writes files, loads code or changes pytest's "
                  f"configuration, and this worker does not allow it (its operator can, with "
                  f"{ALLOW_TEST_OPTIONS_FLAG} {name})")
