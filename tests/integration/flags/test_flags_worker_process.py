"""The real ``run_worker_example.py`` process: --reconnect-attempts, --reconnect-interval and
--log-level seen from the outside (exit code and log), with no coordinator listening.

Both workers run at once, torch and openvino hidden from their accelerator probes (seconds each)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from flags_support import ROOT, Procs, refusing_port

from distributed_testing.testing import hidden_accelerators

pytestmark = pytest.mark.timeout(120)

RETRY = re.compile(r"attempt (\d+), retrying in ([0-9.]+)s")


def test_worker_gives_up_after_reconnect_attempts_and_exits_1(tmp_path: Path, procs: Procs) -> None:
    url = f"http://127.0.0.1:{refusing_port()}"  # nothing listens there
    logs = {name: tmp_path / f"{name}.log" for name in ("debug", "warning")}
    runs = {
        "debug": procs.start([str(ROOT / "run_worker_example.py"), "--coordinator", url, "--api-key", "dtk_x_y",
                              "--reconnect-attempts", "2", "--reconnect-interval", "0.05", "--log-level", "DEBUG"],
                             logs["debug"], env=hidden_accelerators(tmp_path), drop_env=["DT_API_KEY", "DT_COORDINATOR_URL"]),
        "warning": procs.start([str(ROOT / "run_worker_example.py"), "--coordinator", url, "--api-key", "dtk_x_y",
                                "--reconnect-attempts", "4", "--reconnect-interval", "0.2", "--log-level", "WARNING"],
                               logs["warning"], env=hidden_accelerators(tmp_path),
                               drop_env=["DT_API_KEY", "DT_COORDINATOR_URL"]),
    }
    codes = {}
    for name, p in runs.items():
        try:
            codes[name] = p.wait(100)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} worker still running:\n{logs[name].read_text()[-3000:]}")
    text = {name: log.read_text() for name, log in logs.items()}
    assert codes == {"debug": 1, "warning": 1}, text

    # --reconnect-attempts N: N connects, N-1 waits, then a clear "gave up" and exit 1
    assert "giving up after 2 reconnect attempts" in text["debug"]
    assert "giving up after 4 reconnect attempts" in text["warning"]
    assert "gave up after 2 attempts" in text["debug"] and "Traceback" not in text["debug"]
    debug_waits = [(int(n), float(d)) for n, d in RETRY.findall(text["debug"])]
    warning_waits = [(int(n), float(d)) for n, d in RETRY.findall(text["warning"])]
    assert [n for n, _ in debug_waits] == [1]
    assert [n for n, _ in warning_waits] == [1, 2, 3]

    # --reconnect-interval S: the first wait is S (+-20 % jitter), then it doubles
    for waits, base in ((debug_waits, 0.05), (warning_waits, 0.2)):
        for n, d in waits:
            expected = base * 2 ** (n - 1)
            assert expected * 0.8 - 0.006 <= d <= expected * 1.2 + 0.006, (base, waits)  # log rounds to 0.01

    # --log-level: DEBUG shows debug and info records; WARNING hides both
    assert " DEBUG " in text["debug"] and " INFO distributed_testing.worker.factory: detected" in text["debug"]
    assert " DEBUG " not in text["warning"] and " INFO " not in text["warning"]
    assert " WARNING distributed_testing.retry: " in text["warning"]
