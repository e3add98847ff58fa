"""The README's bundle block, run as written: the bash block after ``<!-- bundle-walkthrough -->``
in README.md runs in a temporary directory with the virtual environment's ``dt``,
``dt-coordinator`` and ``dt-worker`` on PATH (only the port changes). The worker is a real
``--accept-bundles`` worker, so the shipped test runs inside bubblewrap; the second submit, after a
one-file change, uploads that file alone and runs under a new run with a derived task id, and the
file .gitignore names is not shipped."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_readme_walkthrough import ROOT, run_script  # tests/e2e is on sys.path (rootdir-relative import)

from distributed_testing.testing import free_port
from distributed_testing.worker.sandbox import available

MARKER = "<!-- bundle-walkthrough -->"
pytestmark = [pytest.mark.timeout(260), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]


def block(readme: str) -> str:
    assert MARKER in readme, f"README.md has no {MARKER} block"
    match = re.search(r"```bash\n(.*?)```", readme[readme.index(MARKER):], re.S)
    assert match is not None, f"no ```bash block after {MARKER}"
    return match.group(1)


def test_readme_bundle_block_runs_as_written(tmp_path: Path) -> None:
    script = block((ROOT / "README.md").read_text()).replace("8080", str(free_port()))
    done = run_script(script, tmp_path, timeout=240)  # four processes start on a loaded machine
    logs = "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("*.log")))
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}{logs}"
    uploads = re.findall(r"^bundle ([0-9a-f]{64}): (\d+) files \(\d+ bytes\), uploaded (\d+) \((\d+) bytes\)",
                         done.stderr, re.M)
    assert len(uploads) == 2, done.stderr
    (first, files, sent, _), (again, _, sent_again, bytes_again) = uploads
    assert files == "3" and sent == "3"  # test_mine.py, data.txt, .gitignore: not local.env
    assert again != first and sent_again == "1"  # the changed test file alone
    runs = re.findall(r"^run run-([0-9a-f]{12}) \(mytasks\.json\): ", done.stderr, re.M)
    assert len(runs) == 2, done.stderr
    derived = f"mine@{runs[1]}"  # the id holds the first run's body: the second run names its own
    assert done.stdout.split()[:2] == ["mine", derived]
    rows = {line.split()[0]: line.split()[1] for line in done.stderr.splitlines()
            if line.split()[:1] in (["mine"], [derived])}
    assert rows == {"mine": "succeeded", derived: "succeeded"}, done.stderr
    assert all(f"run-{r}" in done.stdout for r in runs)  # dt runs lists both
