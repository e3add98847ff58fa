"""A tree that cannot be shipped says so in one line, no traceback: a symlink loop in it, under
``dt submit --bundle`` (exit 2) and under the pytest plugin's upload (pytest's usage error, exit 4)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distributed_testing.testing import run_cluster
from distributed_testing.testing.suites import plugin_args

pytestmark = [pytest.mark.timeout(120)]


def looped_tree(root: Path) -> Path:
    root.mkdir()
    (root / "test_one.py").write_text("def test_one():\n    pass\n")
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("a")
    return root


def test_dt_submit_of_a_tree_with_a_symlink_loop_is_one_line_exit_2(tmp_path: Path) -> None:
    tree = looped_tree(tmp_path / "tree")
    tasks = tmp_path / "tasks.json"
    tasks.write_text('{"type": "test", "config": {"test_file": "test_one.py"}}')
    run = subprocess.run([sys.executable, "-m", "distributed_testing.cli.dt", "--coordinator", "http://127.0.0.1:1",
                          "submit", "--bundle", str(tree), str(tasks)],
                         env={**os.environ, "DT_API_KEY": "dtk_x_y"}, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert f"--bundle {tree}: bundle: a: the symlink cannot be followed" in run.stderr, run.stderr
    assert "ignore it in .dtignore" in run.stderr


@pytest.mark.asyncio
async def test_the_pytest_plugin_on_a_tree_with_a_symlink_loop_is_a_usage_error(tmp_path: Path) -> None:
    tree = looped_tree(tmp_path / "tree")
    async with run_cluster(tmp_path / "c", workers=0) as c:
        key = await c.create_key("submitter", allow_code=True)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "--rootdir", str(tree),
            "--dt-coordinator", c.base_url, str(tree), cwd=tree, env={**os.environ, "DT_API_KEY": key},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out = (await proc.communicate())[0].decode()
    assert proc.returncode == 4, out
    assert "INTERNALERROR" not in out and "Traceback" not in out, out
    assert f"distributed_testing: {tree} cannot be shipped: bundle: a: the symlink cannot be followed" in out, out
