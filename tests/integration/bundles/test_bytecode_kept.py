"""A pytest session's byte code is kept for the next session of the same submitter's key, tree and
environment (bundles/bytecode.py): that session's view starts with the ``__pycache__`` the last
one compiled, as a local pytest's second run does, while a session of another key starts without
it. Every file of a view has the same modification time, so the kept byte code is current there."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from distributed_testing.bundles.bytecode import VIEW_MTIME
from distributed_testing.bundles.upload import upload
from distributed_testing.testing import run_cluster, wait_for
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

CONFTEST = '''
import pathlib
import pytest

CACHE = pathlib.Path(__file__).parent / "__pycache__"
# read before anything of this session imports helper: its byte code is here only if it was seeded
SEEDED = sorted(p.name for p in CACHE.glob("helper.*.pyc")) if CACHE.is_dir() else []


@pytest.fixture
def seeded():
    return SEEDED
'''
TESTS = '''
import os
import sys
import helper


def test_helper_byte_code_was_there_before_this_session(seeded):
    assert seeded, "no byte code of helper.py when this session started"


def test_every_file_of_the_view_has_one_time():
    assert helper.VALUE == 1
    assert {os.stat(name).st_mtime for name in ("helper.py", "conftest.py", "test_mod.py")} == {MTIME}


def test_it_writes_byte_code():
    assert not sys.dont_write_bytecode
'''


async def test_a_session_starts_with_the_byte_code_its_keys_last_session_of_the_tree_kept(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "conftest.py").write_text(CONFTEST)
    (tree / "helper.py").write_text("VALUE = 1\n")
    (tree / "test_mod.py").write_text(TESTS.replace("MTIME", str(float(VIEW_MTIME))))
    async with run_cluster(tmp_path / "c", workers=0) as c:
        await c.add_worker(worker_id="w1", accept_bundles=True, max_concurrent_tasks=1)
        mine, theirs = [await c.create_key("submitter", allow_code=True) for _ in range(2)]
        bundle = await asyncio.to_thread(upload, c.base_url, mine, tree)
        await asyncio.to_thread(upload, c.base_url, theirs, tree)

        async def run(key: str, session: str, **config: bool) -> dict[str, str]:
            [tid] = await c.submit({"type": "test", "bundle": bundle,
                                    "config": {"test_file": "test_mod.py", "session": session, **config}}, key=key)
            done = await c.wait(tid, 90)
            tests = (done.get("result") or {}).get("output", {}).get("tests") or []
            assert tests, done
            return {t["nodeid"].split("::")[1].split("_")[1]: t["outcome"] for t in tests}

        # the submitter's pytest wrote none (-B): none written there, none given to it, none kept
        assert await run(mine, "run-0", write_bytecode=False) == {"helper": "failed", "every": "passed", "it": "failed"}
        assert not any(tmp_path.rglob("bytecode/*"))
        first = await run(mine, "run-1")
        assert first == {"helper": "failed", "every": "passed", "it": "passed"}  # nothing kept yet
        await wait_for(lambda: any(tmp_path.rglob("bytecode/*/__pycache__/helper.*.pyc")),
                       what="the first session's byte code kept", timeout=30)
        assert await run(mine, "run-2") == {"helper": "passed", "every": "passed", "it": "passed"}  # the same key: seeded
        assert await run(mine, "run-3", write_bytecode=False) == {"helper": "failed", "every": "passed", "it": "failed"}
        assert await run(theirs, "run-4") == {"helper": "failed", "every": "passed", "it": "passed"}  # another key's: not
