"""A pytest plugin the ``test`` executor loads into every task's pytest (``-p`` this module,
``--dt-report PATH``): it writes one JSON line per event to PATH (``fd:N``: to the descriptor N the
process was handed, a serving session's replies), flushed as it goes, so what ran before a crash
or a timeout is still known.

Lines (``"kind"`` tags them):

* ``report``: a test report (setup, call, teardown; subtest reports too) as pytest's own
  ``pytest_report_to_serializable`` makes it, the form pytest-xdist ships between processes, so
  the submitter's pytest rebuilds the same ``TestReport`` (node id, outcome, longrepr with its
  crash line, captured stdout/stderr/log sections, ``wasxfail``, duration). A longrepr pytest
  turned into its text because it has no crash line (a doctest's failure) is flagged
  (:data:`TEXT_LONGREPR`), so the replay prints it with no message in the short summary, as here.
* ``collect``: a collection report that failed (an import error in a module) or skipped (a
  module-level ``pytest.importorskip``), the skip with its ``(path, line, reason)``.
* ``warning``: a warning pytest recorded (message, category, file, line, when, node id).
* ``suite_property``: a ``<testsuite>`` property of the JUnit report (``record_testsuite_property``,
  a plugin's ``add_global_property``: hypothesis's statistics) recorded since the last report,
  written before the report it came before (so it is in that test's lines, which end with its
  teardown). A shipped run with ``--junitxml`` has the workers' pytest write its XML to
  ``/dev/null`` (``plugin/invocation.py``): the submitter adds these to its own.

Each captured section and each longrepr text is cut to its last :data:`MAX_SECTION_CHARS`
characters, so one chatty test cannot swell the task's result past the frame limit.
:func:`summarise` turns the lines into the task's per-test entries.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import IO, Any

import pytest

MAX_SECTION_CHARS = 20000
REPORT_OPTION = "--dt-report"
TEXT_LONGREPR = "dt_text_longrepr"  # plugin/replay.py's (this module imports only pytest)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(REPORT_OPTION, metavar="PATH", help="write every test report as a JSON line to PATH "
                                                         "(distributed_testing's test executor)")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption(REPORT_OPTION)
    if path:
        config.pluginmanager.register(_Writer(config, str(path)), WRITER_NAME)


WRITER_NAME = "distributed_testing-report"  # the serving plugin (pytest_serve.py) writes its lines through it


class _Writer:
    def __init__(self, config: pytest.Config, path: str) -> None:
        self.config = config
        # fd:N: a pipe the process was handed (a session's replies, pytest_serve.py), else a file
        self.out: IO[str] = (open(int(path[3:]), "a", encoding="utf-8") if path.startswith("fd:")  # noqa: SIM115
                             else Path(path).open("a", encoding="utf-8"))
        self.properties_sent = 0  # of the JUnit report's global properties

    def write(self, line: dict[str, Any]) -> None:
        self.out.write(json.dumps(line, default=str) + "\n")
        self.out.flush()

    def _serial(self, report: Any) -> dict[str, Any]:
        data: dict[str, Any] = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        data["sections"] = [[name, _cut(text)] for name, text in data.get("sections") or []]
        if isinstance(data.get("longrepr"), str):
            data["longrepr"] = _cut(data["longrepr"])
            longrepr = report.longrepr
            if hasattr(longrepr, "toterminal") and not hasattr(longrepr, "reprcrash"):
                data[TEXT_LONGREPR] = True  # pytest made it text: a representation without a crash line
        return data

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._suite_properties(report.nodeid)  # before the report: in its entry when the test ends
        self.write({"kind": "report", "data": self._serial(report)})

    def _suite_properties(self, nodeid: str) -> None:
        """The JUnit report's ``<testsuite>`` properties recorded since the last report, each a line."""
        recorded = getattr(_junit_xml(self.config), "global_properties", None)
        if not isinstance(recorded, list) or len(recorded) <= self.properties_sent:
            return
        for name, value in recorded[self.properties_sent:]:
            self.write({"kind": "suite_property", "nodeid": nodeid, "name": str(name), "value": str(value)})
        self.properties_sent = len(recorded)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.write({"kind": "collect", "nodeid": report.nodeid, "longrepr": _cut(str(report.longrepr))})
        elif report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
            path, line, reason = report.longrepr
            self.write({"kind": "collect", "nodeid": report.nodeid, "outcome": "skipped",
                         "skip": [str(path), line, _cut(str(reason))]})

    def pytest_warning_recorded(self, warning_message: Any, when: str, nodeid: str, location: Any) -> None:
        category = warning_message.category
        self.write({"kind": "warning", "message": _cut(str(warning_message.message)),
                     "category": f"{category.__module__}.{category.__qualname__}",
                     "filename": str(warning_message.filename), "lineno": warning_message.lineno,
                     "when": when, "nodeid": nodeid})

    def pytest_unconfigure(self) -> None:
        self.out.close()


def _junit_xml(config: pytest.Config) -> Any:
    """The session's JUnit report (``--junitxml``), else None (also under a pytest older than 7,
    which has no ``stash``: the test's environment brings its own pytest). Its key is read from
    pytest's junitxml plugin, loaded already where there is a report (this module imports only pytest)."""
    key = getattr(sys.modules.get("_pytest.junitxml"), "xml_key", None)
    stash = getattr(config, "stash", None)
    return None if key is None or stash is None else stash.get(key, None)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_SECTION_CHARS else "...\n" + text[-MAX_SECTION_CHARS:]


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The lines of a report file; a last line cut short by a killed pytest is dropped."""
    return parse_lines(path.read_text(encoding="utf-8", errors="replace"))


def parse_lines(text: str) -> list[dict[str, Any]]:
    """The lines of a report's text (:func:`read_lines`)."""
    out = []
    for raw in text.splitlines():
        try:
            line = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(line, dict):
            out.append(line)
    return out


