"""pytest plugin: collect locally, run the tests on the fleet, report them as if they ran here.

Registered through the ``pytest11`` entry point (name ``distributed_testing``); inert unless
``--dt-coordinator URL`` is given. Then, after local collection (so ``-k``, ``-m``, ``--deselect``
and paths select as usual):

* **Spread by test.** The selected tests are cut into chunks, each one ``test`` task. Chunks
  follow collection order (a module's tests stay together, so module and class fixtures run once
  per chunk) and are cut to equal estimated time (duration history: pytest's cache,
  ``distributed_testing/durations``, written after every run). With a shipped tree each worker
  runs the run's chunks in a pytest session it keeps for the run (``config.session``, the run's
  id; ``worker/executors/test_session.py``), which collects once and takes each chunk's node ids,
  so a chunk costs no pytest start: :data:`.plugin.chunks.SESSION_CHUNKS_PER_SLOT` per slot, sent in
  collection order, and a worker that is done takes the next (as pytest-xdist's ``--dist load``
  feeds its workers: each session runs its tests in the order pytest collected them, so a later
  module that changes what an earlier one reads runs after it, as here). With ``--dt-shared-tree`` each chunk is a pytest process
  of its own: one chunk per worker slot with history, without it up to :data:`.plugin.chunks.CHUNKS_PER_SLOT`
  per slot (one per :data:`.plugin.chunks.MIN_CHUNK_TESTS` tests, at least one per slot); a whole module in one
  chunk is sent as its path, otherwise as node ids. In either mode a chunk is cut further where
  its tests' reports would not fit one task's result (:data:`.plugin.chunks.MAX_CHUNK_RESULT_BYTES`).
* **Early and as they come.** From pytest's session start (before its header and collection),
  in threads beside the local collection: the slots and the run are asked for while the
  environment is captured and the bundle uploaded, and with a shipped tree one ``warm`` task per
  slot (``session-RUN-N``, outside the run's tasks) has the workers start their sessions and
  collect the invocation's paths meanwhile; the tests' tasks are sent once pytest has collected;
  a thread per task waits for it on the coordinator (:mod:`.plugin.watch`): a session's chunk's
  tests are reported each as it ends there (``-v`` as xdist prints them), the rest of a chunk
  from its result when it finishes. Nothing is shipped under ``--collect-only``, ``--fixtures``,
  ``--fixtures-per-test``, ``--cache-show`` or ``--setup-plan`` (pytest does them here).
* ``@pytest.mark.dt(hardware="cuda", tags=["gpu-a"])`` (``hardware``: one name or a list)
  becomes the task's ``requirements``, so only workers that meet it run the test; tests with
  different requirements never share a chunk.
* **What runs remotely is what is on disk here.** The tree (``--dt-test-root``, default pytest's
  rootdir) is uploaded as a content-addressed bundle before the tasks are sent (only the files
  the coordinator lacks; ``.gitignore`` and ``.dtignore`` are honoured), and every task carries
  its digest: workers started with ``--accept-bundles`` run it in a fresh read-only tree inside
  their sandbox. That needs a submitter key created with ``--allow-code``. ``--dt-shared-tree``
  sends no files instead: each worker runs the tests from its own ``--test-root``, which must
  hold the same tree (a shared or synchronised checkout).
* **So is the Python environment.** With a shipped tree, every task carries the distributions
  installed where this pytest runs (``name==version``; a local install inside the tree as
  ``./dir``; :mod:`.bundles.environment`) as its ``requirements.python``, and the workers run the
  tests in an environment of that set alone, built once per worker host, also where the tree
  has a ``requirements.txt`` (projects keep one for other uses: glom's pins an older pytest, so
  its shipped run collected other test ids than the local one). ``--dt-no-env`` sends none: the
  workers then install the tree's ``requirements.txt`` if it has one, else run their own Python;
  that file is also what travels where the environment cannot (more distributions than a task
  carries, a local install outside the tree).
* **So is the invocation.** The local options that change what runs or how (``-p``, ``-o``,
  ``-W``, ``-k``, ``-m``, conftest options, ``PYTEST_ADDOPTS``, ...) go with every task, a
  shipped tree's tasks get the local rootdir and ini file, and the tests run from the local
  invocation directory's place in the tree (:mod:`.plugin.invocation`, which also says what stays
  here and what is refused).
  pytest-xdist's ``-n`` (an ini file's ``addopts`` often has it) starts no workers, here or
  there: the fleet takes its place, and its ``--dist loadscope``, ``loadfile`` or ``loadgroup``
  still hold: no chunk cuts such a group (a class, a module, an ``xdist_group``), whose tests
  then run in one worker's session, in order (:mod:`.plugin.chunks`).
  None of this shell's variables travel but ``CI`` and ``BUILD_NUMBER`` (pytest reads them to
  show whole assertion diffs on CI) and ``PYTHONHASHSEED`` (the order of a set of strings, so of
  the tests a suite parametrizes over one, and their ids: without it the workers collected other
  ids than the local run): ``--dt-env NAME[=VALUE]`` (repeatable) sets one for the tests there
  (a test task's ``env``).
* **The report is local pytest's.** Each test's reports come back as pytest serialized them on
  the worker (the form pytest-xdist uses) and are replayed here under the local node id, with the
  local paths: outcome, the remote traceback with its crash line in the short summary, captured
  stdout/stderr/log sections, subtests, xfail reasons and durations; warnings reach the warnings
  summary; ``-v`` names the worker on each test's line and ``--junitxml`` in a ``dt_worker``
  property; the ``<testsuite>`` properties recorded there (``record_testsuite_property``,
  hypothesis's statistics) are in the local report, each name and value once. A task or module
  that failed as a whole is printed once with the tests it took down, each of which is an error
  of one line (:mod:`.plugin.replay`). A node id holding the tree's path runs as the worker's
  own (:func:`.plugin.chunks.portable_id`).
* **What cannot be as here.** Tests are reported as they end on the workers (as with xdist):
  ``-x``, ``--maxfail`` and ``--sw`` stop at the first failure reported here, and what other
  chunks ended meanwhile is reported too (``--sw``'s next run goes on from that failure); ``-s``
  writes each test's output, and live logging (``log_cli``) its log records, when the test is
  reported, not while it runs (the workers capture them); ``--tb=native`` and ``--full-trace``
  show the worker's paths in installed packages' frames; pytest-randomly's seed is the one its
  header prints here, and pytest-json-report's per-stage details come from the workers.
  ``--setup-show`` and ``--setup-only`` are refused (pytest prints their lines where the
  fixtures are set up); ``--setup-plan`` sets nothing up and runs here. A worker running as root
  runs shipped tests as an unprivileged user (its sandbox), so a test that skips for root here
  (one that makes a file unreadable to its owner) runs there.
* **Coverage.** Where pytest-cov measures the run (``--cov``, here or in ``addopts``) and the
  environment travels, the workers' sessions measure the tests and send it back with each
  chunk's result; the plugin writes it beside pytest-cov's data before pytest-cov ends the run,
  so its report, files and ``--cov-fail-under`` are the whole run's (:mod:`.plugin.coverage`).
* **Run control.** On Ctrl-C, ``-x`` / ``--maxfail``, ``--dt-timeout S`` (default 3600: the
  whole wait) or any error, every task this run queued and that has not finished is cancelled.
  A task that no connected worker can run (the coordinator says ``unschedulable``) for
  ``--dt-unschedulable-timeout S`` (default 30) in a row fails its tests with the coordinator's
  reason.

Credentials: ``--dt-api-key`` or ``DT_API_KEY`` (a submitter key or JWT); ``--dt-ca-file`` or
``DT_CA_FILE`` for a private CA. Every HTTP call goes through :class:`Fleet`.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .config import environ
from .errors import ValidationError
from .plugin.chunks import Chunk, dist_scope, plan_chunks, portable_id
from .plugin.fleet import Fleet, _cancel_all, _client, preload
from .plugin.replay import Downed, merge_downed, print_downed, report_live, report_task
from .plugin.watch import Live, News, watch
from .tasks.pytest_marker import DT_MARKER

if TYPE_CHECKING:
    import concurrent.futures

    from .plugin.invocation import Invocation

# Every pytest where this package is installed imports this module (the pytest11 entry point),
# with --dt-coordinator or not: what only a fleet run needs (the HTTP client and its TLS and
# credential code, the bundle upload, the environment's capture) is imported where it is used.

POLL_S = 0.5
MAX_WATCHERS = 32  # tasks waited for at once, each by a thread of its own: at least this many,
MAX_WATCHERS_CAP = 256  # else one per worker slot (each running chunk's tests come live), at most this
MAX_COLLECT = 1000  # arguments a run's sessions are told to collect first, at most
HISTORY_KEY = "distributed_testing/durations"
# set here, they travel: the variables pytest itself reads to tell a CI run (_pytest.assertion.util.
# running_on_ci), so the workers' assertion diffs and short summary are as long as the local run's, and
# Python's hash seed, which orders a set of strings (a parametrize over one: the tests' ids and order)
TRAVEL_WHEN_SET = ("CI", "BUILD_NUMBER", "PYTHONHASHSEED")
DIST = pytest.StashKey[str]()  # pytest-xdist's --dist as given, before the fleet took xdist's place
XDIST_OFF = "--numprocesses=0"  # sent where pytest-xdist travels: a session reading ``addopts = -n 2`` starts no workers
# pytest options under which a session runs no tests (it lists, shows, only collects or, --setup-plan,
# prints the fixtures it would set up without setting any up): nothing is shipped, pytest does it here
NOT_A_RUN = ("collectonly", "showfixtures", "show_fixtures_per_test", "cacheshow", "setupplan")


def seconds(text: str) -> float:
    """``cli.common.seconds`` (an argparse type), imported when an option is given."""
    from .cli.common import seconds as parse

    return parse(text)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("distributed_testing", "run the tests on a distributed_testing fleet")
    group.addoption("--dt-coordinator", metavar="URL", help="run the collected tests on this coordinator's workers (or the comma-separated URLs of an HA group)")
    group.addoption("--dt-api-key", metavar="KEY", help="submitter API key or JWT (env DT_API_KEY)")
    group.addoption("--dt-ca-file", metavar="PATH", help="PEM CA bundle for an https coordinator (env DT_CA_FILE)")
    group.addoption("--dt-test-root", metavar="DIR",
                    help="local directory that the workers' --test-root mirrors (default: the rootdir)")
    group.addoption("--dt-shared-tree", action="store_true",
                    help="ship no files: the workers' --test-root holds the same tree as --dt-test-root "
                         "(default: upload the tree as a bundle; needs an --allow-code key and --accept-bundles workers)")
    group.addoption("--dt-no-env", action="store_true",
                    help="send no Python environment with a shipped tree (default: the distributions installed "
                         "here travel, name==version, and the workers run the tests in that set; with this "
                         "option they install the tree's requirements.txt if it has one, else use their own)")
    group.addoption("--dt-env", action="append", default=[], metavar="NAME[=VALUE]",
                    help="set this environment variable for the tests on the workers, repeatable: NAME=VALUE, or "
                         "NAME for its value here (default: none of this shell's variables travel; a shipped "
                         "tree's tests start from the sandbox's minimum)")
    group.addoption("--dt-run-name", metavar="NAME",
                    help="name the session's run (default: the CI job's, as dt submit --run-name; else "
                         "'pytest <rootdir name>'); the run's line (its dashboard page with DT_DASHBOARD_URL) is printed")
    group.addoption("--dt-timeout", type=seconds, default=3600.0, metavar="S",
                    help="give up waiting for the fleet after S seconds and cancel what is left (default 3600)")
    group.addoption("--dt-unschedulable-timeout", type=seconds, default=30.0, metavar="S",
                    help="fail the tests of a task no connected worker can run after S seconds (default 30)")


@pytest.hookimpl(trylast=True)  # after the plugins' own: what they resolve there (pytest-randomly's seed) travels
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", DT_MARKER)
    if config.getoption("--dt-coordinator"):
        config.pluginmanager.register(FleetRunner(config), "distributed_testing-fleet")


@pytest.hookimpl(hookwrapper=True)
def pytest_cmdline_main(config: pytest.Config) -> Generator[None, None, None]:
    """The fleet takes pytest-xdist's place: with ``--dt-coordinator`` its ``-n`` (often in an ini
    file's ``addopts``) starts no local workers (set to 0 before xdist reads it; else xdist's
    controller collected nothing, and no test ran), and the workers' sessions get ``-n 0`` too
    (:data:`XDIST_OFF`)."""
    if config.getoption("--dt-coordinator") and hasattr(config.option, "numprocesses"):
        config.stash[DIST] = config.option.dist  # its groups still hold: no chunk cuts one (.plugin.chunks)
        config.option.numprocesses = 0
        config.option.dist = "no"
        config.option.distload = False
    yield


def task_env(given: Sequence[str], here: Mapping[str, str], *, shipped: bool) -> dict[str, str]:
    """``--dt-env``'s variables (``NAME=VALUE``, or ``NAME`` for its value in ``here``); a
    :class:`pytest.UsageError` names one that cannot be set."""
    from .tasks.configs import env_errors

    out: dict[str, str] = {}
    for entry in given:
        name, eq, value = entry.partition("=")
        if not eq:
            if name not in here:
                raise pytest.UsageError(f"distributed_testing: --dt-env {name}: not set here (give NAME=VALUE)")
            value = here[name]
        out[name] = value
    if out and not shipped:
        raise pytest.UsageError("distributed_testing: --dt-env sets variables for a shipped tree's tests; with "
                                "--dt-shared-tree the workers' operator sets their environment")
    if shipped:  # what pytest shows (CI) and collects (the hash seed) depends on them
        out.update({name: here[name] for name in TRAVEL_WHEN_SET if name in here and name not in out})
    errors = env_errors(out)
    if errors:
        raise pytest.UsageError(f"distributed_testing: --dt-env {errors[0]}")
    return out


def watchers(tasks: int, slots: int) -> int:
    """Threads that wait for a run's ``tasks`` at once: one per task, at most one per worker slot
    (a chunk's tests come live only while a watcher follows it, and at most ``slots`` chunks run at
    once) but never fewer than :data:`MAX_WATCHERS` nor more than :data:`MAX_WATCHERS_CAP`."""
    return max(1, min(tasks, max(MAX_WATCHERS, min(slots, MAX_WATCHERS_CAP))))


def task_doc(c: Chunk, index: int, run_id: str, maxfail: int = 0, inv: Invocation | None = None,
             session: str | None = None, collect: Sequence[str] = (), *, warm: bool = False,
             root: Path | None = None) -> dict[str, Any]:
    """The chunk's task. ``maxfail`` (``-x`` is 1) stops the chunk's pytest too, so its results
    come back without running the rest of it; ``inv``: the local invocation's options and
    directory (:mod:`.plugin.invocation`); ``session``: the run whose pytest sessions serve it on
    the workers (a shipped tree): its tests go in ``tests``, the options alone in ``test_args``,
    and ``collect`` (:func:`collect_paths`) says what the session collects before any test runs;
    ``warm``: a task that only starts a session (``session-RUN-N``), sent while pytest collects here.
    ``root``: the local tree, whose path in a node id goes as the workers' own (:func:`portable_id`)."""
    # collected here: a module failing to import there must not cost the whole chunk
    flags = ["--continue-on-collection-errors", *([f"--maxfail={maxfail}"] if maxfail > 0 else [])]
    inv = inv or Invocation()
    args = [portable_id(a, root) for a in c.args] if root is not None else c.args
    config: dict[str, Any]
    if session is not None:
        config = {"test_file": args[0], "tests": args[1:], "test_args": [*flags, *inv.args], "session": session,
                  **({"collect": list(collect)} if collect else {}), **({"warm": True} if warm else {})}
    else:  # the paths before the local options: each of those holds its value, so no path reads as one
        config = {"test_file": args[0], "test_args": [*flags, *args[1:], *inv.args]}
    if inv.cwd is not None:
        config["cwd"] = inv.cwd
    if inv.safe_path:  # started as the pytest command: the workers' pytest starts alike
        config["safe_path"] = True
    if session is not None and not inv.write_bytecode:  # -B or PYTHONDONTWRITEBYTECODE here: none there
        config["write_bytecode"] = False
    doc: dict[str, Any] = {"task_id": f"{'session' if warm else 'pytest'}-{run_id}-{index}", "type": "test",
                           "config": config}
    if c.requirements:
        doc["requirements"] = c.requirements
    return doc


