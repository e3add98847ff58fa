"""What a task produces or ships cannot take its worker down (issue 40): one real ``dt-worker``
process (``--accept-bundles --sandbox none``) and a real coordinator, attacked as a submitter
with ``--allow-code`` would. Each attack ends as that task's ``error`` naming what was wrong, and
the worker goes on: one session all along (no crash, no reconnect loop), its other tasks and its
other stored results untouched.

* a handler returning ``{"n": 2**80}`` and a test calling ``record_property("n", 2**80)`` (the
  worker died with OverflowError in its journal and its session writer);
* a handler returning 20 MiB (a frame over the coordinator's 16 MiB limit: reconnect and re-send
  for ever), and such a result already stored in the worker's outbox by an earlier run;
* a task whose preparation breaks on the worker (its task directory unusable): it stayed
  ``running`` with its slot taken for ever ("Task exception was never retrieved");
* and, at the coordinator, manifests the worker could not lay out: a 300-byte name, a path 1,500
  directories deep (400 naming the limit).
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from pathlib import Path

import pytest

from distributed_testing.bundles import manifest as mf
from distributed_testing.bundles.upload import upload_with_stats
from distributed_testing.protocol import messages as m
from distributed_testing.testing import Cluster, Procs, hidden_accelerators, raw_worker, run_cluster, wait_for
from distributed_testing.worker.result_store_duckdb import DuckDBResultStore

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]
ROOT = Path(__file__).resolve().parents[3]
DROP = ["DT_API_KEY", "DT_API_KEY_FILE", "DT_COORDINATOR_URL", "DT_DB_PATH"]
BIG = 20 << 20  # over the 16 MiB frame
HANDLERS = f'''
def bigint(parameters, ctx):
    return {{"n": 2**80}}


def blob(parameters, ctx):
    return {{"blob": "x" * {BIG}}}


def ok(parameters, ctx):
    return {{"ok": True}}
'''
PROPERTY_TEST = "def test_property(record_property):\n    record_property('n', 2**80)\n"


async def stored_outbox(db: Path) -> None:
    """The outbox an earlier run left: a 20 MiB result and a small one, neither acknowledged."""
    db.parent.mkdir(mode=0o700)
    outbox = DuckDBResultStore(db)
    await outbox.open()
    outbox.add(m.TaskResult("old-big", 1, "succeeded", 1.0, 2.0, output={"blob": "x" * BIG}, worker_id="w"))
    outbox.add(m.TaskResult("old-ok", 1, "succeeded", 1.0, 2.0, output={"kept": 7}, worker_id="w"))
    await outbox.close()


async def bundle_task(c: Cluster, key: str, digest: str, config: dict[str, object], kind: str = "custom") -> str:
    [tid] = await c.submit({"type": kind, "config": config, "bundle": digest, "requirements": {"tags": ["w"]}},
                           key=key)
    return tid


async def test_a_tasks_output_ends_as_its_error_and_the_worker_goes_on(tmp_path: Path) -> None:
    db = tmp_path / "state" / "w.duckdb"
    await stored_outbox(db)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "handlers.py").write_text(HANDLERS)
    (tree / "test_props.py").write_text(PROPERTY_TEST)
    procs = Procs(tmp_path, cwd=ROOT)
    try:
        async with run_cluster(tmp_path, workers=0, worker_grace_s=60.0) as c:
            wkey, skey = await c.create_key("worker"), await c.create_key("submitter", allow_code=True)
            await c.submit([{"task_id": t, "type": "custom", "config": {"name": "noop"}, "requirements": {"tags": ["w"]}}
                            for t in ("old-big", "old-ok")])
            async with raw_worker(c.base_url, wkey, "w", tags=["w"], max_concurrent=2):  # the earlier run
                await wait_for(lambda: all(t.state == "assigned" for t in c.runtime.state.tasks.values()),
                               what="both attempts given to w before it stopped")
            log = tmp_path / "worker.log"
            worker = procs.start([str(ROOT / "run_worker_example.py"), "--coordinator", c.base_url, "--api-key", wkey,
                                  "--worker-id", "w", "--tags", "w", "--db-path", str(db), "--accept-bundles",
                                  "--sandbox", "none"], log, env=hidden_accelerators(tmp_path), drop_env=DROP)

            # a stored result too large for a frame: sent as an error in its place, once; the other as it was
            old_big, old_ok = await c.wait("old-big", 60), await c.wait("old-ok", 30)
            assert old_big["state"] == "error", old_big
            assert "cannot be sent" in old_big["outcome"]["error"] and "16,777,216" in old_big["outcome"]["error"]
            assert old_ok["state"] == "succeeded", old_ok
            status, body = await c.request("GET", "/api/v1/results", params={"task_id": "old-ok"})
            assert status == 200 and body["results"][0]["output"] == {"kept": 7}, body

            digest = (await asyncio.to_thread(upload_with_stats, c.base_url, skey, tree)).digest
            # numbers beyond 64 bits, from a handler and from a test's record_property
            for tid in (await bundle_task(c, skey, digest, {"name": "handlers:bigint"}),
                        await bundle_task(c, skey, digest, {"test_file": "test_props.py"}, kind="test")):
                task = await c.wait(tid, 60)
                assert task["state"] == "error", task
                error = task["outcome"]["error"]
                assert "the integer 1208925819614629174706176 is outside the 64 bits" in error, error
                assert "the task itself ended" in error, error
            # an output over the frame: refused with its size
            task = await c.wait(await bundle_task(c, skey, digest, {"name": "handlers:blob"}), 60)
            assert task["state"] == "error", task
            assert "its output is 20,971," in task["outcome"]["error"] and "8,388,608 bytes" in task["outcome"]["error"], task

            # a task whose preparation breaks on the worker: its error, its slot free for the next
            tasks_dir = db.parent / "bundles-w" / "tasks"
            shutil.rmtree(tasks_dir)
            tasks_dir.write_text("not a directory")
            task = await c.wait(await bundle_task(c, skey, digest, {"name": "handlers:ok"}), 60)
            assert task["state"] == "error", task
            assert "failed to prepare or run the task: NotADirectoryError" in task["outcome"]["error"], task
            tasks_dir.unlink()
            tasks_dir.mkdir()
            task = await c.wait(await bundle_task(c, skey, digest, {"name": "handlers:ok"}), 60)
            assert task["state"] == "succeeded", task

            assert worker.poll() is None, log.read_text()[-3000:]
            assert Procs.stop(worker) == 0, log.read_text()[-3000:]
        text = log.read_text()
        assert text.count("registered with coordinator as w") == 1, text[-3000:]  # one session, no reconnect
        assert "OverflowError" not in text and "never retrieved" not in text, text[-3000:]
    finally:
        procs.close()


async def test_a_manifest_a_worker_could_not_lay_out_is_refused_naming_the_limit(tmp_path: Path) -> None:
    async with run_cluster(tmp_path, workers=0) as c:
        key = await c.create_key("submitter", allow_code=True)
        blob = b"x = 1\n"
        d = hashlib.sha256(blob).hexdigest()
        async with c.http.put(f"{c.base_url}/api/v1/blobs/{d}", data=blob,
                              headers={"Authorization": f"Bearer {key}"}) as r:
            assert r.status in (200, 201), await r.text()
        cases = {"n" * 300 + ".py": "is 303 bytes; a file or directory name is at most 255 bytes",
                 "/".join(["d"] * 1500) + "/x.py": "at most 1,024",
                 "/".join(["d"] * 120) + "/x.py": "121 levels deep; at most 100"}
        for path, expected in cases.items():
            data = mf.encode(mf.Manifest([mf.FileEntry(path, d, len(blob))]))
            async with c.http.put(f"{c.base_url}/api/v1/bundles/{hashlib.sha256(data).hexdigest()}", data=data,
                                  headers={"Authorization": f"Bearer {key}"}) as r:
                body = await r.text()
            assert r.status == 400 and expected in body, (path[:40], r.status, body[:500])
