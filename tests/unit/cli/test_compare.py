"""``dt compare``'s choice of baseline and its refusals, on results served by a fake fetch."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np

from distributed_testing.cli.compare import NOT_COMPARED, judge, write_junit
from distributed_testing.cli.regress import Policy
from distributed_testing.coordinator.core.rows import ResultRow
from distributed_testing.coordinator.store.base import ResultQuery
from distributed_testing.coordinator.store.memory import filter_results

POLICY = Policy(resamples=300)
ENV = {"fingerprint_hash": "f1", "torch_threads": 4, "torch_version": "2.13.0"}


def result(task_id: str, at: float, median: float, env: dict[str, Any] = ENV, config_hash: str = "c1",
           samples: bool = True) -> ResultRow:
    rng = np.random.default_rng(int(at))
    batch: dict[str, Any] = {"batch_size": 1}
    if samples:
        batch["samples_ms"] = (median * rng.lognormal(0, 0.03, 100)).tolist()
    return ResultRow(task_id=task_id, attempt=1, worker_id="w", status="succeeded", started_at=at, finished_at=at,
                     received_at=at, task_type="benchmark",
                     output={"model": "mlp", "config_hash": config_hash, "environment": env, "batch_results": [batch]})


def fetcher(rows: list[ResultRow]):
    def fetch(params: dict[str, str]) -> list[dict[str, Any]]:
        fields = {k: v for k, v in params.items() if k not in ("until", "limit", "offset")}
        q = ResultQuery(**fields, until=float(params["until"]) if "until" in params else None,
                        limit=int(params.get("limit", 100)), offset=int(params.get("offset", 0)))
        return [view(r) for r in filter_results(rows, q)]
    return fetch


def view(r: ResultRow) -> dict[str, Any]:
    return {k: getattr(r, k) for k in r.__struct_fields__}


def test_latest_uses_earlier_results_with_the_same_fingerprint_only() -> None:
    other_env = {**ENV, "fingerprint_hash": "f2", "torch_threads": 2}
    rows = [result("old1", 1, 10.0), result("old2", 2, 10.0), result("other", 3, 5.0, other_env),
            result("new", 4, 12.0), result("later", 5, 10.0)]
    [row] = judge([view(rows[3])], fetcher(rows), "latest", 5, POLICY)
    assert row.verdict == "slower" and row.baseline_tasks == ("old2", "old1"), row


def test_a_baseline_with_another_fingerprint_is_never_compared_and_the_fields_are_named() -> None:
    other_env = {**ENV, "fingerprint_hash": "f2", "torch_threads": 2}
    rows = [result("other", 1, 10.0, other_env), result("new", 2, 20.0)]
    [row] = judge([view(rows[1])], fetcher(rows), "latest", 5, POLICY)
    assert row.verdict == NOT_COMPARED
    assert "fingerprint differs from baseline task other: torch_threads: 4 -> 2" in row.detail
    [row] = judge([view(rows[1])], fetcher(rows), "other", 5, POLICY)
    assert row.verdict == NOT_COMPARED and "torch_threads: 4 -> 2" in row.detail


def test_a_task_id_ref_is_the_baseline_and_other_configurations_are_refused() -> None:
    rows = [result("base", 1, 10.0), result("cfg2", 2, 10.0, config_hash="c2"), result("new", 3, 10.0)]
    [row] = judge([view(rows[2])], fetcher(rows), "base", 5, POLICY)
    assert row.verdict == "unchanged" and row.baseline_tasks == ("base",)
    [row] = judge([view(rows[2])], fetcher(rows), "cfg2", 5, POLICY)
    assert row.verdict == NOT_COMPARED and "with this configuration" in row.detail
    [row] = judge([view(rows[2])], fetcher(rows), "nope", 5, POLICY)
    assert row.verdict == NOT_COMPARED and "no succeeded result" in row.detail


def cache_hit(task_id: str, at: float, of: ResultRow) -> ResultRow:
    """What a worker answers for a ``"cache": true`` task: ``of``'s output, not measured again."""
    return ResultRow(task_id=task_id, attempt=1, worker_id="w", status="succeeded", started_at=at, finished_at=at,
                     received_at=at, task_type="benchmark",
                     output={**of.output, "from_cache": True, "cached_from_task": of.task_id})


def test_cache_answers_are_neither_baseline_runs_nor_compared() -> None:
    # three cache hits of one measurement counted as three baseline runs: one run's samples
    # weighed thrice, and a hit compared with the run it copies
    old = [result(f"old{i}", i, 10.0) for i in range(1, 4)]
    hits = [cache_hit(f"hit{i}", 10 + i, old[2]) for i in range(1, 6)]
    rows = [*old, *hits, result("new", 20, 10.0)]
    [row] = judge([view(rows[-1])], fetcher(rows), "latest", 3, POLICY)
    assert row.baseline_tasks == ("old3", "old2", "old1"), row
    [row] = judge([view(hits[0])], fetcher(rows), "latest", 3, POLICY)
    assert row.verdict == NOT_COMPARED and "result cache" in row.detail and "old3" in row.detail, row


