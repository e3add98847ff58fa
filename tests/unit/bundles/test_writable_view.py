"""A task's writable view of a kept tree: fresh directories and copies of the files the task may
rewrite, ``chmod`` and ``touch`` as in a checkout, the kept tree staying as shipped; where asked
(a root worker), a file over ``LINK_OVER`` bytes is a link into the kept tree instead, and one
that cannot take another link (ext4 stops at 65,000) is copied, so no bundle can make another
one's views fail. A ``copy`` tree (``--sandbox none``: each task's own) is writable too."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from distributed_testing.bundles import manifest as mf
from distributed_testing.bundles import tree
from distributed_testing.bundles.cache import BlobCache
from distributed_testing.bundles.tree import build_tree, writable_view


def _kept(tmp_path: Path) -> tuple[Path, mf.Manifest]:
    src = tmp_path / "kept"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text("")
    (src / "data.txt").write_text("shipped")
    (src / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(src / "run.sh", 0o755)
    m, _ = mf.scan(src)
    for p in (src / "data.txt", src / "pkg" / "__init__.py"):
        os.chmod(p, 0o444)  # as build_tree leaves them
    return src, m


@pytest.mark.parametrize("link_large", [False, True])
def test_the_files_are_the_tasks_own_and_the_kept_tree_stays_as_shipped(tmp_path: Path, link_large: bool) -> None:
    src, m = _kept(tmp_path)
    writable_view(src, m, tmp_path / "view", link_large=link_large)
    view = tmp_path / "view"
    assert os.stat(view / "data.txt").st_ino != os.stat(src / "data.txt").st_ino
    assert os.stat(view / "pkg").st_ino != os.stat(src / "pkg").st_ino
    (view / "data.txt").write_text("changed")  # a suite rewriting its fixture
    os.utime(view / "data.txt", (1, 1))  # and touching it
    os.chmod(view / "data.txt", 0o600)
    assert stat.S_IMODE(os.stat(view / "run.sh").st_mode) & 0o111  # executables stay executable
    assert (src / "data.txt").read_text() == "shipped" and os.stat(src / "data.txt").st_mtime != 1
    assert stat.S_IMODE(os.stat(src / "data.txt").st_mode) == 0o444


def test_a_large_file_is_a_link_where_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, m = _kept(tmp_path)
    monkeypatch.setattr(tree, "LINK_OVER", len("shipped") - 1)  # data.txt is "large"
    writable_view(src, m, tmp_path / "linked", link_large=True)
    writable_view(src, m, tmp_path / "copied", link_large=False)
    assert os.stat(tmp_path / "linked" / "data.txt").st_ino == os.stat(src / "data.txt").st_ino
    assert os.stat(tmp_path / "linked" / "pkg" / "__init__.py").st_ino != os.stat(src / "pkg" / "__init__.py").st_ino
    assert os.stat(tmp_path / "copied" / "data.txt").st_ino != os.stat(src / "data.txt").st_ino


def test_a_large_file_linked_to_its_limit_is_copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, m = _kept(tmp_path)
    monkeypatch.setattr(tree, "LINK_OVER", 0)
    real = os.link

    def link(a: Path, b: Path) -> None:
        if Path(a).name == "__init__.py":
            raise OSError(errno.EMLINK, "Too many links")
        real(a, b)

    monkeypatch.setattr(os, "link", link)
    writable_view(src, m, tmp_path / "view", link_large=True)
    copied = tmp_path / "view" / "pkg" / "__init__.py"
    assert copied.exists() and os.stat(copied).st_ino != os.stat(src / "pkg" / "__init__.py").st_ino
    assert os.stat(tmp_path / "view" / "data.txt").st_ino == os.stat(src / "data.txt").st_ino


def test_a_tree_of_copies_is_writable(tmp_path: Path) -> None:
    """``--sandbox none``: the task runs as the owner of its fresh tree, which must be writable
    like a checkout (a read-only copy gave EACCES to a suite rewriting its own fixture)."""
    src, m = _kept(tmp_path)
    cache = BlobCache(tmp_path / "cache", 1 << 30)
    for f in m.files:
        cache.put(f.digest, (src / f.path).read_bytes())
    build_tree(cache, m, tmp_path / "own", copy=True)
    for p in (tmp_path / "own", tmp_path / "own" / "pkg", tmp_path / "own" / "data.txt"):
        assert os.stat(p).st_mode & stat.S_IWUSR, p  # root writes regardless: the bits say it
    (tmp_path / "own" / "data.txt").write_text("changed")
    (tmp_path / "own" / "pkg" / "new.py").write_text("")
    assert {cache.path(f.digest).read_bytes() for f in m.files} == {b"shipped", b"", b"#!/bin/sh\n"}
