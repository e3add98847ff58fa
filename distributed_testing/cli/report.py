"""Output formats of the CLI: tables, times, CSV/JSON results, the wait summary, and JUnit XML.

Times are epoch seconds on the wire and ISO 8601 on output (:func:`iso_time`: UTC with ``Z``, or
the local zone with its offset). Table cells hold one line: a multi-line text shows its first
line, and a cell longer than its column's limit is cut with ``…``, so a long error never breaks a
row. The JUnit file follows pytest's ``--junitxml``: one ``<testsuite>`` per task carrying
``tests``, ``failures``, ``errors``, ``skipped`` and ``time``; a test task's cases have the dotted
module and class as ``classname`` and the test function as ``name``, and a failed one carries its
traceback with the crash's file and line. The wait's summary and ``dt results`` say what each
result holds in one line (:func:`result_summary`) and what went wrong (:func:`error_summary`:
the cause, and the failing tests by node id).
"""

from __future__ import annotations

import csv
import json
import re
import sys
import textwrap
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

MAX_CELL = 100  # characters of one table cell before it is cut
TIME_FIELDS = ("submitted_at", "updated_at", "created_at", "expires_at", "revoked_at", "last_used_at",
               "started_at", "finished_at", "received_at", "at", "not_before", "cached_at", "session_expires_at")


def iso_time(epoch: float | None, local: bool = False) -> str | None:
    """``epoch`` seconds as ISO 8601 to the second: ``2026-11-25T04:41:20Z``, or with ``local``
    the local zone's offset (``2026-11-25T05:41:20+01:00``). None stays None."""
    if epoch is None:
        return None
    if local:
        return datetime.fromtimestamp(epoch).astimezone().isoformat(timespec="seconds")
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def with_iso_times(doc: Any, local: bool = False) -> Any:
    """A copy of the JSON document ``doc`` whose ``TIME_FIELDS`` holding numbers are ISO 8601 texts,
    at any depth (a task's history entries, its result, a key's dates)."""
    if isinstance(doc, list):
        return [with_iso_times(v, local) for v in doc]
    if not isinstance(doc, dict):
        return doc
    return {k: iso_time(v, local) if k in TIME_FIELDS and isinstance(v, int | float) and not isinstance(v, bool)
            else with_iso_times(v, local) for k, v in doc.items()}


def first_line(text: Any) -> str | None:
    """The first non-blank line of ``text`` (None for None or blank)."""
    if text is None:
        return None
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else None


def _cell(v: Any, limit: int = MAX_CELL) -> str:
    if v is None:
        return "-"
    text = f"{v:.3f}" if isinstance(v, float) else str(v)
    if "\n" in text.strip():
        text = (first_line(text) or "") + " …"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def print_table(rows: list[dict[str, Any]], columns: list[str], out: TextIO | None = None, *,
                wrap: str | None = None) -> None:
    """``rows`` as an aligned text table with a header of ``columns``. Each cell is one line cut at
    ``MAX_CELL``; the ``wrap`` column (the last one) instead continues on indented lines below
    its row, so nothing of it is lost and no other column moves."""
    stream = out or sys.stdout
    cells = [[_cell(r.get(c), 10**9 if c == wrap else MAX_CELL) for c in columns] for r in rows]
    widths = [max([len(c)] + [min(len(row[i]), MAX_CELL) for row in cells]) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip(), file=stream)
    for row in cells:
        head = "  ".join(v.ljust(w) for v, w in zip(row[:-1], widths, strict=False))
        last = textwrap.wrap(row[-1], MAX_CELL, break_on_hyphens=False) or [row[-1]] if columns[-1] == wrap else [row[-1]]
        print(f"{head}  {last[0]}".rstrip() if head else last[0], file=stream)
        for more in last[1:]:
            print(" " * (len(head) + 2) + more, file=stream)


TRAINING_COLUMNS = ["model", "nodes", "world_size", "backend", "load_balance", "global_samples_per_s",
                    "scaling_efficiency"]