def summarise(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per test run, in the order they ran: ``nodeid`` (exactly as pytest wrote it),
    ``outcome`` (passed, failed, skipped, xfailed, error), ``duration_s``, ``message`` (the crash
    line), ``longrepr`` for a test that did not pass, ``reports`` (the serialized reports),
    ``warnings`` and ``suite_properties`` (``[name, value]`` pairs recorded while it ran). A module
    that failed to collect is one ``error`` entry under its node id, one skipped as a whole one ``skipped`` entry with ``skip``: its ``(path, line, reason)``. Items that
    share a node id (a conftest's own items, ``--keep-duplicates``) are an entry each: a test's
    final teardown report ends its entry, and the next report of that node id begins another. A
    teardown is not final where its attempt (pytest-rerunfailures' ``rerun`` index, on each of its
    reports) had a ``rerun`` report: the test runs again (rerunfailures 16 logs that attempt's
    teardown as passed, older ones a ``rerun`` teardown or none); a warning goes to the node id's last entry (pytest
    records a test's warnings after its teardown)."""
    entries: list[dict[str, Any]] = []
    last: dict[str, dict[str, Any]] = {}  # each node id's latest entry
    pending: list[list[str]] = []  # suite properties whose report is next
    for line in lines:
        kind = line.get("kind")
        if kind == "report":
            data = line.get("data") or {}
            nodeid = str(data.get("nodeid"))
            e = last.get(nodeid)
            if e is None or e.get("ended"):
                e = _entry(entries, last, nodeid)
            e["reports"].append(data)
            if pending:
                e.setdefault("suite_properties", []).extend(pending)
                pending = []
            e["duration_s"] = round(e["duration_s"] + float(data.get("duration") or 0.0), 6)
            _fold(e, data)
            if data.get("outcome") == "rerun":  # this attempt runs again (pytest-rerunfailures' attempt index)
                e.setdefault("rerun_attempts", set()).add(data.get("rerun"))
            elif data.get("when") == "teardown" and data.get("rerun") not in e.get("rerun_attempts", ()):
                e["ended"] = True
        elif kind == "warning":
            nodeid = str(line.get("nodeid") or "")
            (last.get(nodeid) or _entry(entries, last, nodeid)).setdefault("warnings", []).append(line)
        elif kind == "suite_property":  # the next report's entry takes it
            pending.append([str(line.get("name")), str(line.get("value"))])
        elif kind == "collect" and line.get("outcome") == "skipped":
            skip = list(line.get("skip") or [None, None, "Skipped"])
            reason = str(skip[2]).removeprefix("Skipped: ")
            nodeid = str(line.get("nodeid"))
            (last.get(nodeid) or _entry(entries, last, nodeid)).update(outcome="skipped", skip=skip, message=reason,
                                                                      longrepr=reason)
        elif kind == "collect":
            nodeid = str(line.get("nodeid"))
            e = last.get(nodeid) or _entry(entries, last, nodeid)
            e.update(outcome="error", longrepr=line.get("longrepr"), message="collection failed")
    for e in entries:
        e.pop("ended", None)
        e.pop("rerun_attempts", None)
    return [e for e in entries if e["reports"] or e["outcome"] == "error" or "skip" in e]


def _entry(entries: list[dict[str, Any]], last: dict[str, dict[str, Any]], nodeid: str) -> dict[str, Any]:
    e: dict[str, Any] = {"nodeid": nodeid, "outcome": "passed", "duration_s": 0.0, "message": None, "reports": []}
    entries.append(e)
    last[nodeid] = e
    return e


_RANK = {"passed": 0, "xfailed": 1, "skipped": 2, "failed": 3, "error": 4}


def _fold(entry: dict[str, Any], data: dict[str, Any]) -> None:
    """The test's outcome so far, folded with one report (the worst wins)."""
    when, outcome = data.get("when"), data.get("outcome")
    if outcome not in ("failed", "skipped"):  # passed, or a plugin's own (pytest-rerunfailures' rerun)
        return
    if outcome == "skipped":
        now = "xfailed" if data.get("wasxfail") is not None else "skipped"
    else:
        now = "failed" if when == "call" else "error"
    if _RANK[now] < _RANK[entry["outcome"]]:
        return
    entry["outcome"] = now
    longrepr = data.get("longrepr")
    entry["message"] = crash_message(longrepr) or (str(data.get("wasxfail")) if now == "xfailed" else None)
    text = longrepr_text(longrepr)
    if text:
        entry["longrepr"] = text


def crash_message(longrepr: Any) -> str | None:
    if isinstance(longrepr, dict):
        crash = longrepr.get("reprcrash") or {}
        return str(crash.get("message")) if crash.get("message") else None
    if isinstance(longrepr, list) and len(longrepr) == 3:  # a skip: (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return longrepr.strip().splitlines()[-1] if isinstance(longrepr, str) and longrepr.strip() else None


def longrepr_text(longrepr: Any) -> str | None:
    """Plain text of a serialized longrepr, for readers of the task result that are not pytest."""
    if isinstance(longrepr, str):
        return longrepr
    if isinstance(longrepr, list) and len(longrepr) == 3:
        return str(longrepr[2])
    if isinstance(longrepr, dict):
        parts = []
        for entry in (longrepr.get("reprtraceback") or {}).get("reprentries") or []:
            lines = (entry.get("data") or {}).get("lines") or []
            parts.append("\n".join(str(x) for x in lines))
        crash = longrepr.get("reprcrash") or {}
        if crash:
            parts.append(f"{crash.get('path')}:{crash.get('lineno')}: {crash.get('message')}")
        return _cut("\n\n".join(parts)) or None
    return None
