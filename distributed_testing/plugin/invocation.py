"""Which of the local pytest invocation travels with each test task, so the workers' pytest runs
as the local one would.

The options come from ``PYTEST_ADDOPTS`` and the command line, read with the local pytest's own
parser (so a conftest's or a plugin's option is known with its value); ``PYTEST_PLUGINS``
becomes ``-p`` options and ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` ``--disable-plugin-autoload``. Each
option, by its ``dest``:

* **Sent** (:data:`SENT`): those that change what runs or how: ``-p`` (not this plugin, nor
  ``no:cacheprovider`` to the workers' own tree, where ``-p`` needs their operator's leave), ``-o``,
  ``-W``, ``--import-mode``, ``-m``, ``-k``,
  ``--strict-markers``, ``--confcutdir``, the doctest options, ``--tb``/``-l`` (the traceback is
  built where the test runs), ``--log-level``, ``--log-cli-level`` (the level the tests' log
  records are captured at there, which the replay prints as live logs), and the local verbosity
  as ``--verbosity=N``, always (assertion diffs depend on it, and so does what pytest's subtests
  write into a test's captured output). An option this list does not know (a conftest's, a plugin's)
  is sent too, always as ``--name=value``; a value that is an absolute path inside the tree is
  sent relative to where the task's pytest runs, one outside it is refused.
* **Ignored paths** (:data:`IGNORES`): ``--ignore`` (relative to the tree) and ``--ignore-glob``:
  the run's sessions collect the run's paths (as pytest did here) before they take the chunks'
  tests, and must leave out what pytest left out here (an ignored folder's conftest, whose hooks
  would act on every test, and modules imported for nothing); one outside the tree is dropped
  (the workers have nothing there to ignore).
* **Local** (:data:`LOCAL`): output, reporting, selection already made here (``-x``, ``--lf``,
  ``--deselect``, paths) and the files a report writes (``--junitxml``, ``--report-log``,
  ``--log-file``, ``--debug``, ``--basetemp``, ``--pastebin``), and ``-o cache_dir=...`` (the
  cache, where the plugin keeps the tests' durations): they act here, on the replayed reports, or
  not at all; never sent. A shipped run with ``--junitxml`` sends ``--junitxml=/dev/null``: the
  XML is written here, but the fixtures junitxml changes where the test runs (``record_property``
  warns under ``junit_family=xunit2``) act there as here.
* **Coverage** (:data:`COVERAGE`): where pytest-cov measures the run and travels with it (a
  shipped tree with its environment), ``--cov``, ``--cov-branch``, ``--cov-config`` (a path in the
  tree), ``--cov-context`` and ``--no-cov`` are sent, with ``--cov-report=`` (no report there):
  the workers' sessions measure and the plugin combines their data here (:mod:`.coverage`).
  Otherwise they are local like pytest-cov's other options.
* **Settled here** (:func:`_settled`): pytest-randomly's seed, as it resolved here (the one its
  header prints), and pytest-json-report's ``--json-report`` (its details are made where the
  test runs; the workers write no file), where the environment travels.
* **Benchmarks** (pytest-benchmark): they run disabled on the fleet, as pytest-benchmark turns
  itself off under pytest-xdist (``--benchmark-disable`` is sent where the environment travels:
  each benchmarked function runs once, untimed). Timings taken on other machines would not
  compare with those here, and its table, ``--benchmark-json``, ``--benchmark-autosave`` and
  ``--benchmark-compare-fail`` act on the benchmarks of this process, which runs none; the plugin
  says so at the end of a run that had any (:func:`benchmarks_active`). ``--benchmark-only``
  (which runs nothing but benchmarks) is refused.
* **Refused** (:data:`REFUSED`): the debugger options, which need the terminal of the process
  that runs the test, and ``--setup-show`` / ``--setup-only``, whose lines pytest prints there
  (``--setup-plan`` sets nothing up: pytest does it here, shipping nothing). A refusal is a
  :class:`pytest.UsageError` raised before anything is sent.

Paths (``-c``, ``--rootdir``, ``--confcutdir``) are sent relative to the tree (``root``: the
workers' test root or the shipped bundle); one outside it is refused. A shipped tree also pins
the configuration: the task gets the local ``--rootdir`` and ``-c`` with the ini file pytest read
here, which must be in the bundle (not outside the tree, not left out by ``.gitignore`` or
``.dtignore``), so markers, ``filterwarnings`` and ``addopts`` come from the same file, and the
workers report the local node ids. The task's pytest runs in the local invocation directory's
place in the tree (``cwd``; the tree's root when it lies outside).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..bundles.ignore import Rules
from ..tasks.pytest_args import OWN_OPTION_PREFIX, OWN_PLUGIN

SENT = frozenset({
    "plugins", "override_ini", "pythonwarnings", "importmode", "markexpr", "keyword", "strict", "strict_config",
    "strict_markers", "runxfail", "noconftest", "keepduplicates", "collect_in_virtualenv", "assertmode",
    "disable_plugin_autoload", "doctestmodules", "doctestglob", "doctestreport", "doctest_ignore_import_errors",
    "doctest_continue_on_failure", "tbstyle", "showlocals", "fulltrace", "log_level", "log_cli_level", "log_format",
    "log_date_format", "log_auto_indent", "logger_disable",
    "inifilename", "rootdir", "confcutdir",
})
LOCAL = frozenset({
    "verbose", "reportchars", "color", "code_highlight", "capture", "showcapture", "durations", "durations_min",
    "disable_warnings", "max_warnings", "no_header", "no_summary", "fold_skipped", "force_short_summary",
    "xfail_tb", "collectonly", "maxfail", "lf", "failedfirst", "newfirst", "last_failed_no_failures",
    "cacheshow", "cacheclear", "stepwise", "stepwise_skip", "stepwise_reset", "deselect", "pyargs",
    "continue_on_collection_errors", "basetemp", "debug", "xmlpath", "junitprefix", "reportlog",
    "log_file", "log_file_level", "log_file_format", "log_file_date_format", "log_file_mode",
    "log_cli_format", "log_cli_date_format", "pastebin", "traceconfig", "setupplan", "showfixtures",
    "show_fixtures_per_test", "markers", "version", "help",
    # plugins whose options act in this process: pytest-xdist, pytest-cov, pytest-html, pytest-json-report
    "numprocesses", "maxprocesses", "dist", "tx", "px", "maxworkerrestart", "distload", "loadscopereorder",
    "looponfail", "rsyncdir", "rsyncignore", "cov_source", "cov_report", "cov_config", "no_cov_on_fail",
    "no_cov", "cov_fail_under", "cov_append", "cov_branch", "cov_context", "cov_precision", "htmlpath", "css",
    "self_contained_html", "json_report", "json_report_file", "json_report_indent", "json_report_omit",
    "json_report_summary", "json_report_verbosity",
    # pytest-benchmark's saving, comparing and display: they act on this process's benchmarks (the
    # fleet runs them disabled: BENCHMARK_OFF)
    "benchmark_save", "benchmark_autosave", "benchmark_save_data", "benchmark_json", "benchmark_compare",
    "benchmark_compare_fail", "benchmark_histogram", "benchmark_storage", "benchmark_cprofile_dump",
    "benchmark_columns", "benchmark_sort", "benchmark_group_by", "benchmark_name",
})
REFUSED = {"usepdb": "--pdb", "usepdb_cls": "--pdbcls", "trace": "--trace",
           # pytest prints what they show from the process that sets the fixtures up, not in the reports
           "setupshow": "--setup-show", "setuponly": "--setup-only"}
LOCAL_INI = frozenset({"cache_dir"})  # ``-o`` keys of what acts here: the cache (each task's is its own)
TREE_OPTIONS = {"inifilename": "--config-file", "rootdir": "--rootdir", "confcutdir": "--confcutdir",
                "cov_config": "--cov-config"}
# pytest-cov's options that say what to measure: sent with ``coverage`` (the run's coverage is
# measured on the workers and combined here: :mod:`.coverage`), else local like its others
COVERAGE = frozenset({"cov_source", "cov_branch", "cov_config", "cov_context", "no_cov"})
IGNORES = {"ignore": "--ignore", "ignore_glob": "--ignore-glob"}
RANDOMLY_SEED = "randomly_seed"  # pytest-randomly's seed: sent as it resolved here (_settled)
BENCHMARK_OFF = "--benchmark-disable"  # pytest-benchmark on the fleet, as under pytest-xdist (benchmarks_active)
NO_CACHE = "no:cacheprovider"


@dataclass(frozen=True)
class Invocation:
    """What each task carries of the local invocation: ``args`` (options for ``test_args``, each
    value attached to its option), ``cwd`` (the invocation directory relative to the tree; None:
    its root) and ``local_ids`` (the workers' pytest has the local rootdir, so its node ids are
    the local ones)."""

    args: tuple[str, ...] = ()
    cwd: str | None = None
    local_ids: bool = False
    safe_path: bool = False  # the local pytest started without its directory first on sys.path
    write_bytecode: bool = True  # the local pytest writes byte code (no -B, no PYTHONDONTWRITEBYTECODE)


def started_safe(here: Path) -> bool:
    """Whether this pytest started without its working directory ``here`` first on ``sys.path``:
    the ``pytest`` command (a console script: its own folder is first), or Python's ``-P``. ``python
    -m pytest`` and ``python -c`` put the directory they start in there, and a script calling
    ``pytest.main()`` its own folder (which may be ``here``)."""
    if sys.flags.safe_path:
        return True
    main = sys.argv[0] if sys.argv else ""
    if main in ("", "-c") or Path(main).name == "__main__.py":
        return False
    return Path(main).resolve().parent != here.resolve()


def invocation(config: pytest.Config, root: Path, env: Mapping[str, str], *, shipped: bool,
               coverage: bool = False) -> Invocation:
    """The :class:`Invocation` of this pytest run for tasks that run ``root`` (the tree; shipped
    as a bundle when ``shipped``). ``coverage``: pytest-cov measures this run and travels with it,
    so its options of :data:`COVERAGE` go too, with ``--cov-report=`` (the report is made here).
    Raises :class:`pytest.UsageError` for what cannot travel."""
    if getattr(config.option, "benchmark_only", False):  # from the command line or an ini's addopts
        raise pytest.UsageError("distributed_testing: --benchmark-only runs nothing but pytest-benchmark's benchmarks, "
                                "and the fleet runs them disabled, as pytest-xdist does (timings taken on other "
                                "machines would not compare with this one's): run it without --dt-coordinator")
    root = root.resolve()
    here = Path(config.invocation_params.dir).resolve()
    cwd = _inside(here, root)
    base = here if cwd is not None else root  # where the task's pytest resolves a relative value
    tokens = [*shlex.split(env.get("PYTEST_ADDOPTS", "")), *config.invocation_params.args]
    args: list[str] = []
    seeded = False  # pytest-randomly's seed given: sent as it resolved here (_settled)
    for option, action, value in _options(tokens, _actions(config)):
        dest = action.dest
        if dest == RANDOMLY_SEED:
            seeded = True
            continue
        if dest in COVERAGE and not coverage:
            continue
        if option.startswith(OWN_OPTION_PREFIX) or (dest in LOCAL and dest not in COVERAGE) or (
                shipped and dest in ("inifilename", "rootdir")):
            continue
        if dest == "override_ini" and str(value).partition("=")[0].strip() in LOCAL_INI:
            continue
        if dest in REFUSED:
            raise pytest.UsageError(f"distributed_testing: {option} needs the terminal of the process that runs "
                                    "the test, and the tests run on the fleet (run without --dt-coordinator to debug)")
        if dest in TREE_OPTIONS:
            rel = _tree_path(option, here / str(value), root)
            if not (dest == "rootdir" and rel == "."):  # the workers' own rootdir
                args.append(f"{TREE_OPTIONS[dest]}={rel}")
        elif dest in IGNORES:
            args += _ignored(IGNORES[dest], here / str(value), root, base, glob=dest == "ignore_glob")
        elif dest == "plugins":
            args += _plugin_args(str(value), shipped)
        else:
            args.append(_attached(option, action, value, dest in SENT, root, base))
    for name in filter(None, (p.strip() for p in env.get("PYTEST_PLUGINS", "").split(","))):
        args += _plugin_args(name, shipped)
    if env.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        args.append("--disable-plugin-autoload")
    args += _settled(config, seeded, travels=shipped and not config.getoption("--dt-no-env", False))
    if shipped and getattr(config.option, "xmlpath", None):
        # the file is written here; junitxml active there makes its fixtures act alike
        # (record_property warns under xunit2, record_xml_attribute is experimental)
        args.append(f"--junitxml={os.devnull}")
    if coverage:
        args.append("--cov-report=")
    # always: the workers' pytest is -q by default, and what a test captures can depend on it
    # (pytest's subtests write their progress letters into the test's output at -q, not at 0)
    args.append(f"--verbosity={int(getattr(config.option, 'verbose', 0) or 0)}")
    local_ids = False
    if shipped:
        pinned, local_ids = _pinned_config(config, root)
        args = pinned + args
    return Invocation(tuple(args), None if cwd in (None, ".") else cwd, local_ids, started_safe(here),
                      not sys.dont_write_bytecode)


def _settled(config: pytest.Config, seeded: bool, *, travels: bool) -> list[str]:
    """What plugins settled here that the workers must do alike: pytest-randomly's seed as it
    resolved here (``default`` and ``last`` pick one here; the workers reseed each test with it, as
    pytest-xdist's workers get their main's), and pytest-json-report's ``--json-report`` (its
    per-stage streams, log records and ``json_metadata`` are made where the test runs and travel
    in its reports; the workers write no file). Sent where the environment, which carries the
    plugins, ``travels``, and a seed given here always."""
    out = []
    seed = getattr(config.option, RANDOMLY_SEED, None)
    if isinstance(seed, int) and not isinstance(seed, bool) and config.pluginmanager.hasplugin("randomly") \
            and (seeded or travels):
        out.append(f"--randomly-seed={seed}")
    if getattr(config.option, "json_report", False) is True and travels:
        out += ["--json-report", "--json-report-file=none"]
    if benchmarks_active(config) and travels:
        out.append(BENCHMARK_OFF)
    return out


def benchmarks_active(config: pytest.Config) -> bool:
    """Whether pytest-benchmark is loaded here and would time this run's benchmarks (neither
    ``--benchmark-disable`` nor ``--benchmark-skip``): the fleet runs them disabled."""
    option = config.option
    if not hasattr(option, "benchmark_disable"):
        return False
    disabled = option.benchmark_disable and not getattr(option, "benchmark_enable", False)
    return not disabled and not getattr(option, "benchmark_skip", False)


def _actions(config: pytest.Config) -> Mapping[str, argparse.Action]:
    """Option string -> argparse action of the local pytest's parser (pytest's, its plugins' and
    the conftests' options)."""
    parser = getattr(getattr(config, "_parser", None), "optparser", None)
    actions = getattr(parser, "_option_string_actions", None)
    if not isinstance(actions, dict):
        raise pytest.UsageError("distributed_testing: this pytest's option parser cannot be read to pass the "
                                f"local options on (pytest {pytest.__version__})")
    return actions


