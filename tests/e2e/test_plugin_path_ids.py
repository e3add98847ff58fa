"""A test whose node id holds its tree's absolute path (a parametrize over the tree's data files
with the path as its id, as sybil's own suite does) has another id on each worker, whose copy of
the tree lies elsewhere. The plugin sends such an id with its local root as a mark the worker
replaces with its own tree's path, and maps the id the results come back under to the local one:
each test runs there and reads as here. Before, every such test was an error ("not found")."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import pytest

from distributed_testing.testing import bundle_cluster
from distributed_testing.testing.suites import plugin_pytest, submitter_env
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(600), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

TESTS = '''\
from pathlib import Path

import pytest

HERE = Path(__file__).parent
DATA = sorted(str(p) for p in (HERE / "data").glob("*.txt"))


@pytest.mark.parametrize("path", DATA, ids=str)  # as sybil's: pytest 9.2 ids a str of over 100
# characters by its argument's name and index (path0) unless the ids are the test's own
def test_each_data_file(path):
    text = Path(path).read_text()
    assert text.startswith("ok"), text


def test_plain():
    pass
'''


async def test_ids_that_hold_the_trees_path_run_there_and_read_as_here(tmp_path: Path) -> None:
    tree = tmp_path / "proj"
    (tree / "data").mkdir(parents=True)
    (tree / "test_paths.py").write_text(TESTS)
    for name, text in (("a.txt", "ok a"), ("b.txt", "bad b"), ("c.txt", "ok c")):
        (tree / "data" / name).write_text(text)
    python = await asyncio.to_thread(submitter_env, tmp_path / "venv", [])

    run = functools.partial(plugin_pytest, python, tree)

    local = await asyncio.to_thread(run)
    async with bundle_cluster(tmp_path, workers=2) as (c, key):
        remote = await asyncio.to_thread(run, "--dt-coordinator", c.base_url, env={"DT_API_KEY": key})

    def summary(out: str) -> list[str]:  # each test's line (under CI=true pytest adds the assertion's explanation)
        lines = out.split("short test summary info")[1].splitlines()[1:]
        return sorted(line.split(" - ")[0] for line in lines if line.startswith(("PASSED ", "FAILED ", "ERROR ")))

    data = tree / "data"
    expected = [f"FAILED test_paths.py::test_each_data_file[{data / 'b.txt'}]",
                f"PASSED test_paths.py::test_each_data_file[{data / 'a.txt'}]",
                f"PASSED test_paths.py::test_each_data_file[{data / 'c.txt'}]",
                "PASSED test_paths.py::test_plain"]
    assert summary(local.stdout) == expected, local.stdout[-3000:]
    assert summary(remote.stdout) == expected, remote.stdout[-3000:] + remote.stderr[-2000:]
    assert "not found" not in remote.stdout and "1 failed, 3 passed" in remote.stdout, remote.stdout[-3000:]
    # the failure, replayed as it arrives, names the data file where it is here (the worker's pytest sees its
    # tree at /task/tree: every report carries that path, which the plugin maps to the local one)
    assert f"path = '{data / 'b.txt'}'" in remote.stdout and "/task/" not in remote.stdout, remote.stdout[-3000:]
