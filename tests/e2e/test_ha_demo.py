"""``scripts/ha-demo.sh`` as the README gives it: three PostgreSQL-backed coordinators and two
workers on a fresh database of its own, the leader SIGKILLed mid-run, and every task completing
exactly once (the script exits 0 only then)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(300)


def test_ha_demo_kills_the_leader_and_every_task_completes_once() -> None:
    done = subprocess.run(["bash", "scripts/ha-demo.sh"], cwd=ROOT, capture_output=True, text=True, timeout=280)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "SIGKILLed the leader" in out, out
    took = re.search(r"leads after ([0-9.]+)s", out)
    assert took is not None, out
    assert float(took.group(1)) < 5.0, out  # documented: a standby takes over within about a second
    assert "60 of 60 tasks succeeded; tasks with other than one outcome: none" in out, out
