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
* Any other long option is taken as one a ``conftest.py`` under the test root defines (the README's
  ``["--batch-size", "4"]``) and passed on. pytest cannot tell us whether it takes a value, so the
  token after it, when not itself an option, is checked as a path; give such a value as
  ``--name=value`` to pass it unchecked.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
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


def refused_test_args(args: Sequence[str], allowed: Iterable[str] = (), root: Path | None = None) -> list[str]:
    """Every refused argument of ``args`` with the reason, in order (empty: all allowed).

    ``allowed`` holds the :data:`GUARDED` options the worker permits; ``root`` is the resolved test
    root (None at submit: guarded options and absolute paths are then left to the worker)."""
    permitted = frozenset(allowed)
    tokens = list(args)
    # pytest expands '@FILE' wherever it stands, option values included, before parsing
    errors = [f"test_args {t!r}: an argument starting with '@' makes pytest read arguments from that file"
              for t in tokens if t.startswith("@")]
    i = 0
    positional_only = False
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token.startswith("@"):
            continue
        if positional_only and token.startswith("-p"):  # pytest's preparse ignores '--'
            _guarded("-p", permitted, root, errors)
            if token == "-p" and i < len(tokens):
                i += 1  # '-p NAME': NAME is the plugin, not a path
        elif positional_only or token == "-" or not token.startswith("-"):
            _add(errors, path_error(root, token, "test path"))
        elif token == "--":
            positional_only = True
        elif token.startswith("--"):
            i = _long_option(tokens, i, token, permitted, root, errors)
        else:
            i = _short_options(tokens, i, token, permitted, root, errors)
    return errors


def _add(errors: list[str], error: str | None) -> None:
    if error is not None:
        errors.append(f"test_args: {error}")


def _next_value(tokens: list[str], i: int) -> tuple[str | None, int]:
    """The value token at ``i`` and the index after it. Like argparse, a token that looks like an
    option (other than a negative number) is never taken as a value: it is checked on its own."""
    if i < len(tokens) and (not tokens[i].startswith("-") or _NEGATIVE.fullmatch(tokens[i])):
        return tokens[i], i + 1
    return None, i


def _guarded(name: str, permitted: frozenset[str], root: Path | None, errors: list[str]) -> bool:
    """True when guarded option ``name`` may run; else records why not."""
    if name in permitted or root is None:
        return True
    errors.append(f"test_args {name!r}: pytest option {name} writes files, loads code or changes pytest's "
                  f"configuration, and this worker does not allow it (its operator can, with "
                  f"{ALLOW_TEST_OPTIONS_FLAG} {name})")
    return False


def _long_option(tokens: list[str], i: int, token: str, permitted: frozenset[str], root: Path | None,
                 errors: list[str]) -> int:
    name, eq, value = token.partition("=")
    if name.startswith(OWN_OPTION_PREFIX):
        errors.append(f"test_args {name!r}: the options of distributed_testing's own pytest plugin are not available "
                      "to test tasks (the plugin is disabled in them)")
        return i
    if name in SAFE_FLAGS:
        return i
    if name in SAFE_VALUED:
        return i if eq else _next_value(tokens, i)[1]
    if name in PATH_VALUED:
        path: str | None = value
        if not eq:
            path, i = _next_value(tokens, i)
        if path is not None:
            _add(errors, path_error(root, path, f"{name} path"))
        return i
    if name in GUARDED:
        _guarded(name, permitted, root, errors)
        return _next_value(tokens, i)[1] if GUARDED[name] and not eq else i
    return i  # a conftest option; a following bare token is checked as a path by the caller's loop


def _short_options(tokens: list[str], i: int, token: str, permitted: frozenset[str], root: Path | None,
                   errors: list[str]) -> int:
    for j in range(1, len(token)):
        option = "-" + token[j]
        rest = token[j + 1:]
        if option in SAFE_FLAGS:
            continue
        if option in SAFE_VALUED:
            return i if rest else _next_value(tokens, i)[1]
        if option in GUARDED:
            _guarded(option, permitted, root, errors)
            if not GUARDED[option]:
                continue
            return i if rest else _next_value(tokens, i)[1]
        errors.append(f"test_args {token!r}: {option} is not a pytest option a test task may pass")
        return i
    return i
