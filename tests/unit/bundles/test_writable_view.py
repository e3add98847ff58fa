"""A task's writable view of a kept tree: fresh directories, each file a link into the kept tree
(or a copy where links would let the task change it); a file that cannot take another link (ext4
stops at 65,000: another bundle of 65,000 empty files shares the empty blob) is copied, so no
bundle can make another one's views fail."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from distributed_testing.bundles import manifest as mf
from distributed_testing.bundles.tree import writable_view


def _kept(tmp_path: Path) -> tuple[Path, mf.Manifest]:
    src = tmp_path / "kept"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text("")
    (src / "data.txt").write_text("shipped")
    m, _ = mf.scan(src)
    return src, m


def test_files_are_links_into_the_kept_tree_and_directories_are_new(tmp_path: Path) -> None:
    src, m = _kept(tmp_path)
    writable_view(src, m, tmp_path / "view", copy=False)
    assert os.stat(tmp_path / "view" / "data.txt").st_ino == os.stat(src / "data.txt").st_ino
    assert os.stat(tmp_path / "view" / "pkg").st_ino != os.stat(src / "pkg").st_ino


def test_a_file_linked_to_its_limit_is_copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, m = _kept(tmp_path)
    real = os.link

    def link(a: Path, b: Path) -> None:
        if Path(a).name == "__init__.py":
            raise OSError(errno.EMLINK, "Too many links")
        real(a, b)

    monkeypatch.setattr(os, "link", link)
    writable_view(src, m, tmp_path / "view", copy=False)
    copied = tmp_path / "view" / "pkg" / "__init__.py"
    assert copied.exists() and os.stat(copied).st_ino != os.stat(src / "pkg" / "__init__.py").st_ino
    assert os.stat(tmp_path / "view" / "data.txt").st_ino == os.stat(src / "data.txt").st_ino


def test_copies_are_the_tasks_own(tmp_path: Path) -> None:
    src, m = _kept(tmp_path)
    writable_view(src, m, tmp_path / "view", copy=True)
    (tmp_path / "view" / "data.txt").write_text("changed")
    assert (src / "data.txt").read_text() == "shipped"
