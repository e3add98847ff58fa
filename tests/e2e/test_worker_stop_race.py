"""A worker process stops when its drain and its coordinator's shutdown reach it together, and the
last resort ends a process whose stop does not.

The regression: a worker whose drain began one to three event-loop turns before its session ended
never exited. The drain wakes the heartbeat loop at once, the session's end cancels that loop, and
on Python 3.11 ``asyncio.wait_for`` then returned the wake-up and dropped the cancel: the heartbeat
loop went on for ever, the session's teardown waited for it, and the log ended with ``drain
complete`` while the process and its warm pool child stayed. Seen with SIGTERM sent to a
coordinator and its worker at the same moment; in a loop of such kills it hung about one time in
eight, when the signal came a millisecond or two before the coordinator's close frame.

Here the two arrive together by construction: the worker is paused (SIGSTOP) while the coordinator
asks it to drain and then shuts down, so its socket holds the ``drain`` frame and the close frame
when it resumes, and it reads both in one turn. Before the fix it hung every time. The second
case starts the drain with SIGTERM instead, the incident's shape: the signal takes a few turns
more to reach the drain, so it does not meet the race every time.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distributed_testing.testing import Procs, Rest, hidden_accelerators, start_coordinator_process, wait_until
from distributed_testing.worker.executors.proc import pid_alive

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
ROOT = Path(__file__).resolve().parents[2]
# The stop takes well under a second here; a worker still running after this would not stop on its
# own (the last resort would end it only a minute later).
EXIT_BOUND_S = 30.0


@pytest.mark.parametrize("drain_by", ["coordinator", "sigterm"])
def test_a_drain_that_meets_the_coordinators_shutdown_ends_the_worker(procs: Procs, tmp_path: Path,
                                                                      drain_by: str) -> None:
    # A 10 s heartbeat: nothing of the worker's is due while it is paused, so on resuming it
    # reads the two frames before any timer fires (as when they arrive a moment apart).
    coordinator, port = start_coordinator_process(procs, tmp_path / "c" / "c.duckdb",
                                                  args=["--heartbeat-interval", "10", "--worker-ttl", "30"])
    url = f"http://127.0.0.1:{port}"
    rest = Rest(url, (tmp_path / "c" / "admin.key").read_text().strip())
    log = tmp_path / "worker.log"
    worker = procs.start(["run_worker_example.py", "--coordinator", url, "--api-key", rest.create_key("worker"),
                          "--worker-id", "w0", "--test-root", str(tmp_path)], log,
                         env={**hidden_accelerators(tmp_path), "DT_SANDBOX": "none"})  # neither matters here
    wait_until(lambda: rest.workers().get("w0", {}).get("state") == "ready", 120, "the worker to register",
               interval=0.2)
    time.sleep(0.5)  # its heartbeat loop waits for the next beat, as on any idle worker

    worker.send_signal(signal.SIGSTOP)
    try:
        if drain_by == "coordinator":
            assert rest.request("POST", "/api/v1/workers/w0/drain", json={"deadline_s": 5, "reason": "test"})[0] == 202
        else:
            worker.send_signal(signal.SIGTERM)  # delivered when it resumes
        coordinator.send_signal(signal.SIGTERM)
        assert coordinator.wait(30) == 0
    finally:
        worker.send_signal(signal.SIGCONT)

    try:
        code = worker.wait(EXIT_BOUND_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker was still running {EXIT_BOUND_S:g}s after its drain began:\n"
                    f"{log.read_text(errors='replace')[-3000:]}")
    text = log.read_text(errors="replace")
    assert code == 0, text[-3000:]
    assert "drain complete; unregistered from the coordinator" in text
    for trouble in ("Traceback", "CRITICAL", "not waiting for it any longer", "not waiting for them any longer"):
        assert trouble not in text, text[-3000:]


LAST_RESORT = """
import logging, subprocess, sys, threading
from distributed_testing.process.deadline import ExitDeadline
logging.basicConfig(level=logging.INFO)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
print(child.pid, flush=True)
deadline = ExitDeadline()
deadline.arm(600, "a far deadline")
deadline.arm(0.5, "a stop that hangs")  # the closer one wins
deadline.arm(300, "a later one")  # and stays
threading.Event().wait()  # a stop that never ends
"""


def test_the_last_resort_kills_the_children_and_exits() -> None:
    proc = subprocess.Popen([sys.executable, "-c", LAST_RESORT], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    child = int(out.split()[0])
    assert "still running 0.5s after a stop that hangs; exiting now (exit status 1)" in err
    assert f"killed 1 child process(es): {child}" in err
    assert "threading.py" in err  # every thread's stack: what it waited for
    wait_until(lambda: not pid_alive(child), 10, "the child to be gone")  # a zombie until init reaps it
