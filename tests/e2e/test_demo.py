"""The README's demo (``scripts/demo.sh`` runs ``python -m distributed_testing.cli.demo`` after
setting up .venv), run here without the set-up: a coordinator on the embedded DuckDB store, two
worker processes, a pytest run, two small benchmarks that report each configuration as it
finishes, three custom handlers, the results, and a coordinator restart that finds them all; the
tasks form a run whose dashboard page the demo links, and ``--keep-running`` leaves everything up
until SIGINT. The long benchmark it used to run is an example task file the demo and the README
name."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from distributed_testing.cli.demo import LONG_EXAMPLE, TASKS
from distributed_testing.tasks import spec as specs

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


def _run_demo(state: Path) -> tuple[int, str]:
    """The demo with --keep-running: its output up to the line that says it keeps running, checked
    there (its run through the coordinator and on the dashboard), then SIGINT; (exit status, output)."""
    demo = subprocess.Popen([sys.executable, "-m", "distributed_testing.cli.demo", "--state-dir", str(state),
                             "--keep-running"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert demo.stdout is not None
        lines = []
        for line in demo.stdout:
            lines.append(line)
            if line.startswith("still running (--keep-running)"):
                _check_the_run_while_it_keeps_running("".join(lines), state)
                break
        demo.send_signal(signal.SIGINT)
        lines.append(demo.stdout.read())
        return demo.wait(60), "".join(lines)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()


def _check_the_run_while_it_keeps_running(out: str, state: Path) -> None:
    """The run line links the dashboard's run page, which serves; the restarted coordinator (same
    port) has the run with its six tasks succeeded."""
    link = re.search(r"^run (run-[0-9a-f]+) \(demo\): (http://127\.0\.0\.1:\d+)/runs/(run-[0-9a-f]+)$", out, re.M)
    assert link is not None and link.group(1) == link.group(3), out
    run_id, dashboard = link.group(1), link.group(2)
    assert f"the run's page is {dashboard}/runs/{run_id}" in out
    assert f"dashboard at {dashboard} " in out
    with urllib.request.urlopen(f"{dashboard}/runs/{run_id}", timeout=10) as page:  # or its sign-in page
        assert page.status == 200
    coordinator = re.search(r"^coordinator up at (\S+) ", out, re.M)
    assert coordinator is not None
    request = urllib.request.Request(f"{coordinator.group(1)}/api/v1/runs/{run_id}",
                                     headers={"Authorization": f"Bearer {(state / 'admin.key').read_text().strip()}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        run = json.load(answer)
    assert sorted(t["task_id"] for t in run["tasks"]) == sorted(t["task_id"] for t in TASKS)
    assert {t["state"] for t in run["tasks"]} == {"succeeded"}


def test_the_demo_runs_each_kind_of_task_shows_benchmark_progress_and_survives_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "demo-state"
    code, out = _run_demo(state)
    logs = "".join(f"\n--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(state.glob("*.log")))
    assert code == 0, f"{out}{logs}"
    assert {t["type"] for t in TASKS} == {"test", "benchmark", "custom"}
    assert re.search(r"^demo-worker-1\s+ready\b", out, re.M) and re.search(r"^demo-worker-2\s+ready\b", out, re.M)
    for task in TASKS:
        assert re.search(rf"Z {task['task_id']}: \S+ -> succeeded$", out, re.M), (task["task_id"], out)
    # each configuration is printed as it finishes: some reach the demo's polls, all reach the workers' logs
    progress = re.compile(r"(benchmark-cnn-001: cnn b[148] fp32|benchmark-mlp-int8: mlp b(1|32) int8): "
                          r"\d+\.\d+ ms \(\d of [23]\)$", re.M)
    assert progress.search(out), out
    worker_logs = "".join(p.read_text() for p in state.glob("worker-*.log"))
    for line in ("cnn b1 fp32", "cnn b4 fp32", "cnn b8 fp32", "mlp b1 int8", "mlp b32 int8"):
        assert re.search(rf"benchmark child \d+: {line}: \d+\.\d+ ms \(\d of \d\)", worker_logs), line
    assert "3 passed, 0 failed, 0 skipped" in out  # the pytest run's summary in the results table
    assert "after restart: 6 tasks, states ['succeeded'], 6 results" in out
    assert f"dt submit {LONG_EXAMPLE} --wait" in out and re.search(r"^demo succeeded in \d+ s", out, re.M)


def test_the_long_benchmark_is_an_example_the_readme_names() -> None:
    (long,) = specs.parse_tasks(json.loads((ROOT / LONG_EXAMPLE).read_text()))
    assert (long.type, long.config["model"], long.config["batch_sizes"]) == (
        "benchmark", "bert-base-uncased", [1, 2, 4, 8, 16])
    assert LONG_EXAMPLE in (ROOT / "README.md").read_text()
    assert Path(LONG_EXAMPLE).name in (ROOT / "examples" / "README.md").read_text()
