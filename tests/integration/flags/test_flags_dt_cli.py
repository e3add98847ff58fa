"""Every ``dt`` flag, subcommand and variable against a real coordinator (on a background thread:
``dt`` blocks in urllib), calling ``distributed_testing.cli.dt.main`` in-process."""

from __future__ import annotations

import csv
import io
import json
import re
import sys
import time
import xml.etree.ElementTree as ET
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from flags_support import ThreadCluster, refusing_port

from distributed_testing.cli import dt
from distributed_testing.coordinator.core.rows import ResultRow

pytestmark = pytest.mark.timeout(60)


class DT:
    """``dt`` with the cluster's URL and a key passed as flags (or not, with ``flags=False``)."""

    def __init__(self, tc: ThreadCluster, capsys: pytest.CaptureFixture[str]) -> None:
        self.tc, self.capsys = tc, capsys
        self.url, self.admin = tc.c.base_url, tc.c.admin_key

    def __call__(self, *argv: str, key: str | None = None, flags: bool = True) -> tuple[int, str, str]:
        self.capsys.readouterr()
        prefix = ["--coordinator", self.url, "--api-key", key or self.admin] if flags else []
        try:
            code = dt.main([*prefix, *argv])
        except SystemExit as exc:  # argparse refused the command line
            code = int(exc.code or 0)
        out, err = self.capsys.readouterr()
        return code, out, err

    def key(self, role: str, *extra: str) -> str:
        code, out, err = self("keys", "create", "--role", role, *extra)
        assert code == 0, err
        return out.strip()

    def task(self, task_id: str) -> dict[str, Any]:
        code, out, err = self("status", task_id)
        assert code == 0, err
        return dict(json.loads(out))


@pytest.fixture
def run_dt(thread_cluster: ThreadCluster, capsys: pytest.CaptureFixture[str], clean_env: pytest.MonkeyPatch) -> DT:
    return DT(thread_cluster, capsys)


def task_file(tmp: Path, doc: Any, name: str = "tasks.json") -> str:
    path = tmp / name
    path.write_text(json.dumps(doc))
    return str(path)


def noop(task_id: str, **extra: Any) -> dict[str, Any]:
    return {"task_id": task_id, "type": "custom", "config": {"name": "noop"}, **extra}


def sleep(task_id: str, seconds: float, **extra: Any) -> dict[str, Any]:
    return {"task_id": task_id, "type": "custom", "config": {"name": "sleep", "parameters": {"seconds": seconds}}, **extra}


def summary_rows(err: str) -> dict[str, list[str]]:
    """The rows of the summary table ``dt submit --wait`` ends with on stderr, by task id (a long
    error continues on indented lines: they are joined to their row)."""
    lines = err.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("TASK "))
    rows: dict[str, list[str]] = {}
    last = ""
    for line in lines[start + 1:]:
        if line[:1].isspace():
            rows[last] += line.split()
        elif line.strip():
            last = line.split()[0]
            rows[last] = line.split()
    return rows


def unrunnable(task_id: str) -> dict[str, Any]:
    return noop(task_id, requirements={"tags": ["no-such-worker"]})


# ---------------------------------------------------------------------------------------- keys


def test_keys_create_prints_only_the_key_with_role_and_name_then_list_and_revoke(run_dt: DT) -> None:
    code, out, err = run_dt("keys", "create", "--role", "viewer", "--name", "ci-viewer")
    assert code == 0, err
    key = out.strip()
    assert out == key + "\n" and key.startswith("dtk_")
    key_id, secret = key.split("_")[1], key.split("_", 2)[2]

    code, out, _ = run_dt("keys", "list")
    assert code == 0
    header, *rows = out.splitlines()
    assert header.split() == ["KEY_ID", "NAME", "ROLE", "CREATED_AT", "EXPIRES_AT", "REVOKED_AT"]
    mine = next(r.split() for r in rows if r.startswith(key_id))
    assert mine[1:3] == ["ci-viewer", "viewer"] and mine[4:] == ["-", "-"]
    assert secret not in out

    assert run_dt("workers", key=key)[0] == 0  # --role viewer: may read
    code, _, err = run_dt("keys", "create", "--role", "viewer", key=key)  # ... but not manage keys
    assert code == 2 and "HTTP 403" in err

    code, out, err = run_dt("keys", "revoke", key_id)
    assert (code, out) == (0, "") and f"revoked {key_id}" in err
    code, _, err = run_dt("workers", key=key)
    assert code == 2 and "HTTP 401" in err
    revoked = next(r.split() for r in run_dt("keys", "list")[1].splitlines() if r.startswith(key_id))
    assert revoked[-1] != "-"


