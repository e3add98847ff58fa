"""The workers' reports, replayed as local pytest's.

* Each test's reports come back as pytest serialized them on the worker (the form pytest-xdist
  uses) and are replayed under the local node id; with ``-v`` the terminal line names the worker
  (``[w1] [ 50%] PASSED t.py::test_a``, as xdist's ``[gw0]``), and ``--junitxml`` gets a
  ``dt_worker`` property; the ``<testsuite>`` properties the tests or plugins recorded there
  (``record_testsuite_property``, hypothesis's statistics) are added to the local report's, each
  name and value once (a session fixture's is recorded once per worker session there).
* **Local paths.** The worker's path of the tree (the task output's ``tree``) is replaced by the
  local root everywhere in the reports and warnings (tracebacks, skip locations, warnings'
  files) and in a task's error.
* **A failure of a whole task** (pip, an internal or usage error, a timeout, no worker) or of a
  module's collection is a :class:`Downed`: printed once, with its cause and the tests it took
  down (:func:`print_downed`); each of those tests gets a one-line error naming it.
* **A module skipped there** (``pytest.importorskip`` at module level, a missing import the
  suite skips) skips each of its tests with that reason and location.
* **As pytest made them here.** A report's keywords are the local item's (the worker's tree has
  another folder name); a failure pytest printed as text of its own (a doctest's, which has no
  crash line) is that text again (:data:`TEXT_LONGREPR`), so the short summary shows no message
  for it, as here; under ``-s`` (``--capture=no``; the workers capture all the same) each test's
  captured stdout and stderr are written to this terminal as the test is reported, and its
  reports carry no such sections, as a local ``-s`` run's; ``--capture=tee-sys`` writes them and
  keeps them. With live logging on here (``log_cli``, ``--log-cli-level``) each phase's captured
  log records are written under its ``live log`` heading as the test is reported (captured
  there at the live level, in the captured format).
"""

from __future__ import annotations

import contextlib
import importlib
import re
import sys
import warnings
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
from _pytest.junitxml import xml_key

MAX_LISTED = 20
ONE_LINE = 200
# a serialized report's flag (set by the worker's report writer, worker/executors/pytest_report.py):
# its longrepr string is the text of a failure representation that has no crash line
TEXT_LONGREPR = "dt_text_longrepr"
STREAMS = ("stdout", "stderr")


@dataclass
class Downed:
    """A task or a module that failed as a whole: what, its cause, and the tests it took down."""

    what: str
    cause: str
    tests: list[str] = field(default_factory=list)
    alike: int = 0  # more tasks or modules that failed with the same cause (merged into this one)


def merge_downed(downed: list[Downed], more: Sequence[Downed]) -> None:
    """Add ``more`` to ``downed``, each merged into one with the same cause: a shipped run's small
    chunks that one broken conftest or module took down read as one failure, as they would in
    one pytest."""
    for d in more:
        same = next((e for e in downed if e.cause == d.cause), None)
        if same is None:
            downed.append(d)
        else:
            same.tests += d.tests
            same.alike += 1 + d.alike


class LocalPaths:
    """Maps the worker's tree path (``tree``, from the task output) to ``local`` in report data."""

    def __init__(self, tree: object, local: Path) -> None:
        usable = isinstance(tree, str) and tree.startswith("/") and tree.rstrip("/") != ""
        self._find = re.compile(re.escape(str(tree).rstrip("/")) + r"(?![\w.-])") if usable else None
        self._local = str(local)

    def __call__(self, data: Any) -> Any:
        if self._find is None:
            return data
        if isinstance(data, str):
            return self._find.sub(lambda _: self._local, data)
        if isinstance(data, list):
            return [self(x) for x in data]
        if isinstance(data, dict):
            return {k: self(v) for k, v in data.items()}
        return data


