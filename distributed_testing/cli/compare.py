"""``dt compare``: judge benchmark results against their history (``cli/regress.py`` does the maths).

Which results: every succeeded benchmark result of the given task ids. Each is compared, per
batch size, with the **baseline** chosen by ``--baseline REF``:

* ``latest`` (default): the ``--history N`` (default 5) most recent succeeded results of the same
  model and configuration (``config_hash``) *and* the same environment fingerprint, received
  before the result, leaving out the tasks being compared and answers from a worker's result
  cache (``from_cache``: copies of an earlier measurement). A result that is itself such an
  answer is ``not compared``.
* a task id: that task's succeeded results of the same model and configuration.

A baseline result whose fingerprint differs is never compared: the row says ``fingerprint
differs`` and names the fields (for ``latest``: when no history with the same fingerprint exists,
the newest result of the same model and configuration is described). Verdicts: ``faster``,
``slower``, ``unchanged``, ``inconclusive`` (see ``cli/regress.py``), and ``not compared`` (no
baseline, no samples, a different fingerprint, or a measurement that says it was ``disturbed``).
A disturbed measurement (``verdict`` of a batch result, see ``bench/disturbance.py``) is never
called faster or slower: a disturbed new result is not compared, disturbed baseline results are
left out of the baseline. Each row carries the new measurement's own verdict (``quiet``,
``noisy``, ``disturbed``; ``-`` for results from older workers). Exit code 1 when any result is
``slower``; 2 when a task id has no result at all (a mistyped id) or no benchmark result is among
the ids, naming them; else 0. ``--junit`` writes one ``<testcase>`` per result and batch size: ``slower`` is a
``<failure>`` whose message carries the figures, ``inconclusive`` and ``not compared`` are
``<skipped>`` with the reason. History is read through ``GET /api/v1/results``
(``results:read``).
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .common import output_file
from .http import ApiClient
from .regress import Policy, Verdict, compare, describe_diff, fingerprint_diff
from .report import write_json

NOT_COMPARED = "not compared"
Fetch = Callable[[dict[str, str]], list[dict[str, Any]]]


@dataclass(frozen=True)
class Row:
    """One verdict on one result and batch size."""

    task_id: str
    model: str
    batch_size: int | None
    verdict: str
    detail: str
    baseline_tasks: tuple[str, ...] = ()
    ratio: float | None = None
    low: float | None = None
    high: float | None = None
    measurement: str = "-"


def add_arguments(p: argparse.ArgumentParser, *, for_submit: bool = False) -> None:
    """The comparison flags (``dt compare``; ``dt submit`` gets them with ``--baseline``)."""
    if for_submit:
        p.add_argument("--baseline", metavar="REF",
                       help="after waiting, compare benchmark results with REF (latest or a task id; see dt compare); "
                            "a regression exits 1")
    else:
        p.add_argument("task_ids", nargs="+", metavar="TASK_ID", help="tasks whose benchmark results to judge")
        p.add_argument("--baseline", metavar="REF", default="latest",
                       help="latest (default: recent history with the same model, configuration and fingerprint) "
                            "or a task id")
        p.add_argument("--junit", type=output_file, metavar="PATH", help="write the verdicts as JUnit XML")
        p.add_argument("--json", type=output_file, metavar="PATH", dest="json_out", help="write the verdicts as JSON")
    p.add_argument("--history", type=int, default=5, metavar="N",
                   help="with --baseline latest: how many earlier results form the baseline (default 5)")
    p.add_argument("--threshold", type=float, default=5.0, metavar="PCT",
                   help="smallest change in percent that counts as slower or faster (default 5)")
    p.add_argument("--confidence", type=float, default=99.0, metavar="PCT",
                   help="confidence level of the interval in percent (default 99)")


def policy_from_args(ns: argparse.Namespace) -> Policy:
    if ns.history < 1:
        raise ConfigError(f"--history must be >= 1, got {ns.history}")
    if not 0 < ns.threshold < 1000:  # Policy's (0, 10) as a fraction, said in the flags' percent
        raise ConfigError(f"--threshold: a slowdown in percent above 0 and below 1000, got {ns.threshold:g}")
    if not 50 < ns.confidence < 100:
        raise ConfigError(f"--confidence: a level in percent above 50 and below 100, got {ns.confidence:g}")
    try:
        return Policy(threshold=ns.threshold / 100.0, confidence=ns.confidence / 100.0)
    except ValueError as exc:  # what the percent checks above let through (5e-324 is 0 as a fraction)
        raise ConfigError(f"--threshold/--confidence: {exc}") from exc


def api_fetch(api: ApiClient) -> Fetch:
    def fetch(params: dict[str, str]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = api.get("/api/v1/results", params)["results"]
        return rows
    return fetch


def check_baseline(api: ApiClient, ref: str | None) -> None:
    """ConfigError (exit 2) when ``ref`` names a task id without any result: a mistyped baseline
    would otherwise leave every result NOT COMPARED and the gate open (exit 0)."""
    if ref and ref != "latest" and not api_fetch(api)({"task_id": ref, "limit": "1"}):
        raise ConfigError(f"--baseline {ref}: that task has no result (mistyped, or not finished yet)")


def _samples(output: dict[str, Any], *, undisturbed: bool = False) -> dict[int, list[float]]:
    return {b["batch_size"]: b["samples_ms"] for b in output.get("batch_results", [])
            if isinstance(b, dict) and isinstance(b.get("samples_ms"), list) and b["samples_ms"]
            and not (undisturbed and b.get("verdict") == "disturbed")}


def _verdicts(output: dict[str, Any]) -> dict[int, tuple[str, str]]:
    """batch size -> (measurement verdict, its reason) of one result."""
    return {b["batch_size"]: (str(b.get("verdict", "-")), str(b.get("verdict_reason", "")))
            for b in output.get("batch_results", []) if isinstance(b, dict) and "batch_size" in b}


def _baseline(fetch: Fetch, ref: str, history: int, new: dict[str, Any],
              exclude: set[str]) -> tuple[list[dict[str, Any]], str | None]:
    """(baseline results with the new result's fingerprint, why there are none when empty)."""
    out = new["output"]
    same = {"model": out["model"], "config_hash": out["config_hash"], "status": "succeeded", "task_type": "benchmark"}
    if ref == "latest":
        base = {**same, "until": repr(new["received_at"])}
        hits = _measured(fetch, {**base, "fingerprint": out["environment"]["fingerprint_hash"]}, history, exclude)
        if hits:
            return hits, None
        others = _measured(fetch, base, history, exclude)
    else:
        candidates = fetch({"task_id": ref, "status": "succeeded", "limit": "1000"})
        if not candidates:
            return [], f"baseline task {ref} has no succeeded result"
        others = [r for r in candidates if (r.get("output") or {}).get("model") == out["model"]
                  and r["output"].get("config_hash") == out["config_hash"]]
        if not others:
            return [], f"baseline task {ref} has no result of model {out['model']} with this configuration"
        hits = [r for r in others if not fingerprint_diff(out["environment"], r["output"].get("environment") or {})]
        if hits:
            return hits, None
    if not others:
        return [], "no earlier result of this model and configuration"
    diff = fingerprint_diff(out["environment"], others[0]["output"].get("environment") or {})
    return [], f"fingerprint differs from baseline task {others[0]['task_id']}: {describe_diff(diff)}"


def _measured(fetch: Fetch, params: dict[str, str], n: int, exclude: set[str]) -> list[dict[str, Any]]:
    """The ``n`` newest results matching ``params``, leaving out ``exclude`` and answers from a
    worker's result cache (``from_cache``: a copy of an earlier measurement, which would count
    one run several times), paging until there are ``n`` or no more."""
    page, offset, out = n + len(exclude), 0, []
    while True:
        got = fetch({**params, "limit": str(page), "offset": str(offset)})
        out += [r for r in got if r["task_id"] not in exclude and not (r.get("output") or {}).get("from_cache")]
        if len(out) >= n or len(got) < page:
            return out[:n]
        offset += page


def judge(new_results: Sequence[dict[str, Any]], fetch: Fetch, ref: str, history: int, policy: Policy) -> list[Row]:
    """Verdict rows for every benchmark result in ``new_results`` (other results are left out)."""
    exclude = {r["task_id"] for r in new_results}
    rows: list[Row] = []
    for new in new_results:
        out = new.get("output") or {}
        if new.get("task_type") != "benchmark" or new.get("status") != "succeeded" or "batch_results" not in out:
            continue
        model = str(out.get("model"))
        samples = _samples(out)
        if not samples or "config_hash" not in out or not isinstance(out.get("environment"), dict):
            rows.append(Row(new["task_id"], model, None, NOT_COMPARED,
                            "result has no per-iteration samples or config hash (stored by an older worker)"))
            continue
        if out.get("from_cache"):  # nothing was measured: it repeats an earlier task's result
            rows.append(Row(new["task_id"], model, None, NOT_COMPARED,
                            f"answered from the worker's result cache: the measurement of task "
                            f"{out.get('cached_from_task')}, not a new one (compare that task)"))
            continue
        base, why = _baseline(fetch, ref, history, new, exclude)
        tasks = tuple(r["task_id"] for r in base)
        measured = _verdicts(out)
        for bs, run in sorted(samples.items()):
            own, reason = measured.get(bs, ("-", ""))
            if own == "disturbed":
                rows.append(Row(new["task_id"], model, bs, NOT_COMPARED, f"measurement disturbed: {reason}",
                                measurement=own))
                continue
            every = [r for r in base if _samples(r["output"]).get(bs)]
            runs = [s for r in base if (s := _samples(r["output"], undisturbed=True).get(bs))]
            if why is not None or not runs:
                detail = why or (f"every baseline measurement at batch size {bs} was disturbed" if every
                                 else f"no baseline samples at batch size {bs}")
                rows.append(Row(new["task_id"], model, bs, NOT_COMPARED, detail, measurement=own))
                continue
            v = compare(runs, [run], policy)
            rows.append(_row(new["task_id"], model, bs, v, tasks, own))
    return rows


def _row(task_id: str, model: str, bs: int, v: Verdict, tasks: tuple[str, ...], measurement: str) -> Row:
    return Row(task_id, model, bs, v.verdict, v.figures(), tasks, v.ratio, v.low, v.high, measurement)


def print_rows(rows: Sequence[Row]) -> None:
    """One line per verdict on stdout: task, model, batch size, verdict, change, the measurement's
    own verdict, detail."""
    for r in rows:
        change = f"{(r.ratio - 1) * 100:+.1f}%" if r.ratio is not None else "-"
        print(f"{r.task_id}  {r.model}  bs={r.batch_size if r.batch_size is not None else '-'}  "
              f"{r.verdict.upper()}  {change}  [{r.measurement}]  {r.detail}")


def write_junit(path: Path, rows: Sequence[Row], existing: bool = False) -> None:
    """One ``<testsuite name="dt compare">``; appended to the file's ``<testsuites>`` when
    ``existing`` and the file exists (``dt submit --junit --baseline``), whose totals then
    include it."""
    root = ET.parse(path).getroot() if existing and path.exists() else ET.Element("testsuites")
    suite = ET.SubElement(root, "testsuite", name="dt compare", tests=str(len(rows)),
                          failures=str(sum(r.verdict == "slower" for r in rows)), errors="0",
                          skipped=str(sum(r.verdict in ("inconclusive", NOT_COMPARED) for r in rows)), time="0")
    for k in ("tests", "failures", "errors", "skipped"):  # the report's totals count this suite too
        if root.get(k) is not None:
            root.set(k, str(int(root.get(k) or 0) + int(suite.get(k) or 0)))
    for r in rows:
        tc = ET.SubElement(suite, "testcase", classname=f"benchmark.{r.model}",
                           name=f"{r.task_id}[bs={r.batch_size}]", time="0")
        if r.verdict == "slower":
            ET.SubElement(tc, "failure", message=f"regression: {r.detail}"[:2000])
        elif r.verdict in ("inconclusive", NOT_COMPARED):
            ET.SubElement(tc, "skipped", message=r.detail[:2000])
        else:
            ET.SubElement(tc, "system-out").text = f"measurement {r.measurement}; {r.detail}"
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def run(api: ApiClient, task_ids: Sequence[str], ns: argparse.Namespace, *, junit: Path | None = None,
        json_out: Path | None = None, append_junit: bool = False) -> int:
    """Fetch the tasks' results, judge them, print the verdicts and write the reports; 1 when any
    result is slower, 2 when a task id has no result or none is a benchmark result, else 0."""
    policy = policy_from_args(ns)
    fetch = api_fetch(api)
    found = {t: fetch({"task_id": t, "limit": "1000"}) for t in dict.fromkeys(task_ids)}
    missing = [t for t, results in found.items() if not results]
    if missing:
        print(f"dt compare: no result for task id(s) {', '.join(missing)} (mistyped, or not finished yet)",
              file=sys.stderr)
        return 2
    new = [r for results in found.values() for r in results]
    rows = judge(new, fetch, ns.baseline, ns.history, policy)
    if not rows:
        print(f"dt compare: no succeeded benchmark result among task id(s) {', '.join(found)}", file=sys.stderr)
        return 2
    print_rows(rows)
    if junit is not None:
        write_junit(junit, rows, existing=append_junit)
    if json_out is not None:
        write_json(json_out, {"verdicts": [asdict(r) for r in rows]})
    return 1 if any(r.verdict == "slower" for r in rows) else 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``compare`` subcommand to ``sub``."""
    p = sub.add_parser("compare", help="judge benchmark results against their history (exit 1 on a regression)")
    add_arguments(p)
    p.set_defaults(run=cmd_compare)


def cmd_compare(api: ApiClient, ns: argparse.Namespace) -> int:
    check_baseline(api, ns.baseline)  # dt submit --baseline checks it before submitting
    return run(api, ns.task_ids, ns, junit=ns.junit, json_out=ns.json_out)
