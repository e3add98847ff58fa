"""A shipped test, run by a real worker in bubblewrap, tries to reach what is the worker's: its
key file, outbox, state directory, environment, another running task's files and, with
``--task-network none``, the network. Every attempt fails, while it reads its bundle and writes its
scratch directory; with ``--sandbox none`` the same reads succeed (the probe is not vacuous). A
shipped custom handler makes the same attempts."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from probe_support import PRELUDE

from distributed_testing.bundles.upload import upload
from distributed_testing.testing import run_cluster, wait_for
from distributed_testing.worker.sandbox import SCRATCH_NAME, available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

PROBE = '''
import os, socket, pathlib, pytest
'''+PRELUDE+'''
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
    assert "DT_CANARY" not in os.environ
    assert blocked(lambda: socket.create_connection(("127.0.0.1", PORT), timeout=2)), "connected out"
'''
HOLDER = "import time\n\ndef test_hold(tmp_path):\n    import os, pathlib\n" \
         "    (pathlib.Path(os.environ['HOME']) / 'mine.txt').write_text('secret')\n    time.sleep(60)\n"


HANDLER = '''
import os, socket, pathlib
'''+PRELUDE+'''
def run(parameters, ctx):
    """The test probe's attempts from a shipped custom handler: which of them got through."""
    (ctx.work_dir / "written.txt").write_text("ok")
    bundle = pathlib.Path("data.txt").read_text()
    attempts = {{
        "read the worker's key file": lambda: open(KEY).read(),
        "read the worker's outbox": lambda: open(OUTBOX, "rb").read(),
        "read another running task's file": lambda: open(OTHER).read(),
        "read the worker's environment": lambda: open(f"/proc/{{PID}}/environ", "rb").read(),
        "wrote the worker's state dir": lambda: open(os.path.join(STATE, "planted"), "w").write("x"),
        "connected out": lambda: socket.create_connection(("127.0.0.1", PORT), timeout=2),
    }}
    reached = [what for what, attempt in attempts.items() if not blocked(attempt)]
    if "DT_CANARY" in os.environ:
        reached.append("saw the worker's environment variable")
    return {{"bundle": bundle, "scratch": (ctx.work_dir / "written.txt").read_text(),
            "cache_dir": None if ctx.cache_dir is None else str(ctx.cache_dir), "reached": reached}}