def test_no_history_and_no_samples_say_so() -> None:
    rows = [result("new", 1, 10.0), result("old-worker", 2, 10.0, samples=False)]
    first, second = judge([view(r) for r in rows], fetcher(rows), "latest", 5, POLICY)
    assert first.verdict == NOT_COMPARED and "no earlier result" in first.detail
    assert second.verdict == NOT_COMPARED and "no per-iteration samples" in second.detail


def test_junit_marks_regressions_as_failures_and_appends_to_an_existing_report(tmp_path: Path) -> None:
    rows = [result("old", 1, 10.0), result("new", 2, 13.0)]
    verdicts = judge([view(rows[1])], fetcher(rows), "latest", 5, POLICY)
    path = tmp_path / "r.xml"
    ET.ElementTree(ET.Element("testsuites")).write(path)
    write_junit(path, verdicts, existing=True)
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "1" and suite.get("tests") == "1"
    case = suite.find("testcase")
    assert case is not None and case.get("classname") == "benchmark.mlp" and case.get("name") == "new[bs=1]"
    assert "regression: median 12.98 ms vs baseline 10.01 ms (+29.7 %" in (case.find("failure").get("message") or "")  # type: ignore[union-attr]


def test_the_appended_compare_suite_counts_in_the_reports_totals(tmp_path: Path) -> None:
    # dt submit --junit --baseline: the root's totals (what CI summaries read) include the
    # comparison's regression, not only the tasks' suites
    rows = [result("old", 1, 10.0), result("new", 2, 13.0)]
    verdicts = judge([view(rows[1])], fetcher(rows), "latest", 5, POLICY)
    path = tmp_path / "r.xml"
    ET.ElementTree(ET.Element("testsuites", name="dt", tests="2", failures="0", errors="1", skipped="0",
                              time="1.500")).write(path)
    write_junit(path, verdicts, existing=True)
    root = ET.parse(path).getroot()
    assert {k: root.get(k) for k in ("tests", "failures", "errors", "skipped", "time")} == {
        "tests": "3", "failures": "1", "errors": "1", "skipped": "0", "time": "1.500"}


class _Api:
    """Serves ``GET /api/v1/results`` from rows, as the coordinator does."""

    def __init__(self, rows: list[ResultRow]) -> None:
        self.fetch = fetcher(rows)

    def get(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        assert path == "/api/v1/results"
        return {"results": self.fetch(params)}


def _ns(**over: Any) -> Any:
    import argparse

    return argparse.Namespace(**{"baseline": "latest", "history": 5, "threshold": 5.0, "confidence": 99.0, **over})


def test_a_mistyped_id_or_no_benchmark_result_exits_2_naming_the_ids(capsys) -> None:
    from distributed_testing.cli.compare import run

    test_row = ResultRow(task_id="t1", attempt=1, worker_id="w", status="succeeded", started_at=1, finished_at=1,
                         received_at=1, task_type="test", output={"passed": 3})
    api = _Api([result("new", 2, 10.0), test_row])
    assert run(api, ["new", "nwe"], _ns()) == 2  # type: ignore[arg-type]
    assert "no result for task id(s) nwe" in capsys.readouterr().err
    assert run(api, ["t1"], _ns()) == 2  # type: ignore[arg-type]
    assert "no succeeded benchmark result among task id(s) t1" in capsys.readouterr().err


def _with_verdict(row: ResultRow, verdict: str) -> ResultRow:
    batch = {**row.output["batch_results"][0], "verdict": verdict, "verdict_reason": f"{verdict} because"}
    output = {**row.output, "batch_results": [batch]}
    return ResultRow(**{**view(row), "output": output})


def test_disturbed_measurements_are_never_faster_or_slower() -> None:
    rows = [_with_verdict(result("old", 1, 10.0), "quiet"), _with_verdict(result("new", 2, 30.0), "disturbed")]
    [row] = judge([view(rows[1])], fetcher(rows), "latest", 5, POLICY)
    assert row.verdict == NOT_COMPARED and row.measurement == "disturbed"
    assert row.detail == "measurement disturbed: disturbed because"
    rows = [_with_verdict(result("old", 1, 10.0), "disturbed"), _with_verdict(result("new", 2, 30.0), "quiet")]
    [row] = judge([view(rows[1])], fetcher(rows), "latest", 5, POLICY)
    assert row.verdict == NOT_COMPARED and "every baseline measurement at batch size 1 was disturbed" in row.detail
    rows.insert(0, _with_verdict(result("older", 0.5, 10.0), "noisy"))
    [row] = judge([view(rows[2])], fetcher(rows), "latest", 5, POLICY)
    assert row.verdict == "slower" and row.baseline_tasks == ("old", "older") and row.measurement == "quiet"
