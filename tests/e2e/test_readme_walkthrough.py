"""The README's walkthrough, run as written: the bash block after ``<!-- walkthrough -->`` in
README.md runs in a temporary directory holding a copy of examples/, with the virtual
environment's ``dt``, ``dt-coordinator`` and ``dt-worker`` on PATH. Only the port changes (8080
becomes a free one, so tests can run side by side); the coordinator and worker it starts are real
processes, and the whole process group is killed at the end whatever happened."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import junitparser
import pytest

from distributed_testing.testing import free_port

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- walkthrough -->"
pytestmark = pytest.mark.timeout(120)


def walkthrough(readme: str) -> str:
    """The fenced bash block that follows ``MARKER`` in ``readme``."""
    assert MARKER in readme, f"README.md has no {MARKER} block"
    match = re.search(r"```bash\n(.*?)```", readme[readme.index(MARKER):], re.S)
    assert match is not None, f"no ```bash block after {MARKER}"
    return match.group(1)


def run_script(script: str, cwd: Path, timeout: float = 100) -> subprocess.CompletedProcess[str]:
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "dt").exists(), f"{bin_dir} has no dt: install the package (pip install -e .)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DT_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)  # this checkout's code, even where another one is installed
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything it left running
        except ProcessLookupError:
            pass
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_readme_walkthrough_runs_as_written(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    port = free_port()
    script = walkthrough((ROOT / "README.md").read_text()).replace("8080", str(port))
    done = run_script(script, tmp_path)
    logs = "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("*.log")))
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}{logs}"

    submitted = ["example-tests", "example-bench-mlp", "example-sleep"]
    assert done.stdout.split()[:3] == submitted  # dt submit prints only the ids
    summary = done.stderr[done.stderr.rindex("TASK "):].splitlines()
    assert summary[0].split() == ["TASK", "STATE", "WORKER", "DURATION_S", "RESULT", "ERROR"]
    assert {line.split()[0]: line.split()[1] for line in summary[1:4]} == dict.fromkeys(submitted, "succeeded")
    assert re.search(r"^\S+Z example-sleep: .*running on ", done.stderr, re.M)  # plain progress: no terminal
    assert '"task_id": "example-tests"' in done.stdout and '"state": "succeeded"' in done.stdout  # dt status
    assert re.search(r'"submitted_at": "\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"', done.stdout)
    assert "5 passed, 0 failed, 1 skipped" in done.stdout  # dt results: the pytest file's outcome
    assert "mlp fp32 cpu random weights: bs1 " in done.stdout  # dt results: the benchmark's medians and verdicts

    xml = junitparser.JUnitXml.fromfile(str(tmp_path / "report.xml"))
    suites = {s.name: s for s in xml}
    assert set(suites) == set(submitted)
    tests = suites["example-tests"]
    assert (tests.tests, tests.failures, tests.errors, tests.skipped) == (6, 0, 0, 1)
    cases = {(c.classname, c.name) for c in tests}
    assert ("test_example.TestArithmetic", "test_square_root[9-3]") in cases
    assert ("test_example", "test_sorting_is_stable") in cases
    bench_cases = [(c.classname, c.name) for c in suites["example-bench-mlp"]]  # one per batch size
    assert bench_cases and all(cls == "dt.benchmark.mlp" and name.startswith("example-bench-mlp[bs=")
                               for cls, name in bench_cases), bench_cases