def test_keys_create_role_decides_what_the_key_may_do(run_dt: DT) -> None:
    submitter = run_dt.key("submitter")
    assert run_dt("keys", "list", key=submitter)[0] == 2
    assert run_dt("keys", "list", key=run_dt.key("admin"))[0] == 0
    code, _, err = run_dt("keys", "create", "--role", "root")
    assert code == 2 and "invalid choice" in err


def test_keys_create_expires_in_makes_a_key_that_stops_working(run_dt: DT) -> None:
    created = time.time()
    key = run_dt.key("viewer", "--expires-in", "1")
    assert run_dt("workers", key=key)[0] == 0
    shown = next(r.split()[4] for r in run_dt("keys", "list")[1].splitlines() if r.startswith(key.split("_")[1]))
    expires = datetime.fromisoformat(shown).timestamp()  # ISO 8601 in UTC, to the second
    assert shown.endswith("Z") and int(created) <= expires <= time.time() + 1.0
    expires += 1.0  # the second it names may have a fraction left
    deadline = time.monotonic() + 20
    while time.time() <= expires + 0.05:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    code, _, err = run_dt("workers", key=key)
    assert code == 2 and "HTTP 401" in err


# -------------------------------------------------------------------------------------- submit


def test_submit_without_wait_prints_ids_and_returns_at_once(run_dt: DT, tmp_path: Path) -> None:
    code, out, err = run_dt("submit", task_file(tmp_path, [unrunnable("a-1"), unrunnable("a-2")]))
    assert (code, out.split()) == (0, ["a-1", "a-2"]), err
    assert run_dt.task("a-1")["state"] == "pending"


def test_submit_shows_the_coordinators_warnings_on_stderr(run_dt: DT, tmp_path: Path) -> None:
    # the deprecated spelling of a training task is accepted with a warning in the response
    # (docs/tasks.md); dt must pass it on, or a CLI user never learns the spelling is going away
    old = {"task_id": "old-spelling", "type": "benchmark",
           "config": {"kind": "training", "model": "mlp", "nodes": 9, "batch_size": 64, "steps": 5}}
    code, out, err = run_dt("submit", task_file(tmp_path, old))
    assert (code, out.strip()) == (0, "old-spelling"), err
    assert "dt: warning:" in err and "deprecated" in err and '\\"type\\": \\"training\\"' not in err
    assert '{"type": "training", "config": {...}}' in err
    code, _, err = run_dt("submit", task_file(tmp_path, noop("plain")))
    assert code == 0 and "warning" not in err


def test_submit_reads_the_task_file_from_stdin_with_a_dash(run_dt: DT, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(unrunnable("from-stdin"))))
    code, out, err = run_dt("submit", "-")
    assert (code, out.strip()) == (0, "from-stdin"), err
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code, _, err = run_dt("submit", "-")
    assert code == 2 and "not valid JSON" in err


def test_submit_wait_exit_codes_follow_the_outcome(run_dt: DT, tmp_path: Path) -> None:
    run_dt.tc.call(run_dt.tc.c.add_worker())
    code, out, err = run_dt("submit", task_file(tmp_path, noop("ok-1")), "--wait")
    assert (code, out.strip()) == (0, "ok-1"), err
    assert re.search(r"^\S+Z ok-1: (\w+ -> )?succeeded$", err, re.M), err  # a plain progress line: no terminal here
    assert summary_rows(err)["ok-1"][:2] == ["ok-1", "succeeded"]

    bad = {"task_id": "bad-1", "type": "custom", "config": {"name": "sleep", "parameters": {"seconds": "x"}}}
    code, _, err = run_dt("submit", task_file(tmp_path, bad, "bad.json"), "--wait")
    assert code == 1 and summary_rows(err)["bad-1"][:2] == ["bad-1", "error"]

    code, _, err = run_dt("submit", task_file(tmp_path, {"type": "custom"}, "invalid.json"))
    assert code == 2 and "config" in err