def report_task(pairs: Sequence[tuple[pytest.Item, str]], task: dict[str, Any], local_root: Path,
                durations: dict[str, float], stop: Callable[[], bool],
                done: Collection[pytest.Item] = ()) -> list[Downed]:
    """Report each ``(item, id)`` of one finished task (``id``: the node id the worker reports it
    under; its duration goes into ``durations``) but those in ``done`` (reported live), and return
    what failed as a whole. Items that share a node id take its entries in order, the k-th item
    the k-th entry (the worker runs them in the task's order). Stops early when ``stop()`` says
    so (``-x``)."""
    result = task.get("result") or {}
    output = result.get("output") or {}
    worker = str(result.get("worker_id") or "-")
    local = LocalPaths(output.get("tree"), local_root)
    runs: dict[Any, list[dict[str, Any]]] = {}
    for t in output.get("tests") or []:
        if isinstance(t, dict):  # an id that holds the tree's path, under the local one (task_doc's portable_id)
            runs.setdefault(local(t.get("nodeid")), []).append(t)
    by_id = {k: v[0] for k, v in runs.items()}
    taken: dict[str, int] = {}
    outcome = task.get("outcome") or {}
    cause = local(str(outcome.get("error") or result.get("error") or "no result"))
    whole = Downed(f"task {task['task_id']} ({task.get('state')}) on worker {worker}", cause)
    modules: dict[str, Downed] = {}
    for item, key in pairs:
        n = taken[key] = taken.get(key, -1) + 1
        if item in done:
            continue
        entries = runs.get(key) or []
        entry = entries[n] if n < len(entries) else None
        module_id, module = _collector(by_id, key)
        if entry is not None:
            durations[key] = float(entry.get("duration_s") or 0.0)
        if entry and entry.get("reports"):
            _replay_entry(item, entry, worker, local)
        else:
            _emit(item, _stand_in(item, str(task['task_id']), entry, module_id, module, modules, whole, worker, local),
                  [local(w) for w in (entry or {}).get("warnings") or []])
        if stop():
            break
    return [d for d in (*modules.values(), whole) if d.tests]


def _stand_in(item: pytest.Item, task_id: str, entry: dict[str, Any] | None, module_id: str, module: dict[str, Any] | None,
              modules: dict[str, Downed], whole: Downed, worker: str, local: LocalPaths) -> list[pytest.TestReport]:
    """The reports of a test the worker sent no reports of: from its entry's outcome, its module's
    skip or collection error, or the failure of its whole task (noted in ``modules`` / ``whole``)."""
    if entry is not None:
        return _synthesized(item, entry.get("outcome"), worker, local(entry.get("longrepr") or entry.get("message")))
    if module is not None and module.get("outcome") == "skipped" and module.get("skip"):
        return _skipped(item, local(module["skip"]), worker)
    if module is not None:
        down = modules.setdefault(module_id, Downed(f"{module_id} failed to collect on worker {worker}",
                                                    local(str(module.get("longrepr") or module.get("message")))))
        down.tests.append(item.nodeid)
        return _synthesized(item, "error", worker, f"not run: {module_id} failed to collect there: "
                                                   f"{_gist(down.cause, last=True)}")
    whole.tests.append(item.nodeid)
    return _synthesized(item, "error", worker, f"{_gist(whole.cause)} (not run: task {task_id})")


def report_live(items: dict[str, list[pytest.Item]], seen: dict[str, int], done: Collection[pytest.Item],
                tests: Sequence[dict[str, Any]], worker: str, tree: object, local_root: Path, durations: dict[str, float],
                stop: Callable[[], bool]) -> list[pytest.Item]:
    """Report the tests of a running task's attempt that ended there (``tests``: their entries as
    its result will carry them, in the order they ran) and return the items reported.
    ``items``: the task's items under each node id the worker reports, in the task's order;
    ``seen``: how many finished entries of each node id this attempt has had so far (updated).
    The k-th finished entry of a node id is its k-th item, as in the result (:func:`report_task`):
    items that share a node id each take their own entry, and a retried attempt's entries, which
    start again at its first test, land on the items they ran, so one reported already (in
    ``done``) is not reported again. Stops early when ``stop()`` says so (``-x``). An entry that
    is not a finished test's (no final teardown report: a rerun's so far; a node id that is no
    string) is left to the result."""
    local = LocalPaths(tree, local_root)
    reported = []
    for entry in tests:
        if not _finished(entry):
            continue
        key = local(entry["nodeid"])  # an id that holds the tree's path: the local one
        n = seen[key] = seen.get(key, -1) + 1
        named = items.get(key) or []
        item = named[n] if n < len(named) else None
        if item is None or item in done:
            continue
        took = entry.get("duration_s")
        durations[key] = float(took) if isinstance(took, (int, float)) else 0.0
        _replay_entry(item, entry, worker, local)
        reported.append(item)
        if stop():
            break
    return reported


