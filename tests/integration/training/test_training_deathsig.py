import subprocess
import sys
import time

import psutil
import pytest

pytestmark = pytest.mark.timeout(20)

# The middle process starts a sleeper through the exec shim, gives it a second to set its death
# signal and exec, then exits: the sleeper must die with it instead of being re-parented.
SPAWN_AND_EXIT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-m", "distributed_testing.training.deathsig", "SIGKILL", "--",
                          sys.executable, "-c", "import time; time.sleep(30)"])
print(child.pid, flush=True)
time.sleep(1.0)
"""


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_exec_shim_child_dies_with_its_parent() -> None:
    middle = subprocess.run([sys.executable, "-c", SPAWN_AND_EXIT], capture_output=True, text=True, check=True)
    sleeper = int(middle.stdout.split()[0])
    deadline = time.monotonic() + 5
    while running(sleeper):
        assert time.monotonic() < deadline, f"process {sleeper} outlived its parent"
        time.sleep(0.05)
