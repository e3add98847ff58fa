"""The worker's kept trees (worker/bundles.py): a bundle's tree is built once and handed to every
later task of it without asking the coordinator, a known manifest is not fetched again, unused
trees beyond MAX_TREES go least recently used first, and a tree left by an earlier run is cleared."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from distributed_testing.bundles.upload import upload_with_stats
from distributed_testing.testing import run_cluster
from distributed_testing.worker import bundles as wb

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
NOWHERE = "http://127.0.0.1:9"  # nothing listens: a provider that asked the coordinator would fail


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


async def test_a_bundle_tree_is_built_once_and_reused_without_the_coordinator(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wb, "MAX_TREES", 1)
    async with run_cluster(tmp_path / "c", workers=0) as c:
        code = await c.create_key("submitter", allow_code=True)
        worker = code  # the uploader reads it back; a worker key only a bundle its tasks name (test_bundle_access.py)
        a = (await asyncio.to_thread(upload_with_stats, c.base_url, code, tree(tmp_path / "a", {"pkg/m.py": "A = 1\n"}))).digest
        b = (await asyncio.to_thread(upload_with_stats, c.base_url, code, tree(tmp_path / "b", {"n.py": "B = 2\n"}))).digest
        p = wb.BundleProvider(tmp_path / "w" / "cache", 1 << 30)
        async with p.shared(c.base_url, worker, a) as (first, m):
            assert (first / "pkg" / "m.py").read_text() == "A = 1\n" and [f.path for f in m.files] == ["pkg/m.py"]
            async with p.shared(NOWHERE, worker, a) as (again, _):  # a second task of it, at the same time
                assert again == first
        async with p.shared(NOWHERE, worker, a) as (later, _):  # and after: nothing fetched, nothing built
            assert later == first and p.builds == 1
        async with p.shared(c.base_url, worker, b) as (other, _):
            assert (other / "n.py").read_text() == "B = 2\n"
        assert not first.exists() and other.exists()  # one unused tree kept: a's (least recently used) went
        async with p.shared(NOWHERE, worker, a) as (rebuilt, _):  # its manifest and blobs are still cached
            assert (rebuilt / "pkg" / "m.py").read_text() == "A = 1\n" and p.builds == 3
    assert wb.BundleProvider(tmp_path / "w" / "cache", 1 << 30).trees_dir.exists()
    assert not list((tmp_path / "w" / "trees").iterdir())  # a restarted worker starts with no kept tree
