"""A shipped test, run by a real worker in bubblewrap, tries to reach what is the worker's: its
key file, outbox, state directory, environment, another running task's files and, with
``--task-network none``, the network. Every attempt fails, while it reads its bundle and writes its
scratch directory; with ``--sandbox none`` the same reads succeed (the probe is not vacuous)."""

from __future__ import annotations

import asyncio
import os
import socket
import textwrap
from pathlib import Path

import pytest

from distributed_testing.bundles.upload import upload
from distributed_testing.testing import run_cluster, wait_for
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

PROBE = '''
import os, socket, pathlib, pytest

KEY, OUTBOX, STATE, OTHER, PID, PORT = {key!r}, {outbox!r}, {state!r}, {other!r}, {pid}, {port}

def blocked(action):
    try:
        action()
    except OSError:
        return True
    return False

def test_reaches_nothing_of_the_worker():
    assert pathlib.Path("data.txt").read_text() == "bundle data"  # its own bundle
    home = pathlib.Path(os.environ["HOME"])
    (home / "written.txt").write_text("ok")  # its scratch
    assert (home / "written.txt").read_text() == "ok"
    assert blocked(lambda: open(KEY).read()), "read the worker's key file"
    assert blocked(lambda: open(OUTBOX, "rb").read()), "read the worker's outbox"
    assert blocked(lambda: open(OTHER).read()), "read another running task's file"
    assert blocked(lambda: open(f"/proc/{{PID}}/environ", "rb").read()), "read the worker's environment"
    assert blocked(lambda: open(os.path.join(STATE, "planted"), "w").write("x")), "wrote the worker's state dir"
    assert blocked(lambda: pathlib.Path("data.txt").write_text("changed")), "changed its bundle"
    assert "DT_CANARY" not in os.environ
    assert blocked(lambda: socket.create_connection(("127.0.0.1", PORT), timeout=2)), "connected out"
'''
HOLDER = "import time\n\ndef test_hold(tmp_path):\n    import os, pathlib\n" \
         "    (pathlib.Path(os.environ['HOME']) / 'mine.txt').write_text('secret')\n    time.sleep(60)\n"


def make_bundle(root: Path, test: str) -> Path:
    root.mkdir(parents=True)
    (root / "test_probe.py").write_text(test)
    (root / "data.txt").write_text("bundle data")
    return root


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
async def test_a_shipped_test_reaches_nothing_of_the_worker(tmp_path: Path, sandbox: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DT_CANARY", "worker-secret")
    state = tmp_path / "state"
    state.mkdir()
    key_file = state / "worker.key"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    async with run_cluster(tmp_path / "c", workers=0) as c:
        await c.add_worker(accept_bundles=True, sandbox=sandbox, task_network="none", max_concurrent_tasks=2,
                           db_path=state / "outbox.duckdb")
        key_file.write_text(c.worker_keys["w0"])
        code = await c.create_key("submitter", allow_code=True)
        holder = await asyncio.to_thread(upload, c.base_url, code, make_bundle(tmp_path / "h", HOLDER))
        [hid] = await c.submit({"type": "test", "config": {"test_file": "test_probe.py"}, "bundle": holder}, key=code)
        tasks_root = next(state.glob("bundles-*")) / "tasks"
        await wait_for(lambda: any(tasks_root.glob("*/scratch/mine.txt")), timeout=60, what="the holder to start")
        other = str(next(tasks_root.glob("*/scratch/mine.txt")))
        probe = PROBE.format(key=str(key_file), outbox=str(state / "outbox.duckdb"), state=str(state), other=other,
                             pid=os.getpid(), port=listener.getsockname()[1])
        digest = await asyncio.to_thread(upload, c.base_url, code, make_bundle(tmp_path / "p", textwrap.dedent(probe)))
        [pid] = await c.submit({"type": "test", "config": {"test_file": "test_probe.py"}, "bundle": digest}, key=code)
        done = await c.wait(pid, timeout=60)
        await c.request("POST", f"/api/v1/tasks/{hid}/cancel")
    listener.close()
    outcome = done["outcome"] or {}
    if sandbox == "bwrap":
        assert outcome.get("status") == "succeeded", (done.get("result") or {}).get("output", {}).get("stdout_tail")
        assert not (state / "planted").exists()
    else:  # unconfined: the first forbidden read succeeds, so the probe fails there
        assert outcome.get("status") == "failed", done
        assert "read the worker's key file" in str(done.get("result") or done)