def _finished(entry: Any) -> bool:
    """Whether ``entry`` is a whole test's: its reports end it (a teardown's that is no
    pytest-rerunfailures ``rerun``: that test runs again)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("nodeid"), str):
        return False
    reports = entry.get("reports")
    return isinstance(reports, list) and any(
        isinstance(r, dict) and r.get("when") == "teardown" and r.get("outcome") != "rerun" for r in reports)


def _replay_entry(item: pytest.Item, entry: dict[str, Any], worker: str, local: LocalPaths) -> None:
    """A test's own reports and warnings, as the worker's pytest serialized them."""
    _suite_properties(item.config, entry.get("suite_properties"))
    _emit(item, _replayed(item, local(entry["reports"]), worker), [local(w) for w in entry.get("warnings") or []])


_ADDED = pytest.StashKey[set[tuple[str, str]]]()  # the suite properties added from the workers' entries


def _suite_properties(config: pytest.Config, recorded: Any) -> None:
    """The ``<testsuite>`` properties recorded while a test ran there, added to the local JUnit
    report's (``--junitxml``); a name and value already added from another entry, once."""
    xml = config.stash.get(xml_key, None)
    if xml is None or not isinstance(recorded, list):
        return
    added = config.stash.setdefault(_ADDED, set())
    for pair in recorded:
        if isinstance(pair, list) and len(pair) == 2 and (key := (str(pair[0]), str(pair[1]))) not in added:
            added.add(key)
            xml.add_global_property(*key)


def _collector(by_id: dict[Any, dict[str, Any]], key: str) -> tuple[str, dict[str, Any] | None]:
    """The entry of the module or folder of test ``key`` that failed to collect or was skipped
    there as a whole, with its node id (the module's when there is none)."""
    module = key.partition("::")[0]
    place = module
    while place and place != key:
        if place in by_id:
            return place, by_id[place]
        place = place.rpartition("/")[0]
    return module, None


def print_downed(reporter: Any, downed: Sequence[Downed]) -> None:
    """Each failure of a whole task or module, once: its cause and the tests it took down."""
    if not downed:
        return
    reporter.write_sep("=", "distributed_testing: failed as a whole", red=True)
    for d in downed:
        alike = f" (and {d.alike} more like it)" if d.alike else ""
        reporter.write_sep("_", f"{d.what}{alike}: {len(d.tests)} test(s) not run")
        reporter.write_line(d.cause.rstrip())
        listed = ", ".join(d.tests[:MAX_LISTED])
        more = f" and {len(d.tests) - MAX_LISTED} more" if len(d.tests) > MAX_LISTED else ""
        reporter.write_line(f"tests it took down: {listed}{more}")


