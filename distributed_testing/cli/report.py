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


def _flat(r: dict[str, Any]) -> dict[str, Any]:
    out = r.get("output") or {}
    row = {k: r.get(k) for k in ("task_id", "attempt", "worker_id", "task_type", "status", "error")}
    row["duration_s"] = round(r["finished_at"] - r["started_at"], 4)
    if "passed" in out:
        row["summary"] = f"{out.get('passed', 0)} passed, {out.get('failed', 0)} failed, {out.get('skipped', 0)} skipped"
    elif "model" in out:
        medians = ", ".join(f"bs{b['batch_size']} {b['latency_ms']['median']:.2f}ms"
                            for b in out.get("batch_results", []) if "latency_ms" in b)
        row["summary"] = f"{out.get('model')} {out.get('precision', '')} {out.get('device', '')}: {medians}"
    else:
        row["summary"] = ""
    return row


def print_results(results: list[dict[str, Any]], fmt: str) -> None:
    if fmt == "json":
        print(json.dumps(results, indent=2))
        return
    rows = [_flat(r) for r in results]
    cols = ["task_id", "attempt", "worker_id", "task_type", "status", "duration_s", "summary", "error"]
    if fmt == "csv":
        w = csv.DictWriter(sys.stdout, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    else:
        print_table(rows, cols)


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