def training_fields(output: dict[str, Any]) -> dict[str, Any] | None:
    """The ``TRAINING_COLUMNS`` of a multi-node training result, or None for other results.

    A training result's output is node 0's launch dict (``node_rank``, ``nnodes``, ``metrics``:
    the result document of ``training.result``, None when the run failed), to which the
    coordinator adds ``model``, ``global_samples_per_s``, ``scaling_efficiency`` and ``nodes``
    (one entry per node)."""
    metrics = output.get("metrics")
    metrics = metrics if isinstance(metrics, dict) else {}
    if metrics.get("kind") != "training" and not {"node_rank", "nnodes", "metrics"} <= output.keys():
        return None
    nodes = output.get("nnodes", metrics.get("nnodes"))
    if nodes is None and isinstance(output.get("nodes"), list):
        nodes = len(output["nodes"])
    return {
        "model": output.get("model", metrics.get("model")),
        "nodes": nodes,
        "world_size": metrics.get("world_size"),
        "backend": output.get("backend", metrics.get("backend")),
        "load_balance": metrics.get("load_balance"),
        "global_samples_per_s": output.get("global_samples_per_s", metrics.get("global_samples_per_s")),
        "scaling_efficiency": output.get("scaling_efficiency"),
    }


def _flat(r: dict[str, Any], local: bool) -> dict[str, Any]:
    out = r.get("output") or {}
    row = {k: r.get(k) for k in ("task_id", "attempt", "worker_id", "task_type", "status", "error")}
    row["duration_s"] = round(r["finished_at"] - r["started_at"], 4)
    row["finished_at"] = iso_time(r["finished_at"], local)
    training = training_fields(out)
    if training is not None:
        row.update(training, task_type="training")  # coordinators before issue 29 stored "benchmark"
    row["summary"] = result_summary(out, r.get("task_type"), r.get("status")) or ""
    return row


def result_summary(output: dict[str, Any], kind: str | None, status: str | None) -> str | None:
    """One line for a result's ``output``, whatever the kind (``dt results``' SUMMARY, the wait's
    RESULT): a training run's model, nodes and global samples/s; a test run's counts as pytest
    words them (``5 passed, 0 failed, 1 skipped``, then any xfailed and errors); a benchmark's
    :func:`benchmark_summary`; a custom handler's own fields (:func:`custom_summary`). None when
    the output says nothing (a failed task without output)."""
    training = training_fields(output)
    if training is not None:
        speed = training["global_samples_per_s"]
        return (f"{training['model'] or '?'} training, {training['nodes']} node(s)"
                + (f": {speed:.1f} samples/s" if isinstance(speed, int | float) else ""))
    if kind is None:  # a result row from before task_type was stored: what its output looks like
        kind = ("test" if "passed" in output else
                "benchmark" if "model" in output or isinstance(output.get("batch_results"), list) else "custom")
    if kind == "test":
        return test_counts(output)
    if kind == "benchmark":
        return benchmark_summary(output) if output else None
    return custom_summary(output, succeeded=status == "succeeded")


def test_counts(output: dict[str, Any]) -> str | None:
    """``P passed, F failed, S skipped`` (and ``, N xfailed``, ``, N error(s)`` when there are
    any) from a test run's counts, or from its per-test entries when the counts are absent."""
    tests = [t for t in output.get("tests") or [] if isinstance(t, dict)]
    if "passed" not in output and not tests:
        return None

    def n(key: str, outcome: str) -> int:
        value = output.get(key)
        return int(value) if isinstance(value, int) else sum(1 for t in tests if t.get("outcome") == outcome)

    text = f"{n('passed', 'passed')} passed, {n('failed', 'failed')} failed, {n('skipped', 'skipped')} skipped"
    xfailed, errors = n("xfailed", "xfailed"), n("errors", "error")
    if xfailed:
        text += f", {xfailed} xfailed"
    if errors:
        text += f", {errors} error" + ("s" if errors != 1 else "")
    return text


MAX_CUSTOM_CHARS = 80  # of a custom handler's fields in one summary line
_NOT_RESULTS = ("environment",)  # what every result carries beside the handler's own fields