def _gist(text: str, *, last: bool = False) -> str:
    """One line of ``text`` for a test's error: its first (a task's error leads with its reason),
    or with ``last`` its last (a collection error ends with the exception), cut to :data:`ONE_LINE`.
    A first line that only heads what follows (``pytest exit code 4 (usage error):``, ``installing
    the task's Python requirements failed (pip install exit code 1):``) gets the exception the
    output ends with (its last ``E`` line), pip's last ``ERROR:`` line (``No matching distribution
    found for x==1``: the workers install wheels only), else the line after it (pytest's refusal
    of a node id: ``not found: PATH::NAME``)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()] or ["no reason given"]
    raised = [line.removeprefix("E ").removeprefix("ERROR: ").strip() for line in lines
              if line.startswith(("E ", "ERROR: "))]
    if last:
        line = raised[-1] if raised else lines[-1]
    elif lines[0].endswith(":") and (raised or len(lines) > 1):
        line = f"{lines[0]} {raised[-1] if raised else lines[1]}"
    else:
        line = lines[0]
    return line if len(line) <= ONE_LINE else line[:ONE_LINE - 3] + "..."


def _emit(item: pytest.Item, reports: list[pytest.TestReport], warned: list[dict[str, Any]]) -> None:
    """The test's reports and warnings, as pytest's runner emits them."""
    hook = item.ihook
    capture = getattr(item.config.option, "capture", None)
    live = _live_log(item.config)
    hook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for r in reports:
        if capture in ("no", "tee-sys"):
            _show_output(r, keep=capture == "tee-sys")
        if live is not None:
            _show_live_log(live, r)
        hook.pytest_runtest_logreport(report=r)
    for w in warned:
        _replay_warning(item, w)
    hook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


def _show_output(rep: pytest.TestReport, *, keep: bool) -> None:
    """What the test wrote to stdout and stderr in this report's phase, written here as a local
    ``-s`` run shows it while the test runs; without ``keep`` its captured sections go (a local
    ``-s`` run captures nothing)."""
    for stream, out in zip(STREAMS, (sys.stdout, sys.stderr), strict=True):
        for name, text in rep.sections:
            if name == f"Captured {stream} {rep.when}":
                out.write(text)
                out.flush()
    if not keep:
        rep.sections = [(name, text) for name, text in rep.sections
                        if not any(name.startswith(f"Captured {stream} ") for stream in STREAMS)]


def _json_report_omit(rep: pytest.TestReport, config: pytest.Config) -> None:
    """pytest-json-report's per-stage details came from the worker (plugin/invocation.py sends its
    ``--json-report``, not its ``--json-report-omit``, whose values argparse reads as many tokens):
    what the local ``--json-report-omit`` leaves out (``streams``, ``log``) goes here."""
    extra = getattr(rep, "_json_report_extra", None)
    omit = getattr(config.option, "json_report_omit", None) or ()
    if not isinstance(extra, dict) or not omit:
        return
    gone = ({"stdout", "stderr"} if "streams" in omit else set()) | ({"log"} if "log" in omit else set())
    for stage in extra.values():
        if isinstance(stage, dict):
            for key in gone:
                stage.pop(key, None)


def _live_log(config: pytest.Config) -> Any:
    """The terminal reporter where live logging is on here (``log_cli``, ``--log-cli-level``),
    else None."""
    if config.pluginmanager.get_plugin("logging-plugin") is None:  # -p no:logging
        return None
    if config.getoption("log_cli_level", None) is None and not config.getini("log_cli"):
        return None
    return config.pluginmanager.get_plugin("terminalreporter")


def _show_live_log(reporter: Any, rep: pytest.TestReport) -> None:
    """The log records the test's phase captured there (at ``--log-cli-level``, which travels),
    under a ``live log`` heading as pytest's live logging writes them while the test runs."""
    for name, text in rep.sections:
        if name == f"Captured log {rep.when}" and text:
            reporter.ensure_newline()
            reporter.section(f"live log {rep.when}", sep="-", bold=True)
            reporter.write(text if text.endswith("\n") else text + "\n")


class _Text:
    """A failure's representation that pytest serialized as its text (a doctest's
    ``ReprFailDoctest``): printed as that text, with no crash line, as the original."""

    def __init__(self, text: str) -> None:
        self.text = text

    def toterminal(self, tw: Any) -> None:
        for line in self.text.split("\n"):
            tw.line(line)

    def __str__(self) -> str:
        return self.text


class _Node:
    """What pytest reads from an xdist report's ``node``: ``gateway.id`` names the worker on a
    test's ``-v`` line, ``_workerinfocache`` heads its traceback in the failures section (only a
    report with a longrepr says it: a passing one's ``longreprtext`` stays empty, as here); equal
    per worker, so junitxml keys a test's reports alike."""

    def __init__(self, worker: str, said: bool) -> None:
        self.gateway = self
        self.id = worker
        self._workerinfocache = f"[{worker}] ran on distributed_testing worker {worker}" if said else ""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Node) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)


_NODES: dict[tuple[str, bool], _Node] = {}