def test_submit_timeout_gives_up_on_a_task_that_outlives_it(run_dt: DT, tmp_path: Path) -> None:
    run_dt.tc.call(run_dt.tc.c.add_worker())
    started = time.monotonic()
    code, _, err = run_dt("submit", task_file(tmp_path, sleep("long-1", 20)), "--wait", "--timeout", "0.5")
    assert code == dt.EXIT_GAVE_UP == 4
    row = " ".join(summary_rows(err)["long-1"])
    assert "dt: gave up waiting while running" in row or "dt: gave up waiting while assigned" in row
    assert time.monotonic() - started < 15  # it did not wait for the task
    code, out, _ = run_dt("cancel", "long-1")
    assert (code, out.strip()) == (0, "long-1: cancelled")
    # --timeout alone waits too (as --junit, --json and --fail-if-unschedulable do): the user
    # asked for a bound on a wait, not for no wait at all
    code, _, err = run_dt("submit", task_file(tmp_path, sleep("long-2", 20)), "--timeout", "0.5")
    assert code == dt.EXIT_GAVE_UP, err
    run_dt("cancel", "long-2")


def test_submit_junit_and_json_write_reports_and_imply_wait(run_dt: DT, tmp_path: Path) -> None:
    run_dt.tc.call(run_dt.tc.c.add_worker())
    junit, report = tmp_path / "out" / "report.xml", tmp_path / "new" / "out.json"  # folders made as needed
    code, _, err = run_dt("submit", task_file(tmp_path, [noop("j-1"), sleep("j-2", 0.1)]), "--junit", str(junit))
    assert code == 0, err
    suites = {s.get("name"): s for s in ET.parse(junit).getroot().iter("testsuite")}
    assert set(suites) == {"j-1", "j-2"}
    assert [(tc.get("classname"), tc.get("name")) for tc in suites["j-1"].iter("testcase")] == [("dt.custom", "j-1")]

    code, _, err = run_dt("submit", task_file(tmp_path, [noop("k-1")], "k.json"), "--json", str(report))
    assert code == 0, err
    [task] = json.loads(report.read_text())["tasks"]
    assert (task["task_id"], task["state"], task["result"]["status"]) == ("k-1", "succeeded", "succeeded")


# ------------------------------------------------------------------------ status, cancel, workers


def test_status_cancel_and_workers(run_dt: DT, tmp_path: Path) -> None:
    assert run_dt("submit", task_file(tmp_path, unrunnable("c-1")))[0] == 0
    task = run_dt.task("c-1")
    assert (task["task_id"], task["state"], task["pending_reason"]) == ("c-1", "pending", "no worker is connected")

    code, out, _ = run_dt("cancel", "c-1")
    assert (code, out) == (0, "c-1: cancelled\n")
    assert run_dt.task("c-1")["state"] == "cancelled"
    code, _, err = run_dt("status", "no-such-task")
    assert code == 2 and "HTTP 404" in err

    run_dt.tc.call(run_dt.tc.c.add_worker(worker_id="box-7", name="gpu-box-7", tags=("gpu", "cuda")))
    code, out, _ = run_dt("workers")
    header, *rows = out.splitlines()
    assert header.split()[:4] == ["WORKER_ID", "NAME", "STATE", "REASON"]
    assert rows[0].split()[:6] == ["box-7", "gpu-box-7", "ready", "-", "cpu", "cuda,gpu"]


# ------------------------------------------------------------------------------------ results


ROWS = [
    ResultRow(task_id="r-bert", attempt=1, worker_id="wa", status="succeeded", started_at=10.0, finished_at=12.5,
              received_at=100.0, task_type="benchmark",
              output={"model": "bert", "precision": "fp32", "device": "cpu",
                      "batch_results": [{"batch_size": 1}, {"batch_size": 4}]}),
    ResultRow(task_id="r-vit", attempt=1, worker_id="wb", status="failed", started_at=20.0, finished_at=21.0,
              received_at=200.0, task_type="benchmark", error="boom",
              output={"model": "vit", "precision": "fp16", "device": "cuda", "batch_results": [{"batch_size": 8}]}),
    ResultRow(task_id="r-test", attempt=2, worker_id="wa", status="succeeded", started_at=30.0, finished_at=30.5,
              received_at=300.0, task_type="test", output={"passed": 3, "failed": 0, "skipped": 1}),
]