def _options(tokens: Sequence[str], actions: Mapping[str, argparse.Action]
             ) -> Iterator[tuple[str, argparse.Action, str | None]]:
    """(option, action, value) for each option in ``tokens``, read as argparse reads them; paths and
    the tokens after ``--`` are left out."""
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token == "--":
            return
        if token.startswith("@"):
            raise pytest.UsageError(f"distributed_testing: {token}: arguments read from a file are not passed on to "
                                    "the fleet; give them on the command line")
        if not token.startswith("-") or token == "-" or token not in actions and _looks_negative(token):
            continue
        name, eq, attached = token.partition("=")
        if eq and name in actions:
            yield name, actions[name], attached
            continue
        if token in actions:
            action = actions[token]
            value, i = _value(tokens, i, action)
            yield token, action, value
            continue
        j = 1  # a cluster of short options: -vx, -kEXPR, -pno:NAME
        while not token.startswith("--") and j < len(token):
            option = "-" + token[j]
            short = actions.get(option)
            if short is None:  # pytest accepted this command line, so this is not an option
                break
            rest = token[j + 1:]
            if short.nargs == 0:
                yield option, short, None
                j += 1
                continue
            if rest:
                yield option, short, rest
            else:
                value, i = _value(tokens, i, short)
                yield option, short, value
            break