def custom_summary(output: dict[str, Any], *, succeeded: bool) -> str | None:
    """A custom handler's output in short: ``key=value`` pairs (numbers to 4 significant digits,
    nested values as compact JSON), cut at ``MAX_CUSTOM_CHARS``; ``ok`` for a succeeded task
    whose handler returned nothing, None for a failed one."""
    fields = {k: v for k, v in output.items() if k not in _NOT_RESULTS}
    if not fields:
        return "ok" if succeeded else None
    text = ", ".join(f"{k}={_short(v)}" for k, v in fields.items())
    return text if len(text) <= MAX_CUSTOM_CHARS else text[: MAX_CUSTOM_CHARS - 1] + "…"


def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, str):
        return " ".join(v.split())
    return json.dumps(v, separators=(",", ":"), default=str) if isinstance(v, dict | list) else str(v)


def _batch_text(b: dict[str, Any]) -> str:
    verdict = b.get("verdict")
    return f"bs{b['batch_size']} {b['latency_ms']['median']:.4g}ms" + (f" ({verdict})" if verdict else "")


def benchmark_summary(out: dict[str, Any]) -> str:
    """One line for a benchmark result: model, precision, device, ``random weights`` when the model
    was not pretrained, and per batch size the median with the measurement's verdict."""
    medians = ", ".join(_batch_text(b) for b in out.get("batch_results", []) if "latency_ms" in b)
    weights = " random weights" if out.get("weights") == "random" else ""
    return f"{out.get('model')} {out.get('precision', '')} {out.get('device', '')}{weights}: {medians}"