@pytest.fixture
def seeded(run_dt: DT) -> DT:
    async def seed() -> None:
        await run_dt.tc.c.runtime.store.append(list(ROWS))

    run_dt.tc.call(seed())
    return run_dt


def json_ids(run_dt: DT, *argv: str) -> list[str]:
    code, out, err = run_dt("results", "--format", "json", *argv)
    assert code == 0, err
    return [r["task_id"] for r in json.loads(out)]


def test_results_formats(seeded: DT) -> None:
    code, out, _ = seeded("results", "--format", "json")
    assert code == 0
    assert [(r["task_id"], r["output"].get("model")) for r in json.loads(out)] == [
        ("r-test", None), ("r-vit", "vit"), ("r-bert", "bert")]

    code, out, _ = seeded("results", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["task_id"] for r in rows] == ["r-test", "r-vit", "r-bert"]
    assert (rows[0]["summary"], rows[1]["duration_s"], rows[1]["error"]) == ("3 passed, 0 failed, 1 skipped", "1.0", "boom")

    for argv in (("results",), ("results", "--format", "table")):
        code, out, _ = seeded(*argv)
        header, *lines = out.splitlines()
        assert header.split() == ["TASK_ID", "ATTEMPT", "WORKER_ID", "TASK_TYPE", "STATUS", "FINISHED_AT", "DURATION_S",
                                  "SUMMARY", "ERROR"]
        assert [line.split()[0] for line in lines] == ["r-test", "r-vit", "r-bert"]
        assert "2.500" in lines[2] and "bert fp32 cpu" in lines[2]

    code, _, err = seeded("results", "--format", "xml")
    assert code == 2 and "invalid choice" in err


@pytest.mark.parametrize(("argv", "expected"), [
    (("--task-id", "r-vit"), ["r-vit"]),
    (("--worker-id", "wa"), ["r-test", "r-bert"]),
    (("--status", "failed"), ["r-vit"]),
    (("--batch-size", "4"), ["r-bert"]),
    (("--batch-size", "8"), ["r-vit"]),
    (("--model", "bert"), ["r-bert"]),
    (("--precision", "fp16"), ["r-vit"]),
    (("--hardware", "cuda"), ["r-vit"]),
    (("--limit", "1"), ["r-test"]),
    (("--limit", "2"), ["r-test", "r-vit"]),
    (("--worker-id", "wa", "--status", "succeeded", "--model", "bert"), ["r-bert"]),
])
def test_results_filters(seeded: DT, argv: tuple[str, ...], expected: list[str]) -> None:
    assert json_ids(seeded, *argv) == expected


# --------------------------------------------------------------- connection flags, variables, exit 2