def _mark(rep: pytest.TestReport, worker: str) -> pytest.TestReport:
    rep.user_properties = [*rep.user_properties, ("dt_worker", worker)]
    if worker != "-":
        said = rep.longrepr is not None
        rep.node = _NODES.setdefault((worker, said), _Node(worker, said))  # type: ignore[attr-defined]
    return rep


def _replayed(item: pytest.Item, serialized: list[dict[str, Any]], worker: str) -> list[pytest.TestReport]:
    out = []
    for data in serialized:
        if isinstance(data.get("longrepr"), list):  # a skip's (path, line, reason), a list after JSON
            data = {**data, "longrepr": tuple(data["longrepr"])}
        text = data.get(TEXT_LONGREPR) and isinstance(data.get("longrepr"), str)
        data = {k: v for k, v in data.items() if k != TEXT_LONGREPR}
        rep = item.config.hook.pytest_report_from_serializable(config=item.config, data=data)
        if not isinstance(rep, pytest.TestReport):
            continue
        rep.nodeid, rep.location = item.nodeid, item.location
        rep.keywords = {k: 1 for k in item.keywords}  # the worker's would name its tree's folder
        _subtest_kwargs(rep, data)
        _json_report_omit(rep, item.config)
        if text:
            rep.longrepr = _Text(str(rep.longrepr))  # type: ignore[assignment]
        out.append(_mark(rep, worker))
    return out


def _subtest_kwargs(rep: pytest.TestReport, data: dict[str, Any]) -> None:
    """A subtest report's parameters as the worker's report had them. pytest's subtests turn them
    into reprs when the report is made, and again when it is read back from JSON
    (``SubtestContext.__post_init__``), so ``subTest(i=2)`` would read ``SUBFAILED(i='2')`` here
    where a local run says ``(i=2)``; the worker's values are those reprs already."""
    sent = (data.get("_subtest.context") or {}).get("kwargs")
    context = getattr(rep, "context", None)
    if isinstance(sent, dict) and context is not None and hasattr(context, "kwargs"):
        with contextlib.suppress(AttributeError, TypeError):
            object.__setattr__(context, "kwargs", dict(sent))  # a frozen dataclass's field


def _replay_warning(item: pytest.Item, w: dict[str, Any]) -> None:
    module, _, name = str(w.get("category") or "").rpartition(".")
    try:
        category = getattr(importlib.import_module(module), name) if module else UserWarning
    except (ImportError, AttributeError):
        category = UserWarning
    if not (isinstance(category, type) and issubclass(category, Warning)):
        category = UserWarning
    message = warnings.WarningMessage(str(w.get("message")), category, str(w.get("filename")), int(w.get("lineno") or 0))
    item.config.hook.pytest_warning_recorded.call_historic(
        kwargs={"warning_message": message, "when": w.get("when") or "runtest", "nodeid": item.nodeid, "location": None})


def _report(item: pytest.Item, worker: str, when: Literal["setup", "call", "teardown"],
            result: Literal["passed", "failed", "skipped"], longrepr: Any = None) -> pytest.TestReport:
    return _mark(pytest.TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, result, longrepr,
                                   when), worker)


def _skipped(item: pytest.Item, skip: list[Any], worker: str) -> list[pytest.TestReport]:
    """The test skipped at setup with its module's skip (path, line, reason)."""
    path, line, reason = (list(skip) + [None, None, None])[:3]
    return [_report(item, worker, "setup", "skipped", (str(path), int(line or 0), str(reason))),
            _report(item, worker, "teardown", "passed")]


def _synthesized(item: pytest.Item, outcome: Any, worker: str, text: Any) -> list[pytest.TestReport]:
    """An error at setup (or, for a test the worker said failed, a failure) whose first line
    names the worker and the reason: pytest's short summary shows only that line."""
    said = f"[dt worker {worker}] {text or 'no reason given'}"
    if outcome == "error":
        return [_report(item, worker, "setup", "failed", said), _report(item, worker, "teardown", "passed")]
    return [_report(item, worker, "setup", "passed"), _report(item, worker, "call", "failed", said),
            _report(item, worker, "teardown", "passed")]