def print_results(results: list[dict[str, Any]], fmt: str, local: bool = False) -> None:
    """``json``: the results as the API returns them (times in epoch seconds), a training result
    with a ``training`` object holding ``TRAINING_COLUMNS``. ``table`` / ``csv``: one row per
    result, ``finished_at`` in ISO 8601 (``local``: the local zone); when any is a training result
    the ``TRAINING_COLUMNS`` are added after ``status`` (empty for the other rows)."""
    if fmt == "json":
        print(json.dumps([_with_training(r) for r in results], indent=2))
        return
    rows = [_flat(r, local) for r in results]
    cols = ["task_id", "attempt", "worker_id", "task_type", "status", "finished_at", "duration_s", "summary", "error"]
    if any(training_fields(r.get("output") or {}) is not None for r in results):
        cols[5:5] = TRAINING_COLUMNS
    if fmt == "csv":
        w = csv.DictWriter(sys.stdout, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    else:
        print_table(rows, cols)


def _with_training(r: dict[str, Any]) -> dict[str, Any]:
    training = training_fields(r.get("output") or {})
    return r if training is None else {**r, "training": training}


# ------------------------------------------------------------------------- the wait's summary

SUMMARY_COLUMNS = ["task", "state", "worker", "duration_s", "result", "error"]


def task_duration(t: dict[str, Any]) -> float | None:
    """Seconds the task's final attempt ran (its result's start to finish), None if it has none."""
    outcome = t.get("outcome") or {}
    if isinstance(outcome.get("duration_s"), int | float):
        return float(outcome["duration_s"])
    result = t.get("result") or {}
    if isinstance(result.get("finished_at"), int | float) and isinstance(result.get("started_at"), int | float):
        return float(result["finished_at"] - result["started_at"])
    return None


def summary_row(t: dict[str, Any]) -> dict[str, Any]:
    """One ``SUMMARY_COLUMNS`` row of a task as the wait left it: :func:`result_summary` of its
    result as ``result`` (None without one), :func:`error_summary` of its error (for a task the
    wait gave up on: why, with the coordinator's ``pending_reason``)."""
    outcome = t.get("outcome") or {}
    result = t.get("result") or {}
    output: dict[str, Any] = result["output"] if isinstance(result.get("output"), dict) else {}
    summary = result_summary(output, t.get("type"), result.get("status")) if result else None
    return {"task": t["task_id"], "state": t["state"], "worker": outcome.get("worker_id") or t.get("worker_id"),
            "duration_s": task_duration(t), "result": summary, "error": error_summary(outcome.get("error"), output)}


MAX_NAMED_TESTS = 3  # failing tests an error line names before it counts the rest
# pip's own error lines ("ERROR: No matching distribution found for x"), which say why it failed
_PIP_ERROR = re.compile(r"^ERROR: ")


def error_summary(error: Any, output: dict[str, Any] | None = None) -> str | None:
    """The line of ``error`` that says what went wrong: its first line, followed by the cause when
    that line only introduces it (ends with ``:``, as a failed pip install does: then pip's first
    ``ERROR:`` line, else the next line), and by the node ids of the failing tests in ``output``
    (a test run's per-test entries; at most ``MAX_NAMED_TESTS``) when it names none of them."""
    line = first_line(error)
    if line is None:
        return None
    if line.endswith(":"):
        rest = [x.strip() for x in str(error).splitlines() if x.strip()][1:]
        cause = next((x for x in rest if _PIP_ERROR.match(x)), rest[0] if rest else None)
        if cause:
            line = f"{line} {cause}"
    failing = failing_tests(output or {})
    if failing and not any(f["nodeid"] in line for f in failing):
        names = [str(f["nodeid"]) for f in failing[:MAX_NAMED_TESTS]]
        more = len(failing) - len(names)
        line = f"{line}: {', '.join(names)}" + (f" and {more} more" if more else "")
    return line


def failing_tests(output: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-test entries of a test run that failed or errored, in the order they ran."""
    return [t for t in output.get("tests") or [] if isinstance(t, dict) and t.get("outcome") in ("failed", "error")]


def crash_location(entry: dict[str, Any]) -> str | None:
    """Where a failed test's entry crashed, ``path:line`` as pytest prints it under the traceback
    (the last traceback entry's file location, else the crash's own), None when its reports have
    no structured traceback (a collection error, a report from an older worker)."""
    for data in reversed(entry.get("reports") or []):
        longrepr = data.get("longrepr") if isinstance(data, dict) else None
        if not isinstance(longrepr, dict):
            continue
        entries = (longrepr.get("reprtraceback") or {}).get("reprentries") or []
        loc = ((entries[-1].get("data") or {}).get("reprfileloc") if entries else None) or longrepr.get("reprcrash")
        if isinstance(loc, dict) and loc.get("path") is not None:
            return f"{loc['path']}:{loc.get('lineno')}"
    return None


def print_summary(tasks: list[dict[str, Any]], out: TextIO) -> None:
    print_table([summary_row(t) for t in tasks], SUMMARY_COLUMNS, out, wrap="error")


# ------------------------------------------------------------------------------------- JUnit


def split_nodeid(nodeid: str) -> tuple[str, str]:
    """pytest's (classname, name) for a node id: ``tests/test_more.py::ChunkedTests::test_x[a]``
    is (``tests.test_more.ChunkedTests``, ``test_x[a]``). A parameter id may hold ``::``."""
    base, bracket, params = nodeid.partition("[")
    parts = base.split("::")
    path, classes, name = parts[0], parts[1:-1], parts[-1] if len(parts) > 1 else ""
    module = path.removesuffix(".py").replace("\\", "/").strip("/").replace("/", ".")
    if not name:  # a file-level entry (a collection error)
        return module, (base.rsplit("/", 1)[-1] + bracket + params)
    return ".".join([module, *classes]), name + bracket + params


def _task_cases(t: dict[str, Any]) -> list[dict[str, Any]]:
    """(classname, name, outcome, time, message, details) per test case of one task."""
    output = (t.get("result") or {}).get("output") or {}
    outcome = t.get("outcome") or {}
    cases = []
    for c in output.get("tests") or []:
        classname, name = split_nodeid(str(c.get("nodeid") or ""))
        cases.append({"classname": classname, "name": name, "outcome": str(c.get("outcome")),
                      "time": float(c.get("duration_s") or 0), "message": c.get("message"), "text": _case_text(c)})
    if cases and t["state"] in ("succeeded", "failed"):
        return cases
    if t["state"] == "succeeded" and isinstance(output.get("batch_results"), list) and output["batch_results"]:
        return [_batch_case(t, output, b) for b in output["batch_results"] if isinstance(b, dict)]
    # no per-test outcomes (not a test task, or the run ended before pytest reported): the task is one case
    kind = t.get("type") or "task"
    cases.append({"classname": f"dt.{kind}", "name": t["task_id"], "outcome": _outcome(t["state"]),
                  "time": task_duration(t) or 0.0, "message": outcome.get("error")})
    return cases


def _batch_case(t: dict[str, Any], output: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """A succeeded benchmark's batch size as a case: passed with its figures and verdict, or
    skipped when the measurement says it was disturbed (its number cannot be trusted)."""
    verdict, reason = b.get("verdict"), b.get("verdict_reason")
    median = (b.get("latency_ms") or {}).get("median")
    text = (f"median {median:.4g} ms" if isinstance(median, int | float) else "no median") + (
        f"; measurement {verdict}: {reason}" if verdict else "")
    if output.get("weights") == "random":
        text += "; random weights"
    return {"classname": f"dt.benchmark.{output.get('model')}", "name": f"{t['task_id']}[bs={b.get('batch_size')}]",
            "outcome": "skipped" if verdict == "disturbed" else "passed", "time": float(b.get("measured_s") or 0),
            "message": text, "system_out": text}


def write_junit(path: Path, tasks: list[dict[str, Any]]) -> None:
    """One ``<testsuite>`` per task (``name``: the task id, ``hostname``: its worker); a test task's
    per-test outcomes are its ``<testcase>`` elements, any other task is one case of classname
    ``dt.<type>``. A failed case has ``<failure>``, an errored one ``<error>`` (message: the first
    line of the crash message; text: the test's traceback ending with the crash's ``file:line``,
    or for a task without per-test entries its whole error), a skipped or xfailed one ``<skipped>``. A succeeded benchmark
    is one case per batch size (``<task>[bs=N]``) whose ``<system-out>`` carries the median and the
    measurement's verdict; a ``disturbed`` one is ``<skipped>`` with the reason."""
    suites = ET.Element("testsuites", name="dt")
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    total_time = 0.0
    for t in tasks:
        cases = _task_cases(t)
        suite = ET.SubElement(suites, "testsuite", name=t["task_id"])
        worker = (t.get("outcome") or {}).get("worker_id") or t.get("worker_id")
        if worker:
            suite.set("hostname", str(worker))
        counts = {"tests": len(cases), "failures": _count(cases, "failed"), "errors": _count(cases, "error"),
                  "skipped": _count(cases, "skipped", "xfailed")}
        elapsed = task_duration(t)
        seconds = elapsed if elapsed is not None else sum(c["time"] for c in cases)
        for k, v in counts.items():
            suite.set(k, str(v))
            totals[k] += v
        suite.set("time", f"{seconds:.3f}")
        total_time += seconds
        for c in cases:
            _add_case(suite, c)
    for k, v in totals.items():
        suites.set(k, str(v))
    suites.set("time", f"{total_time:.3f}")
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)


def write_json(path: Path, doc: Any) -> None:
    """``doc`` as indented JSON in ``path`` (``--json``), its folder made as the JUnit report's is."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2))


def _add_case(suite: ET.Element, c: dict[str, Any]) -> None:
    tc = ET.SubElement(suite, "testcase", classname=c["classname"], name=c["name"], time=f"{c['time']:.3f}")
    kind = {"failed": "failure", "error": "error", "skipped": "skipped", "xfailed": "skipped"}.get(c["outcome"])
    if kind:
        message = str(c.get("message") or "")
        el = ET.SubElement(tc, kind, message=first_line(message) or kind)
        text = c.get("text") or message
        if text:
            el.text = text
    if c.get("system_out"):
        ET.SubElement(tc, "system-out").text = c["system_out"]


def _case_text(entry: dict[str, Any]) -> str | None:
    """A failed or errored test's JUnit text, as pytest's ``--junitxml`` writes it: the traceback
    (the entry's ``longrepr``) ending with the crash's file and line; the crash message where the
    entry has no traceback. None for the other outcomes (their message says it all)."""
    if entry.get("outcome") not in ("failed", "error"):
        return None
    text = str(entry.get("longrepr") or entry.get("message") or "")
    where = crash_location(entry)
    if where and where not in text:
        text = f"{text}\n{where}" if text else where
    return text or None


def _count(cases: list[dict[str, Any]], *outcomes: str) -> int:
    return sum(1 for c in cases if c["outcome"] in outcomes)


def _outcome(state: str) -> str:
    return {"succeeded": "passed", "cancelled": "skipped"}.get(state, "failed" if state == "failed" else "error")
