"""Whether the local pytest writes byte code travels: under ``-B`` or ``PYTHONDONTWRITEBYTECODE``
the workers' session writes none into its tree either (``write_bytecode: false``), so a test that
looks for ``__pycache__`` finds there what it finds here; without them the session writes it and
the worker keeps it for the next session of the key and tree (bundles/bytecode.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from distributed_testing.testing import bundle_cluster
from distributed_testing.testing.suites import PLUGIN, submitter_env
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(600), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

TESTS = '''\
import os
import pathlib
import sys

import helper


def test_byte_code_is_written_as_where_pytest_was_started():
    written = any(pathlib.Path(helper.__file__).parent.joinpath("__pycache__").glob("helper.*.pyc"))
    assert sys.dont_write_bytecode == (os.environ["NO_BYTECODE"] == "1") == (not written)
'''


async def test_the_workers_session_writes_byte_code_only_where_the_local_pytest_does(tmp_path: Path) -> None:
    tree = tmp_path / "proj"
    tree.mkdir()
    (tree / "helper.py").write_text("VALUE = 1\n")
    (tree / "test_bytecode.py").write_text(TESTS)
    python = await asyncio.to_thread(submitter_env, tmp_path / "venv", [])
    async with bundle_cluster(tmp_path) as (c, key):

        def run(no_bytecode: bool, *fleet: str) -> subprocess.CompletedProcess[str]:
            env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            env.update({"DT_API_KEY": key, "NO_BYTECODE": "1" if no_bytecode else "0",
                        **({"PYTHONDONTWRITEBYTECODE": "1"} if no_bytecode else {})})
            subprocess.run(["find", ".", "-name", "__pycache__", "-prune", "-exec", "rm", "-rf", "{}", "+"], cwd=tree,
                           check=True)
            return subprocess.run([str(python), "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", "-rA", *fleet],
                                  cwd=tree, env=env, capture_output=True, text=True, timeout=300, check=False)

        outs = {}
        for no_bytecode in (True, False):
            outs[no_bytecode] = (await asyncio.to_thread(run, no_bytecode),
                                 await asyncio.to_thread(run, no_bytecode, "--dt-coordinator", c.base_url,
                                                         "--dt-env", "NO_BYTECODE"))
    for no_bytecode, (local, fleet) in outs.items():
        said = f"PYTHONDONTWRITEBYTECODE={int(no_bytecode)}\n" + local.stdout[-2000:] + fleet.stdout[-3000:] + fleet.stderr[-2000:]
        assert local.returncode == 0 and "1 passed" in local.stdout, said
        assert fleet.returncode == 0 and "1 passed" in fleet.stdout, said
