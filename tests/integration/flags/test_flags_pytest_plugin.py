"""The pytest plugin's own flags refuse a bad value as a usage error naming the flag (exit 4,
no traceback), before any test is collected or sent: a URL without a scheme (``--dt-coordinator``)
and a negative or non-finite ``--dt-timeout`` / ``--dt-unschedulable-timeout`` (which would
otherwise error every test at once)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from distributed_testing.testing.suites import plugin_args

pytestmark = [pytest.mark.timeout(120)]


def _pytest(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (root / "test_one.py").write_text("def test_one():\n    pass\n")
    return subprocess.run(
        [sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "-p", "no:randomly",
         "--rootdir", str(root), *args],
        cwd=root, env={"PATH": "/usr/bin:/bin", "DT_API_KEY": "dtk_x_y"},
        capture_output=True, text=True, timeout=100)


def test_a_coordinator_url_without_a_scheme_is_a_usage_error(tmp_path: Path) -> None:
    run = _pytest(tmp_path, "--dt-coordinator", "127.0.0.1:1")
    out = run.stdout + run.stderr
    assert run.returncode == 4, out
    assert "INTERNALERROR" not in out and "Traceback" not in out, out
    assert "--dt-coordinator: expected an http(s) URL" in out and "'127.0.0.1:1'" in out, out


@pytest.mark.parametrize("flag", ["--dt-timeout", "--dt-unschedulable-timeout"])
@pytest.mark.parametrize("value", ["-3", "inf", "soon"])
def test_a_timeout_that_is_not_seconds_is_a_usage_error(tmp_path: Path, flag: str, value: str) -> None:
    run = _pytest(tmp_path, "--dt-coordinator", "http://127.0.0.1:1", flag, value)
    out = run.stdout + run.stderr
    assert run.returncode == 4, out
    assert f"argument {flag}:" in out and repr(value) in out, out
    assert " passed" not in out and "INTERNALERROR" not in out, out