'''


def make_bundle(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True)
    for name, text in {**files, "data.txt": "bundle data"}.items():
        (root / name).write_text(text)
    return root


@contextlib.asynccontextmanager
async def probing(tmp_path: Path, sandbox: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Probing]:
    """A cluster whose one worker (outbox and key file in ``state``) runs a holder task (a shipped
    test that writes its scratch and waits), and the values a probe needs to reach for them."""
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
        holder = await asyncio.to_thread(upload, c.base_url, code, make_bundle(tmp_path / "h", {"test_probe.py": HOLDER}))
        [hid] = await c.submit({"type": "test", "config": {"test_file": "test_probe.py"}, "bundle": holder}, key=code)
        tasks_root = next(state.glob("bundles-*")) / "tasks"
        await wait_for(lambda: any(tasks_root.glob(f"*/{SCRATCH_NAME}/mine.txt")), timeout=60, what="the holder to start")
        values = {"key": str(key_file), "outbox": str(state / "outbox.duckdb"), "state": str(state),
                  "other": str(next(tasks_root.glob(f"*/{SCRATCH_NAME}/mine.txt"))), "pid": os.getpid(),
                  "port": listener.getsockname()[1]}
        try:
            yield Probing(c, code, values, state)
        finally:
            await c.request("POST", f"/api/v1/tasks/{hid}/cancel")
            listener.close()


@dataclass
class Probing:
    cluster: Any
    code: str  # an --allow-code submitter key
    values: dict[str, Any]  # what PROBE and HANDLER are formatted with
    state: Path  # the worker's state directory

    async def run(self, bundle: Path, task: dict[str, Any]) -> dict[str, Any]:
        """Upload ``bundle``, run ``task`` with it and return the finished task."""
        c = self.cluster
        digest = await asyncio.to_thread(upload, c.base_url, self.code, bundle)
        [tid] = await c.submit({**task, "bundle": digest}, key=self.code)
        done: dict[str, Any] = await c.wait(tid, timeout=60)
        return done


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
async def test_a_shipped_test_reaches_nothing_of_the_worker(tmp_path: Path, sandbox: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    async with probing(tmp_path, sandbox, monkeypatch) as p:
        probe = textwrap.dedent(PROBE.format(**p.values))
        done = await p.run(make_bundle(tmp_path / "p", {"test_probe.py": probe}),
                           {"type": "test", "config": {"test_file": "test_probe.py"}})
    outcome = done["outcome"] or {}
    if sandbox == "bwrap":
        assert outcome.get("status") == "succeeded", (done.get("result") or {}).get("output", {}).get("stdout_tail")
        assert not (p.state / "planted").exists()
    else:  # unconfined: the first forbidden read succeeds, so the probe fails there
        assert outcome.get("status") == "failed", done
        assert "read the worker's key file" in str(done.get("result") or done)


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
async def test_a_shipped_custom_handler_reaches_nothing_of_the_worker(tmp_path: Path, sandbox: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The same attempts from a bundle's ``module:function`` handler, which runs in a sandboxed
    child of its own, not in the worker's shared pool (whose children see the worker's files)."""
    async with probing(tmp_path, sandbox, monkeypatch) as p:
        done = await p.run(make_bundle(tmp_path / "p", {"probe.py": HANDLER.format(**p.values)}),
                           {"type": "custom", "config": {"name": "probe:run"}})
    result = done.get("result") or {}
    assert (done["outcome"] or {}).get("status") == "succeeded", result
    output = result["output"]
    assert (output["bundle"], output["scratch"], output["cache_dir"]) == ("bundle data", "ok", None)
    if sandbox == "bwrap":
        assert output["reached"] == []
        assert not (p.state / "planted").exists()
    else:  # unconfined: the probe is not vacuous (its environment is still the scrubbed one)
        assert "read the worker's key file" in output["reached"]
        assert "saw the worker's environment variable" not in output["reached"]


CORRUPT = '''import os, pathlib

def test_writes_through_its_tree():
    p = pathlib.Path("data.txt")
    try:
        os.chmod(p, 0o644)  # the tree's files are 0444: the worker's user (or root) changes that
        p.write_text("corrupted")
    except OSError:
        pass  # read-only in bwrap
'''
CHECK = '''import pathlib

def test_sees_the_bundle_as_shipped():
    assert pathlib.Path("data.txt").read_text() == "bundle data"
'''


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
async def test_a_task_cannot_change_the_blob_cache_through_its_tree(tmp_path: Path, sandbox: str) -> None:
    """With ``--sandbox none`` a task runs as the worker's user, outside any read-only mount: a tree
    of hard links into the blob cache would let it write the cached blob that the next task's tree
    is built from. The tree is made of copies there, so the next task sees the bundle as shipped."""
    state = tmp_path / "state"
    async with run_cluster(tmp_path / "c", workers=0) as c:
        await c.add_worker(accept_bundles=True, sandbox=sandbox, task_network="none", db_path=state / "outbox.duckdb")
        code = await c.create_key("submitter", allow_code=True)
        bundle = make_bundle(tmp_path / "b", {"test_corrupt.py": CORRUPT, "test_check.py": CHECK})
        digest = await asyncio.to_thread(upload, c.base_url, code, bundle)
        [first] = await c.submit({"type": "test", "config": {"test_file": "test_corrupt.py"}, "bundle": digest},
                                 key=code)
        await c.wait(first, timeout=60)
        [second] = await c.submit({"type": "test", "config": {"test_file": "test_check.py"}, "bundle": digest},
                                  key=code)
        done = await c.wait(second, timeout=60)
    assert (done["outcome"] or {}).get("status") == "succeeded", done
    blobs = [p for p in state.glob("bundles-*/cache/**/*") if p.is_file()]
    assert b"bundle data" in [p.read_bytes() for p in blobs] and b"corrupted" not in [p.read_bytes() for p in blobs]