def collect_paths(config: pytest.Config, root: Path) -> list[str]:
    """What pytest collected here (its arguments, or ``testpaths``, or the invocation directory),
    relative to ``root``: what each worker's session collects once, before any test runs, as
    pytest does here. Empty (each session collects its first task's tests) where one lies outside
    ``root`` or there are more than :data:`MAX_COLLECT`."""
    here = Path(config.invocation_params.dir)
    out = []
    for arg in config.args:
        part, sep, rest = str(arg).partition("::")
        try:
            rel = (here / part).resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            return []
        out.append(rel + sep + rest)
    return out if len(out) <= MAX_COLLECT else []


def with_fields(doc: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with the fields of ``extra``; ``requirements`` merged (a chunk's ``dt`` marker and
    the environment's ``python``)."""
    out = {**doc, **extra}
    if "requirements" in doc and "requirements" in extra:
        out["requirements"] = {**doc["requirements"], **extra["requirements"]}
    return out


class FleetRunner:
    """Replaces pytest's run loop with submit, wait and report."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        root = config.getoption("--dt-test-root")
        self.root = Path(root) if root else Path(config.rootpath)
        self.partial: set[str] = set()
        self.durations: dict[str, float] = {}
        self.downed: list[Downed] = []
        self.trimmed: list[str] = []  # tasks whose reports were cut to fit a result, and what went
        self.replayed: set[pytest.Item] = set()  # tests reported while their chunk ran
        self.live_seen: dict[str, tuple[Any, dict[str, int]]] = {}  # task id: its attempt, entries per node id
        shipped = not config.getoption("--dt-shared-tree")
        from .plugin.coverage import Combined, measuring
        from .plugin.invocation import invocation

        # pytest-cov measures where the tests run: on the workers, with the environment that carries it
        self.cov_controller = measuring(config)
        travels = shipped and not config.getoption("--dt-no-env")
        self.coverage = Combined(self.root)
        self.invocation = invocation(config, self.root, environ(), shipped=shipped,  # refusals before anything is sent
                                     coverage=self.cov_controller is not None and travels)
        self.task_env = task_env(config.getoption("--dt-env"), environ(), shipped=shipped)
        if travels and config.pluginmanager.hasplugin("xdist"):
            self.invocation = replace(self.invocation, args=(*self.invocation.args, XDIST_OFF))
        self._early: concurrent.futures.ThreadPoolExecutor | None = None
        self.run_ms = f"{int(time.time() * 1000):x}"  # in the tasks' ids
        self.run: dict[str, Any] = {}
        self.warm: list[str] = []  # the tasks that start the workers' sessions early
        self.ran = False
        self.benchmarked = False  # pytest-benchmark's benchmarks were among the tests (run disabled there)
        self._shipping: concurrent.futures.Future[tuple[Fleet, int, dict[str, Any], str | None]]

    @pytest.hookimpl
    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        for item in items:
            try:
                self.partial.add(item.path.resolve().relative_to(self.root.resolve()).as_posix())
            except ValueError:
                continue

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Before pytest collects here (its header not yet printed): ask for the slots and the run,
        capture the environment and upload the tree (what the coordinator already has is not
        sent again), and start the workers' sessions, in threads of their own."""
        option = session.config.option
        if any(getattr(option, name, False) for name in NOT_A_RUN):
            return
        import concurrent.futures

        preload()  # before the threads: pytest walks the loggers as it collects
        fleet = Fleet(_client(self.config))
        self._early = concurrent.futures.ThreadPoolExecutor(2, "dt-ship")
        self._shipping = self._early.submit(self._prepare, fleet)

    def _prepare(self, fleet: Fleet) -> tuple[Fleet, int, dict[str, Any], str | None]:
        shipped = not self.config.getoption("--dt-shared-tree")
        assert self._early is not None
        # the slots and the run beside the upload (which has its own connection): neither needs the other
        asked = self._early.submit(lambda: (fleet.slots(bundle=shipped), self._new_run(fleet)))
        fields, line = self.ship_tree(fleet)
        slots, self.run = asked.result()
        collect = collect_paths(self.config, self.root)
        if "bundle" in fields and collect:  # the workers' sessions start while pytest collects here
            maxfail = int(self.config.getoption("maxfail") or 0)
            # not in the run (a warm task left without a worker, cancelled at the end, is none of its
            # outcome); the session key is the run's all the same: config.session
            warm = [with_fields(task_doc(Chunk({}, args=[collect[0]]), i, self.run_ms, maxfail, self.invocation,
                                         self.run["run_id"], collect, warm=True), fields) for i in range(slots)]
            fleet.submit(self._with_env(warm))
            self.warm = [d["task_id"] for d in warm]
        return fleet, slots, fields, line

    def _with_env(self, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``docs`` with ``--dt-env``'s variables in each test task's config."""
        if self.task_env:
            for d in docs:
                d["config"]["env"] = dict(self.task_env)
        return docs

    def ship_tree(self, fleet: Fleet) -> tuple[dict[str, Any], str | None]:
        """Task fields that make the workers run this tree; merged into every task document:
        ``{"bundle": digest}`` after uploading what the coordinator lacks, with the environment
        (:meth:`environment`) as ``requirements.python``, or nothing with ``--dt-shared-tree``
        (the workers' ``--test-root`` mirrors ``self.root``); with the line that says what was sent."""
        if self.config.getoption("--dt-shared-tree"):
            return {}, None
        from .bundles.upload import UploadError, upload_with_stats

        python = self.environment()  # refused before anything is sent
        try:
            stats = upload_with_stats(fleet.api.base_url, fleet.api.credential, self.root,
                                      ssl_context=fleet.api.ssl_context)
        except UploadError as exc:
            raise pytest.UsageError(f"distributed_testing: uploading {self.root} as a bundle: {exc} "
                                    "(--dt-shared-tree runs the workers' own --test-root instead)") from exc
        except (ValueError, OSError, ValidationError) as exc:  # a symlink loop or leaving the tree, a path too long
            raise pytest.UsageError(f"distributed_testing: {self.root} cannot be shipped: {exc}") from exc
        line = (f"distributed_testing: bundle {stats.digest} ({stats.files} files; uploaded "
                f"{stats.blobs_sent} blobs, {stats.bytes_sent} bytes)")
        return {"bundle": stats.digest, **({"requirements": {"python": python}} if python else {})}, line

    def _new_run(self, fleet: Fleet) -> dict[str, Any]:
        """The session's run (``--dt-run-name``)."""
        from .cli import runs

        env = environ()
        name = runs.run_name(self.config.getoption("--dt-run-name"), env, f"pytest {self.config.rootpath.name}")
        return fleet.start_run(name, runs.ci_labels(env))

    def start_run(self, fleet: Fleet) -> str:
        """The session's run, announced once on the terminal; its id."""
        from .cli import runs

        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            line = runs.run_line(self.run, environ().get("DT_DASHBOARD_URL"), fleet.api.base_url)
            reporter.write_line(f"distributed_testing: {line}")
        return str(self.run["run_id"])

    def environment(self) -> list[str]:
        """The distributions the shipped tasks run in (:mod:`.bundles.environment`); none with
        ``--dt-no-env`` (the worker then reads the tree's own ``requirements.txt``, if any)."""
        if self.config.getoption("--dt-no-env"):
            return []
        from .bundles.environment import LocalInstallError, capture
        from .tasks import pyreqs

        own_file = (self.root / "requirements.txt").is_file()  # used where the environment cannot travel
        try:
            python = capture(self.root)
        except LocalInstallError as exc:
            if own_file:
                return []
            raise pytest.UsageError(f"distributed_testing: the Python environment cannot travel: {exc} "
                                    "(--dt-no-env sends none)") from exc
        if len(python) > pyreqs.MAX_ENTRIES:
            if own_file:
                return []
            raise pytest.UsageError(f"distributed_testing: {len(python)} distributions are installed here, more than "
                                    f"a task may carry ({pyreqs.MAX_ENTRIES}): list what the tests need in a "
                                    "requirements.txt at the tree's root, or pass --dt-no-env")
        return python

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        if session.testsfailed and not session.config.option.continue_on_collection_errors:
            errors = session.testsfailed  # worded as pytest's own loop words it
            raise session.Interrupted(f"{errors} error{'s' if errors != 1 else ''} during collection")
        if any(getattr(session.config.option, name, False) for name in NOT_A_RUN):
            return None  # pytest's own loop, here (it runs nothing)
        if not session.items:
            return True
        from .cli.http import ApiError
        from .plugin.invocation import BENCHMARK_OFF

        # pytest-benchmark's benchmarks among them run disabled there where the invocation says so
        # (plugin/invocation.py, where the environment travels): said at the end
        self.benchmarked = BENCHMARK_OFF in self.invocation.args and any(
            "benchmark" in getattr(item, "fixturenames", ()) for item in session.items)

        try:
            fleet, slots, fields, line = self._shipping.result()
            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None and line is not None:
                reporter.write_line(line)
            self._run(session, fleet, slots, fields)
        except ApiError as exc:
            raise pytest.UsageError(f"distributed_testing: {exc}") from exc
        finally:
            self._save_history()
            if self.cov_controller is not None:  # before pytest-cov's end of the run combines its data files
                said = self.coverage.write(self.cov_controller)
                if said is not None:
                    self.coverage.problems.append(said)
        if session.shouldfail:  # as pytest's own loop ends: -x / --maxfail (exit code 1)
            raise session.Failed(session.shouldfail)
        if session.shouldstop:  # --sw's stop: an interruption (exit code 2, "Interrupted: ...")
            raise session.Interrupted(session.shouldstop)
        return True

    @pytest.hookimpl
    def pytest_unconfigure(self) -> None:
        if self._early is not None:
            self._early.shutdown(wait=True)  # an upload under way when collection failed ends first
        if self.warm and not self.ran:  # collection failed here: the sessions started for it end
            with contextlib.suppress(Exception):
                _cancel_all(Fleet(_client(self.config)), self.warm, quiet=True)

    def _run(self, session: pytest.Session, fleet: Fleet, slots: int, fields: dict[str, Any]) -> None:
        cache = getattr(self.config, "cache", None)  # absent with -p no:cacheprovider
        history = cache.get(HISTORY_KEY, {}) if cache is not None else {}
        shipped = "bundle" in fields
        chunks = plan_chunks(session.items, self.root, slots, history, self.partial, sessions=shipped,
                             scope=dist_scope(self.config.stash.get(DIST, None)))
        run_id = self.run_ms
        run = self.start_run(fleet)
        self.ran = True
        extra = {**fields, "run_id": run}
        maxfail = int(self.config.getoption("maxfail") or 0)
        collect = collect_paths(self.config, self.root) if shipped else []
        docs = [with_fields(task_doc(c, i, run_id, maxfail, self.invocation, run if shipped else None, collect,
                                     root=self.root), extra)
                for i, c in enumerate(chunks)]
        pending = {d["task_id"]: c for d, c in zip(docs, chunks, strict=True)}  # known before the submit returns
        try:
            fleet.submit(self._with_env(docs))
            self._wait_all(session, fleet, pending, slots)
        except BaseException:  # Ctrl-C or an error: nothing this run queued stays queued
            _cancel_all(fleet, [*pending, *self.warm], quiet=True)
            raise
        _cancel_all(fleet, pending, quiet=False)  # -x / --maxfail stopped the run early
        _cancel_all(fleet, self.warm, quiet=True)  # one that never got a worker

    def _wait_all(self, session: pytest.Session, fleet: Fleet, pending: dict[str, Chunk], slots: int) -> None:
        """Report each task as it finishes: a thread per task (up to :func:`watchers` at once)
        waits for it on the coordinator, so a result is replayed when it is there, in the order
        they come."""
        deadline = time.monotonic() + self.config.getoption("--dt-timeout")
        news: News = queue.Queue()
        stop = threading.Event()
        import concurrent.futures

        watching = concurrent.futures.ThreadPoolExecutor(watchers(len(pending), slots), "dt-wait")
        try:
            for task_id in pending:
                watching.submit(watch, fleet, task_id, news, stop, self.config.getoption("--dt-unschedulable-timeout"))
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    for task_id in list(pending):
                        fleet.cancel(task_id)
                        self._report(session, pending.pop(task_id), {"task_id": task_id, "state": "cancelled",
                                                                      "outcome": {"error": "--dt-timeout ran out"}})
                    return
                try:
                    task_id, t = news.get(timeout=min(left, POLL_S))
                except queue.Empty:
                    continue
                if isinstance(t, BaseException):
                    raise t
                if isinstance(t, Live):
                    if task_id in pending:
                        self._report_live(session, task_id, pending[task_id], t)
                elif task_id in pending:
                    self._report(session, pending.pop(task_id), t)
                if session.shouldfail or session.shouldstop:
                    return
        finally:
            stop.set()
            watching.shutdown(wait=False, cancel_futures=True)

    def _ids(self, c: Chunk) -> list[str]:
        """The node ids the workers report the chunk's tests under: the local ones when they have
        the local rootdir, else ids from the tree."""
        return [it.nodeid for it in c.items] if self.invocation.local_ids else c.remote_ids

    def _report_live(self, session: pytest.Session, task_id: str, c: Chunk, live: Live) -> None:
        """Tests of a running chunk that ended there: each reported now, once (:mod:`.plugin.watch`)."""
        ids = self._ids(c)
        items: dict[str, list[pytest.Item]] = {}  # a node id may name several items (report_live)
        for k, it in zip(ids, c.items, strict=True):
            items.setdefault(k, []).append(it)
        attempt, seen = self.live_seen.get(task_id, (live.attempt, {}))
        if attempt != live.attempt:  # a retry's entries start again at its first test
            seen = {}
        self.live_seen[task_id] = (live.attempt, seen)
        durations: dict[str, float] = {}
        done = report_live(items, seen, self.replayed, live.tests, live.worker, live.tree, self.root, durations,
                           lambda: bool(session.shouldfail or session.shouldstop))
        self.replayed.update(done)
        by_id = dict(zip(ids, c.remote_ids, strict=True))
        self.durations.update({by_id[k]: v for k, v in durations.items()})  # history is keyed by tree path

    def _report(self, session: pytest.Session, c: Chunk, task: dict[str, Any]) -> None:
        """A finished chunk: each test not reported live, from its result."""
        ids = self._ids(c)
        durations: dict[str, float] = {}
        merge_downed(self.downed, report_task(list(zip(c.items, ids, strict=True)), task, self.root, durations,
                                              lambda: bool(session.shouldfail or session.shouldstop), self.replayed))
        output = (task.get("result") or {}).get("output") or {}
        if self.cov_controller is not None:
            self.coverage.add(str(task["task_id"]), output)
        trimmed = output.get("reports_trimmed")
        if isinstance(trimmed, str):  # its reports were cut to fit one result (worker/executors/test.py)
            self.trimmed.append(f"task {task['task_id']}: {trimmed}")
        by_id = dict(zip(ids, c.remote_ids, strict=True))
        self.durations.update({by_id[k]: v for k, v in durations.items()})  # history is keyed by tree path

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        print_downed(terminalreporter, self.downed)
        for line in self.trimmed:
            terminalreporter.write_line(f"distributed_testing: {line}")
        if self.ran:
            for line in self.coverage.lines(self.cov_controller):
                terminalreporter.write_line(f"distributed_testing: {line}")
        if self.benchmarked:
            terminalreporter.write_line(
                "distributed_testing: pytest-benchmark's benchmarks ran on the fleet disabled (each benchmarked "
                "function once, untimed), as under pytest-xdist: timings taken on other machines would not compare "
                "with this one's, so no benchmark table, --benchmark-json, --benchmark-autosave or "
                "--benchmark-compare-fail here; run without --dt-coordinator to benchmark")

    def _save_history(self) -> None:
        cache = getattr(self.config, "cache", None)
        if cache is None or not self.durations:
            return
        cache.set(HISTORY_KEY, {**cache.get(HISTORY_KEY, {}), **self.durations})

