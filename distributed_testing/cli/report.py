"""Output formats of the CLI: tables, times, CSV/JSON results, the wait summary, and JUnit XML.

Times are epoch seconds on the wire and ISO 8601 on output (:func:`iso_time`: UTC with ``Z``, or
the local zone with its offset). Table cells hold one line: a multi-line text shows its first
line, and a cell longer than its column's limit is cut with ``…``, so a long error never breaks a
row. The JUnit file follows pytest's ``--junitxml``: one ``<testsuite>`` per task carrying
``tests``, ``failures``, ``errors``, ``skipped`` and ``time``; a test task's cases have the dotted
module and class as ``classname`` and the test function as ``name``.
"""

from __future__ import annotations

import csv
import json
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
        speed = training["global_samples_per_s"]
        row["summary"] = (f"{training['model'] or '?'} training, {training['nodes']} node(s)"
                          + (f": {speed:.1f} samples/s" if isinstance(speed, (int, float)) else ""))
    elif "passed" in out:
        row["summary"] = f"{out.get('passed', 0)} passed, {out.get('failed', 0)} failed, {out.get('skipped', 0)} skipped"
    elif "model" in out:
        row["summary"] = benchmark_summary(out)
    else:
        row["summary"] = ""
    return row


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
    """One ``SUMMARY_COLUMNS`` row of a task as the wait left it: a benchmark's
    :func:`benchmark_summary` as ``result`` (None for other tasks), the first line of its error
    (for a task the wait gave up on: why, with the coordinator's ``pending_reason``)."""
    outcome = t.get("outcome") or {}
    output = (t.get("result") or {}).get("output") or {}
    result = benchmark_summary(output) if isinstance(output.get("batch_results"), list) else None
    return {"task": t["task_id"], "state": t["state"], "worker": outcome.get("worker_id") or t.get("worker_id"),
            "duration_s": task_duration(t), "result": result, "error": first_line(outcome.get("error"))}


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
                      "time": float(c.get("duration_s") or 0), "message": c.get("message")})
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
    line; text: the whole message), a skipped or xfailed one ``<skipped>``. A succeeded benchmark
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
        if message:
            el.text = message
    if c.get("system_out"):
        ET.SubElement(tc, "system-out").text = c["system_out"]


def _count(cases: list[dict[str, Any]], *outcomes: str) -> int:
    return sum(1 for c in cases if c["outcome"] in outcomes)


def _outcome(state: str) -> str:
    return {"succeeded": "passed", "cancelled": "skipped"}.get(state, "failed" if state == "failed" else "error")
