"""Output formats of the CLI: tables, CSV/JSON results, and JUnit XML for CI systems."""

from __future__ import annotations

import csv
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))


TRAINING_COLUMNS = ["model", "nodes", "world_size", "backend", "load_balance", "global_samples_per_s",
                    "scaling_efficiency"]


def training_fields(output: dict[str, Any]) -> dict[str, Any] | None:
    """The ``TRAINING_COLUMNS`` of a multi-node training result, or None for other results.

    A training result's output is node 0's launch dict (``node_rank``, ``nnodes``, ``metrics``:
    the result document of ``training.metrics``, None when the run failed), to which the
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


def _flat(r: dict[str, Any]) -> dict[str, Any]:
    out = r.get("output") or {}
    row = {k: r.get(k) for k in ("task_id", "attempt", "worker_id", "task_type", "status", "error")}
    row["duration_s"] = round(r["finished_at"] - r["started_at"], 4)
    training = training_fields(out)
    if training is not None:
        row.update(training)
        speed = training["global_samples_per_s"]
        row["summary"] = (f"{training['model'] or '?'} training, {training['nodes']} node(s)"
                          + (f": {speed:.1f} samples/s" if isinstance(speed, (int, float)) else ""))
    elif "passed" in out:
        row["summary"] = f"{out.get('passed', 0)} passed, {out.get('failed', 0)} failed, {out.get('skipped', 0)} skipped"
    elif "model" in out:
        medians = ", ".join(f"bs{b['batch_size']} {b['latency_ms']['median']:.2f}ms"
                            for b in out.get("batch_results", []) if "latency_ms" in b)
        row["summary"] = f"{out.get('model')} {out.get('precision', '')} {out.get('device', '')}: {medians}"
    else:
        row["summary"] = ""
    return row


def print_results(results: list[dict[str, Any]], fmt: str) -> None:
    """``json``: the results as the API returns them, a training result with a ``training`` object
    holding ``TRAINING_COLUMNS``. ``table`` / ``csv``: one row per result; when any is a training
    result the ``TRAINING_COLUMNS`` are added after ``status`` (empty for the other rows)."""
    if fmt == "json":
        print(json.dumps([_with_training(r) for r in results], indent=2))
        return
    rows = [_flat(r) for r in results]
    cols = ["task_id", "attempt", "worker_id", "task_type", "status", "duration_s", "summary", "error"]
    if any(training_fields(r.get("output") or {}) is not None for r in results):
        cols[5:5] = TRAINING_COLUMNS
    if fmt == "csv":
        w = csv.DictWriter(sys.stdout, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    else:
        print_table(rows, cols)


def _with_training(r: dict[str, Any]) -> dict[str, Any]:
    training = training_fields(r.get("output") or {})
    return r if training is None else {**r, "training": training}


def write_junit(path: Path, tasks: list[dict[str, Any]]) -> None:
    """One <testsuite> per task; a test task's per-test outcomes become its <testcase>s."""
    suites = ET.Element("testsuites")
    for t in tasks:
        result = t.get("result") or {}
        out = result.get("output") or {}
        suite = ET.SubElement(suites, "testsuite", name=t["task_id"])
        cases = out.get("tests") or [{"nodeid": t["task_id"], "outcome": _outcome(t["state"]),
                                      "duration_s": (t.get("outcome") or {}).get("duration_s") or 0,
                                      "message": (t.get("outcome") or {}).get("error")}]
        for c in cases:
            tc = ET.SubElement(suite, "testcase", name=str(c.get("nodeid")), classname=t["task_id"],
                               time=f"{float(c.get('duration_s') or 0):.3f}")
            kind = {"failed": "failure", "error": "error", "skipped": "skipped"}.get(str(c.get("outcome")))
            if kind:
                ET.SubElement(tc, kind, message=str(c.get("message") or "")[:2000])
        suite.set("tests", str(len(cases)))
        suite.set("failures", str(sum(c.get("outcome") == "failed" for c in cases)))
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)


def _outcome(state: str) -> str:
    return {"succeeded": "passed", "cancelled": "skipped"}.get(state, "failed" if state == "failed" else "error")
