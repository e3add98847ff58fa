"""The worker's last resort covers its whole way out, the event loop's teardown included.

``asyncio.run`` ends by waiting for the default executor's threads, without a bound: a thread stuck
in a driver call (here NVML's utilisation read, as the heartbeat loop's sampler makes it with
``--max-gpu-percent``) kept a worker whose drain had completed running for ever, although the
docs (operations.md, Draining) promise that a stop not finished 60 s after the drain's deadline
ends the process, whatever it waits for. The deadline armed when the stop began was cancelled as
soon as the agent's coroutine returned, and the one ``entry`` arms was armed only once
``asyncio.run`` had returned, which it never did.

The stuck driver is a stand-in ``libnvidia-ml.so.1`` (C, built here with the system's compiler)
whose utilisation read blocks once a file exists. The grace is shortened in the worker process
(``EXIT_GRACE_S``) so the test takes seconds, not a minute.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from distributed_testing.testing import Procs, Rest, hidden_accelerators, start_coordinator_process, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120),
              pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build a stand-in NVML")]

FAKE_NVML = r"""
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
typedef struct { unsigned int gpu, memory; } util_t;
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlSystemGetDriverVersion(char *buf, unsigned int n) { strncpy(buf, "999.0", n); return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 1; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) { *h = (void *)1; return 0; }
int nvmlDeviceGetUtilizationRates(void *h, util_t *u) {
    const char *hang = getenv("FAKE_NVML_HANG_FILE");
    while (hang && access(hang, F_OK) == 0) sleep(1);  /* a driver call that does not return */
    u->gpu = 0; u->memory = 0;
    return 0;
}
"""
GRACE_S = 3.0
LAUNCH = (f"import sys; from distributed_testing.cli import worker; worker.EXIT_GRACE_S = {GRACE_S}; "
          "sys.exit(worker.entry())")


def test_a_thread_stuck_in_a_driver_call_does_not_keep_a_drained_worker_alive(procs: Procs, tmp_path: Path) -> None:
    lib = tmp_path / "nvml"
    lib.mkdir()
    (lib / "nvml.c").write_text(FAKE_NVML)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib / "libnvidia-ml.so.1"), str(lib / "nvml.c")], check=True)
    hang = tmp_path / "hang"

    _, port = start_coordinator_process(procs, tmp_path / "c" / "c.duckdb")
    url = f"http://127.0.0.1:{port}"
    rest = Rest(url, (tmp_path / "c" / "admin.key").read_text().strip())
    log = tmp_path / "worker.log"
    env = {**hidden_accelerators(tmp_path), "DT_SANDBOX": "none", "LD_LIBRARY_PATH": str(lib),
           "FAKE_NVML_HANG_FILE": str(hang)}
    worker = procs.start(["-c", LAUNCH, "--coordinator", url, "--api-key", rest.create_key("worker"),
                          "--worker-id", "w0", "--test-root", str(tmp_path), "--max-gpu-percent", "90",
                          "--drain-timeout", "1"], log, env=env)
    wait_until(lambda: rest.workers().get("w0", {}).get("state") == "ready", 120, "the worker to register",
               interval=0.2)
    hang.touch()  # the sampler's next read (within a second: limits are sampled every second) blocks
    time.sleep(2.0)
    worker.send_signal(signal.SIGTERM)
    wait_until(lambda: "drain complete" in log.read_text(errors="replace"), 30, "the drain to complete")
    try:
        code = worker.wait(1 + GRACE_S + 20)
    except subprocess.TimeoutExpired:
        pytest.fail("the worker was still running 20 s past its exit deadline:\n"
                    f"{log.read_text(errors='replace')[-3000:]}")
    finally:
        hang.unlink(missing_ok=True)
    text = log.read_text(errors="replace")
    assert code == 1, text[-3000:]
    assert "exiting now (exit status 1)" in text, text[-3000:]
    assert "nvmlDeviceGetUtilizationRates" in text or "limits.py" in text, text[-3000:]  # the stuck thread's stack