def test_variables_name_the_coordinator_and_key(run_dt: DT, clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("DT_COORDINATOR_URL", run_dt.url)
    clean_env.setenv("DT_API_KEY", run_dt.admin)
    code, out, err = run_dt("keys", "list", flags=False)
    assert code == 0 and out.startswith("KEY_ID"), err


def test_flags_win_over_variables(run_dt: DT, clean_env: pytest.MonkeyPatch) -> None:
    closed = f"http://127.0.0.1:{refusing_port()}"
    clean_env.setenv("DT_COORDINATOR_URL", closed)
    clean_env.setenv("DT_API_KEY", "dtk_bogus_key")
    assert run_dt("keys", "list")[0] == 0  # both flags beat both (unusable) variables

    clean_env.setenv("DT_API_KEY", run_dt.admin)
    code, _, err = run_dt("--coordinator", run_dt.url, "keys", "list", flags=False)
    assert code == 0, err  # --coordinator beats DT_COORDINATOR_URL; the key comes from DT_API_KEY

    clean_env.setenv("DT_COORDINATOR_URL", run_dt.url)
    code, _, err = run_dt("--api-key", "dtk_bogus_key", "keys", "list", flags=False)
    assert code == 2 and "HTTP 401" in err  # --api-key beats the good DT_API_KEY


def test_unreachable_coordinator_exits_2_with_the_reason(capsys: pytest.CaptureFixture[str], clean_env: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{refusing_port()}"
    assert dt.main(["--coordinator", url, "--api-key", "dtk_a_b", "workers"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and f"dt: cannot reach coordinator at {url}" in err and "refused" in err.lower()


@pytest.mark.parametrize(("argv", "env", "needle"), [
    (["--coordinator", "ftp://x", "--api-key", "k"], {}, "dt: --coordinator: expected an http(s) URL"),
    (["--api-key", "k"], {"DT_COORDINATOR_URL": "garbage"}, "dt: DT_COORDINATOR_URL: expected an http(s) URL"),
    (["--coordinator", "http://127.0.0.1:1"], {}, "dt: no credentials: pass --api-key or set DT_API_KEY"),
    (["--coordinator", "http://[::1", "--api-key", "k"], {}, "got 'http://[::1': Invalid IPv6 URL"),
    (["--coordinator", "http://127.0.0.1:abc", "--api-key", "k"], {}, "got 'http://127.0.0.1:abc': Port could not be cast"),
    (["--coordinator", "http://127.0.0.1:99999", "--api-key", "k"], {}, "got 'http://127.0.0.1:99999': Port out of range"),
    (["--coordinator", "http://127.0.0.1:0", "--api-key", "k"], {}, "port 0 is no port to connect to"),
    (["--coordinator", "http://:8080", "--api-key", "k"], {}, "dt: --coordinator: expected an http(s) URL"),
])
def test_bad_connection_settings_exit_2(capsys: pytest.CaptureFixture[str], clean_env: pytest.MonkeyPatch,
                                        argv: list[str], env: dict[str, str], needle: str) -> None:
    for k, v in env.items():
        clean_env.setenv(k, v)
    assert dt.main([*argv, "workers"]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["keys", "create", "--role", "viewer", "--expires-in", "nan"],
    ["keys", "create", "--role", "viewer", "--expires-in", "-1"],
    ["keys", "create", "--role", "viewer", "--expires-in", "inf"],
    ["workers", "drain", "w1", "--deadline", "0"],
    ["workers", "drain", "w1", "--deadline", "nan"],
])
def test_seconds_flags_refuse_what_is_not_a_positive_finite_number_naming_the_flag(
        capsys: pytest.CaptureFixture[str], clean_env: pytest.MonkeyPatch, argv: list[str]) -> None:
    """Refused by dt itself, before any request: nan and inf would otherwise be sent as invalid
    JSON ("not valid JSON"), and 0 or -1 come back named by the API field, not the flag."""
    with pytest.raises(SystemExit) as exited:
        dt.main(["--coordinator", f"http://127.0.0.1:{refusing_port()}", "--api-key", "dtk_a_b", *argv])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {argv[-2]}: must be a finite number of seconds > 0: {argv[-1]!r}" in err, err


@pytest.mark.parametrize(("flag", "target", "why"), [
    ("--junit", "{tmp}", "is a directory, not a file to write"),
    ("--json", "{tmp}/tasks.json/out.json", "tasks.json is not a directory"),
])
@pytest.mark.parametrize("command", [["submit", "{tmp}/tasks.json"], ["compare", "t1", "t2"]])
def test_a_report_file_that_cannot_be_written_is_refused_before_anything_is_submitted_or_read(
        capsys: pytest.CaptureFixture[str], clean_env: pytest.MonkeyPatch, tmp_path: Path,
        flag: str, target: str, why: str, command: list[str]) -> None:
    """Found at once (exit 2), not after a wait of an hour as a traceback that reads as a failed task."""
    (tmp_path / "tasks.json").write_text('{"type": "custom", "config": {"name": "noop"}}')
    with pytest.raises(SystemExit) as exited:  # an unreachable coordinator: nothing was sent before the refusal
        dt.main(["--coordinator", f"http://127.0.0.1:{refusing_port()}", "--api-key", "dtk_a_b",
                 *(a.format(tmp=tmp_path) for a in command), flag, target.format(tmp=tmp_path)])
    assert exited.value.code == 2
    assert f"argument {flag}: " in (err := capsys.readouterr().err) and why in err, err


def test_a_submission_the_coordinator_refuses_as_too_large_exits_2_not_as_a_failed_task(run_dt: DT, tmp_path: Path) -> None:
    """Exit 1 says a task failed (README's table); a refused request is input to fix (2)."""
    big = task_file(tmp_path, {"type": "custom", "config": {"name": "noop", "parameters": {"x": "y" * (17 << 20)}}})
    code, out, err = run_dt("submit", big)
    assert (code, out) == (2, "") and "HTTP 413" in err, err


def test_a_baseline_task_without_any_result_is_a_mistyped_id_exit_2(seeded: DT, tmp_path: Path) -> None:
    """A mistyped ``--baseline`` left every result NOT COMPARED and exited 0: the gate was open."""
    code, _, err = seeded("compare", "r-bert", "--baseline", "r-bret")
    assert code == 2 and "--baseline r-bret: that task has no result (mistyped" in err, err
    doc = task_file(tmp_path, {"task_id": "never-sent", "type": "custom", "config": {"name": "noop"}})
    code, out, err = seeded("submit", doc, "--baseline", "r-bret")
    assert (code, out) == (2, "") and "--baseline r-bret" in err  # refused before the tasks were submitted
    assert seeded("status", "never-sent")[0] == 2


@pytest.mark.parametrize(("text", "said"), [
    ('{"type": "custom", "config": {"name": "noop", "parameters": {"x": NaN}}}', "NaN is not a JSON value"),
    ('{"type": "custom", "config": {"name": "noop", "parameters": {"x": -Infinity}}}', "-Infinity is not a JSON value"),
    ('{"type": "custom", "config": {"name": "noop", "parameters": {"x": 1e400}}}', "1e400 is beyond what a JSON number"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_a_task_file_python_reads_but_json_does_not_allow_is_refused_naming_why(
        capsys: pytest.CaptureFixture[str], clean_env: pytest.MonkeyPatch, tmp_path: Path, text: str, said: str) -> None:
    """Python's json reads NaN, Infinity and 1e400 (as inf); the API refuses them as malformed at
    some byte, and deep nesting was a RecursionError traceback."""
    path = tmp_path / "tasks.json"
    path.write_text(text)
    assert dt.main(["--coordinator", f"http://127.0.0.1:{refusing_port()}", "--api-key", "k", "submit", str(path)]) == 2
    assert f"dt: {path}: not valid JSON: {said}" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "said"), [
    (["--threshold", "-5"], "--threshold: a slowdown in percent above 0 and below 1000, got -5"),
    (["--threshold", "0"], "--threshold: a slowdown in percent above 0 and below 1000, got 0"),
    (["--confidence", "150"], "--confidence: a level in percent above 50 and below 100, got 150"),
])
def test_compare_policy_flags_are_refused_in_the_percent_they_are_given_in(
        capsys: pytest.CaptureFixture[str], clean_env: pytest.MonkeyPatch, argv: list[str], said: str) -> None:
    assert dt.main(["--coordinator", f"http://127.0.0.1:{refusing_port()}", "--api-key", "k", "compare", "t1", *argv]) == 2
    assert f"dt: {said}" in capsys.readouterr().err


def test_https_to_a_plain_http_coordinator_fails_at_once_saying_so(run_dt: DT, capsys: pytest.CaptureFixture[str]) -> None:
    """The coordinator ends a connection that opens with a TLS handshake (it waited for a request
    head until --header-timeout, and dt said only "timed out")."""
    url = run_dt.url.replace("http://", "https://")
    code = dt.main(["--coordinator", url, "--api-key", run_dt.admin, "workers"])
    err = capsys.readouterr().err
    assert code == 2 and f"cannot reach coordinator at {url}" in err, err
    assert f"if the coordinator serves plain http, use {run_dt.url}" in err and "timed out" not in err, err


def test_submit_with_a_baseline_checks_the_comparison_flags_before_submitting(run_dt: DT, tmp_path: Path) -> None:
    doc = task_file(tmp_path, {"task_id": "not-sent", "type": "custom", "config": {"name": "noop"}})
    code, out, err = run_dt("submit", doc, "--baseline", "latest", "--threshold", "0")
    assert (code, out) == (2, "") and "--threshold: a slowdown in percent" in err, err
    assert run_dt("status", "not-sent")[0] == 2  # nothing was submitted