def _looks_negative(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _value(tokens: Sequence[str], i: int, action: argparse.Action) -> tuple[str | None, int]:
    if action.nargs == 0:
        return None, i
    if action.nargs == "?" and (i >= len(tokens) or tokens[i].startswith("-")):
        return None, i
    return (tokens[i], i + 1) if i < len(tokens) else (None, i)


def _plugin_args(name: str, shipped: bool) -> list[str]:
    """``-p NAME`` unless NAME is this plugin, or ``no:cacheprovider`` to the workers' own tree
    (where ``-p`` needs their operator's leave; their tasks' cache is their own all the same)."""
    plugin = name.strip().removeprefix("no:")
    if plugin == OWN_PLUGIN or plugin.startswith(OWN_PLUGIN + ".") or (name.strip() == NO_CACHE and not shipped):
        return []
    return ["-p", name.strip()]


def _ignored(option: str, path: Path, root: Path, base: Path, *, glob: bool) -> list[str]:
    """``--ignore`` (its path relative to the tree, as the worker takes it) or ``--ignore-glob``
    (its pattern relative to ``base``, where the task's pytest runs and matches it from; one above
    ``base`` is not sent: the worker checks such values from the tree's root); nothing for a path
    outside the tree."""
    if glob:  # a pattern: resolve() would read it as a path
        pattern = os.path.relpath(os.path.normpath(path), base)
        return [] if pattern == ".." or pattern.startswith("../") else [f"{option}={pattern}"]
    rel = _inside(path, root)
    return [] if rel is None else [f"{option}={rel}"]


def _attached(option: str, action: argparse.Action, value: str | None, known: bool, root: Path, base: Path) -> str:
    """The option as one token: ``--name=value`` (the long name where it has one), else
    ``-Xvalue``. A value of an option pytest does not name in :data:`SENT` that is an absolute
    path is made relative to ``base`` (where the task's pytest runs), or refused outside ``root``."""
    if value is None:
        return option
    if not known and os.path.isabs(value):
        if _inside(Path(value), root) is None:
            raise pytest.UsageError(f"distributed_testing: {option} {value}: a path outside the tree the workers "
                                    f"run ({root}), which they do not have")
        value = os.path.relpath(value, base)
    longs = [s for s in action.option_strings if s.startswith("--")]
    if option.startswith("--") or longs:
        return f"{option if option.startswith('--') else longs[0]}={value}"
    return option + value


def _inside(path: Path, root: Path) -> str | None:
    """``path`` relative to ``root`` (POSIX; ``.`` for the root), None when outside it."""
    try:
        return path.resolve().relative_to(root).as_posix() or "."
    except ValueError:
        return None


def _tree_path(option: str, path: Path, root: Path) -> str:
    rel = _inside(path, root)
    if rel is None:
        raise pytest.UsageError(f"distributed_testing: {option} {path} lies outside the tree the workers run ({root}); "
                                "give --dt-test-root a directory that holds it")
    return rel


def _pinned_config(config: pytest.Config, root: Path) -> tuple[list[str], bool]:
    """``--rootdir`` and ``-c`` of a shipped tree's tasks: the local rootdir and the file pytest
    read its configuration from (which must be in the bundle), and whether the workers then report
    the local node ids (the rootdir lies in the tree)."""
    args: list[str] = []
    inipath = config.inipath
    if inipath is not None:
        rel = _inside(inipath, root)
        if rel is None:
            raise pytest.UsageError(
                f"distributed_testing: pytest reads its configuration from {inipath}, which is not in the shipped "
                f"tree ({root}): the workers would run without its markers, filterwarnings and addopts; give "
                "--dt-test-root a directory that holds it")
        if (ignored := _left_out(root, rel)) is not None:
            raise pytest.UsageError(
                f"distributed_testing: pytest reads its configuration from {inipath}, which {ignored} leaves out of "
                f"the bundle; re-include it with '!{rel.rsplit('/', 1)[-1]}' in a .dtignore")
        args.append(f"--config-file={rel}")
    rootdir = _inside(config.rootpath, root)
    if rootdir is not None:
        args.append(f"--rootdir={rootdir}")
    return args, rootdir is not None


def _left_out(root: Path, rel: str) -> str | None:
    """Which ignore rules leave ``rel`` (a file under ``root``) out of its bundle, None if shipped."""
    rules = Rules().below(root, "")
    parts = rel.split("/")
    for n in range(1, len(parts)):
        folder = "/".join(parts[:n])
        if rules.ignored(folder, True):
            return f"the ignore rules of {root} (folder {folder}/)"
        rules = rules.below(root, folder)
    return f"the ignore rules of {root}" if rules.ignored(rel, False) else None
