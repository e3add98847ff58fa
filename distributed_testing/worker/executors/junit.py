"""Parse pytest's JUnit XML (``-o junit_family=xunit1``, which records each test's file).

The result is the summary the ``test`` task type reports: counts per outcome and one entry per
test case with a pytest-style node id, its outcome, duration and a one-paragraph message, plus
``longrepr`` (pytest's full failure text, the traceback) for tests that did not pass.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_MESSAGE_CHARS = 2000
MAX_LONGREPR_CHARS = 20000

_OUTCOME_BY_TAG = {"failure": "failed", "error": "error", "skipped": "skipped"}
_PRIORITY = ("failure", "error", "skipped")


@dataclass
class JUnitSummary:
    """Counts and per-test entries; ``total`` counts every test case in the report."""

    tests: list[dict[str, Any]] = field(default_factory=list)
    duration_s: float = 0.0

    def count(self, outcome: str) -> int:
        return sum(1 for t in self.tests if t["outcome"] == outcome)

    def as_output(self) -> dict[str, Any]:
        """The counts and tests as the ``test`` task's output fields."""
        return {
            "passed": self.count("passed"),
            "failed": self.count("failed"),
            "skipped": self.count("skipped"),
            "xfailed": self.count("xfailed"),
            "errors": self.count("error"),
            "total": len(self.tests),
            "duration_s": self.duration_s,
            "tests": self.tests,
        }


def parse_junit_xml(path: Path) -> JUnitSummary:
    """Parse the JUnit XML file at ``path``.

    Raises :class:`xml.etree.ElementTree.ParseError` (or ValueError for a non-numeric time) for
    a malformed file and OSError if it cannot be read; the caller decides what that means.
    """
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    summary = JUnitSummary()
    for suite in suites:
        summary.duration_s += _float(suite.get("time"))
        summary.tests.extend(_test_entry(case) for case in suite.iter("testcase"))
    summary.duration_s = round(summary.duration_s, 6)
    return summary


def _test_entry(case: ET.Element) -> dict[str, Any]:
    outcome, message, longrepr = "passed", None, None
    for tag in _PRIORITY:
        element = case.find(tag)
        if element is not None:
            outcome = _OUTCOME_BY_TAG[tag]
            if tag == "skipped" and element.get("type") == "pytest.xfail":
                outcome = "xfailed"
            message = _message(element)
            longrepr = (element.text or "").strip()[-MAX_LONGREPR_CHARS:] or None
            break
    entry: dict[str, Any] = {
        "nodeid": node_id(case.get("file"), case.get("classname", ""), case.get("name", "")),
        "outcome": outcome,
        "duration_s": _float(case.get("time")),
        "message": message,
    }
    if longrepr is not None:
        entry["longrepr"] = longrepr  # pytest's report text (the traceback), its last 20,000 characters
    return entry


def node_id(file: str | None, classname: str, name: str) -> str:
    """Rebuild ``path.py::Class::test`` from xunit1 attributes.

    ``classname`` is the dotted module path plus any classes, so the classes are what follows the
    module path derived from ``file``. Without ``file`` (some collection errors) the dotted
    classname and name are joined as they are.
    """
    if not file:
        return "::".join(part for part in (classname, name) if part)
    module = file.removesuffix(".py")
    module = module.replace("/", ".").replace("\\", ".")
    classes = classname[len(module) + 1 :] if classname.startswith(module + ".") else ""
    parts = [file, *(c for c in classes.split(".") if c)]
    if name and name != module:
        parts.append(name)
    return "::".join(parts)


def _message(element: ET.Element) -> str | None:
    text = element.get("message") or ""
    if not text and element.text:
        lines = [line for line in element.text.strip().splitlines() if line.strip()]
        text = lines[-1] if lines else ""
    return text[:MAX_MESSAGE_CHARS] or None


def _float(value: str | None) -> float:
    return float(value) if value else 0.0
