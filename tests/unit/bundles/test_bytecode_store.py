"""What the worker keeps of a session's byte code (bundles/bytecode.py): the ``.pyc`` files under
the view's ``__pycache__`` directories, regular files only; never a link's target (the task could
point one at the worker's key), nothing of a FIFO, nothing past the bounds; a pytest-rewritten
module's only for a pytest that corrects its path; entries apart by key, the least recently used
removed first."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from distributed_testing.bundles import bytecode
from distributed_testing.bundles.bytecode import BytecodeStore, entry_key, keepable


def _view(root: Path) -> Path:
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "__pycache__").mkdir()
    (root / "pkg" / "mod.py").write_text("X = 1\n")
    (root / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"mod")
    (root / "__pycache__" / "test_a.cpython-311-pytest-9.2.0.pyc").write_bytes(b"test_a")
    return root


def test_a_kept_entry_seeds_the_next_view_of_the_tree(tmp_path: Path) -> None:
    store = BytecodeStore(tmp_path / "store")
    key = entry_key("k1", "b" * 64, "env")
    assert store.keep(key, _view(tmp_path / "one")) == 2
    (tmp_path / "two" / "pkg").mkdir(parents=True)
    assert store.seed(key, tmp_path / "two") == 2
    assert (tmp_path / "two" / "pkg" / "__pycache__" / "mod.cpython-311.pyc").read_bytes() == b"mod"
    assert (tmp_path / "two" / "__pycache__" / "test_a.cpython-311-pytest-9.2.0.pyc").read_bytes() == b"test_a"
    assert store.seed(entry_key("k2", "b" * 64, "env"), tmp_path / "two") == 0  # another key's: nothing
    assert entry_key("k1", "b" * 64, "env") != entry_key("k1", "c" * 64, "env") != entry_key("k1", "c" * 64, "e2")


def test_links_fifos_and_other_files_are_not_kept(tmp_path: Path) -> None:
    secret = tmp_path / "worker.key"
    secret.write_text("the worker's key")
    view = _view(tmp_path / "view")
    cache = view / "pkg" / "__pycache__"
    (cache / "stolen.cpython-311.pyc").symlink_to(secret)
    os.mkfifo(cache / "blocks.cpython-311.pyc")
    (cache / "notes.txt").write_text("not byte code")
    (view / "linked").symlink_to(tmp_path, target_is_directory=True)  # a link to a directory: not walked
    elsewhere = tmp_path / "worker-state" / "__pycache__"
    elsewhere.mkdir(parents=True)
    (elsewhere / "state.cpython-311.pyc").write_bytes(b"the worker's")
    (view / "pkg2").mkdir()
    (view / "pkg2" / "__pycache__").symlink_to(elsewhere, target_is_directory=True)
    (view / "elsewhere").mkdir()
    (view / "elsewhere" / "x.pyc").write_bytes(b"not in a __pycache__")
    store = BytecodeStore(tmp_path / "store")
    assert store.keep("k", view) == 2
    kept = sorted(str(p.relative_to(tmp_path / "store" / "k")) for p in (tmp_path / "store" / "k").rglob("*")
                  if p.is_file() and p.name != bytecode.SIZE_FILE)
    assert kept == ["__pycache__/test_a.cpython-311-pytest-9.2.0.pyc", "pkg/__pycache__/mod.cpython-311.pyc"]


def test_seeding_never_writes_through_a_link_in_the_view(tmp_path: Path) -> None:
    store = BytecodeStore(tmp_path / "store")
    store.keep("k", _view(tmp_path / "one"))
    outside = tmp_path / "outside"
    outside.mkdir()
    view = tmp_path / "two"
    view.mkdir()
    (view / "pkg").symlink_to(outside, target_is_directory=True)
    assert store.seed("k", view) == 1  # the top's only
    assert not (outside / "__pycache__").exists()


def test_over_the_bounds_nothing_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bytecode, "MAX_BYTES", 5)
    assert BytecodeStore(tmp_path / "store").keep("k", _view(tmp_path / "view")) == 0
    assert not (tmp_path / "store" / "k").exists()


def test_a_pytest_rewritten_module_is_kept_only_for_a_pytest_that_corrects_its_path() -> None:
    assert keepable("mod.cpython-311.pyc") and keepable("test_a.cpython-312-pytest-9.2.0.pyc")
    assert keepable("test_a.cpython-312-pytest-10.0.1.pyc")
    assert not keepable("test_a.cpython-311-pytest-9.1.1.pyc") and not keepable("test_a.cpython-311-pytest-8.4.2.pyc")
    assert not keepable("mod.py") and not keepable("mod.pyc.tmp")


def test_the_least_recently_used_entries_go_first(tmp_path: Path) -> None:
    store = BytecodeStore(tmp_path / "store", max_entries=2)
    view = _view(tmp_path / "view")
    for n, key in enumerate(("a", "b")):
        store.keep(key, view)
        os.utime(tmp_path / "store" / key, (1000 + n, 1000 + n))
    (tmp_path / "seeded").mkdir()
    store.seed("a", tmp_path / "seeded")  # "a" used now: "b" is the least recently used
    store.keep("c", view)
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["a", "c"]


def test_the_store_holds_at_most_its_bytes_the_least_recently_used_going_first(tmp_path: Path) -> None:
    # each entry of _view holds 9 bytes ("mod" and "test_a"): two fit in 20, not three
    store = BytecodeStore(tmp_path / "store", max_bytes=20)
    view = _view(tmp_path / "view")
    for n, key in enumerate(("a", "b", "c")):
        store.keep(key, view)
        os.utime(tmp_path / "store" / key, (1000 + n, 1000 + n))
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["b", "c"]
    assert (tmp_path / "store" / "c" / bytecode.SIZE_FILE).read_text() == "9"
    (tmp_path / "seeded").mkdir()
    assert store.seed("c", tmp_path / "seeded") == 1  # the top's test module (no pkg/ there); not the size record
    assert not (tmp_path / "seeded" / bytecode.SIZE_FILE).exists()


def test_an_entry_over_the_whole_budget_alone_is_still_kept(tmp_path: Path) -> None:
    store = BytecodeStore(tmp_path / "store", max_bytes=5)
    store.keep("a", _view(tmp_path / "view"))
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["a"]  # the newest stays
