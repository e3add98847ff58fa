"""Items that share a node id (a conftest's own collector that names several cases alike, as
docopt-ng's ``testcases.docopt`` does) run through the plugin as in plain pytest: each item once,
its own outcome. Before, a worker's session kept one item per node id, so the last case of a name
ran as many times as the name had cases (one that failed locally passed there), chunks cut
between cases of one name ran every case of it in each, and the replay gave one item all of its
name's reports (docopt-ng: 614 test cases locally, 887 through the plugin)."""

from __future__ import annotations

import asyncio
import functools
import re
from pathlib import Path

import pytest

from distributed_testing.testing import bundle_cluster
from distributed_testing.testing.suites import plugin_pytest, short_summary, submitter_env
from distributed_testing.worker.sandbox import available

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(600), pytest.mark.slow,
              pytest.mark.skipif(available() is not None, reason=f"no sandbox here: {available()}")]

CONFTEST = '''\
import pytest


def pytest_collect_file(file_path, parent):
    if file_path.suffix == ".cases":
        return CasesFile.from_parent(parent, path=file_path)


class CasesFile(pytest.File):
    def collect(self):
        for line in self.path.read_text().splitlines():
            name, _, expect = line.partition(" ")
            yield CaseItem.from_parent(self, name=name, expect=expect)


class CaseItem(pytest.Item):
    def __init__(self, *, expect, **kwargs):
        super().__init__(**kwargs)
        self.expect = expect

    def runtest(self):
        print(f"case {self.expect}")
        assert self.expect.startswith("ok"), f"case {self.expect} failed"

    def reportinfo(self):
        return self.path, 0, self.name
'''
# one name's cases, its failing one in the middle; a second name after them
CASES = "shared ok-1\nshared bad-2\nshared ok-3\nshared ok-4\nother ok-5\nshared2 ok-6\nshared2 ok-7\n"
PLAIN = "".join(f"def test_plain_{i}():\n    pass\n\n\n" for i in range(6))


async def test_items_of_one_node_id_each_run_once_with_their_own_outcome(tmp_path: Path) -> None:
    tree = tmp_path / "proj"
    tree.mkdir()
    (tree / "conftest.py").write_text(CONFTEST)
    (tree / "test_cases.cases").write_text(CASES)
    (tree / "test_plain.py").write_text(PLAIN)
    python = await asyncio.to_thread(submitter_env, tmp_path / "venv", [])

    run = functools.partial(plugin_pytest, python, tree)

    local = await asyncio.to_thread(run)
    assert "1 failed, 12 passed" in local.stdout, local.stdout[-3000:]
    async with bundle_cluster(tmp_path, workers=2) as (c, key):
        remote = await asyncio.to_thread(run, "--dt-coordinator", c.base_url, env={"DT_API_KEY": key})
    said = local.stdout[-3000:] + "\n----- through the plugin -----\n" + remote.stdout[-3000:] + remote.stderr[-2000:]
    assert remote.returncode == local.returncode == 1, said
    # under CI=true pytest's summary holds the whole assertion, an object's address with it
    assert short_summary(_no_addresses(remote.stdout)) == short_summary(_no_addresses(local.stdout)), said
    assert "case bad-2 failed" in remote.stdout and remote.stdout.count("case ok-") == local.stdout.count("case ok-"), said


def _no_addresses(out: str) -> str:
    return re.sub(r"0x[0-9a-f]+", "0x", out)
