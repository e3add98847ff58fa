"""A run's state (``.hypothesis/``) travels in the bundle but is not code: every local run changes
it, and a bundle that differs only there keeps its Python environment (a ``./`` package is built
from the tree: a rebuild cost attrs' first remote test 5 s) and its kept byte code."""

from __future__ import annotations

from pathlib import Path

from distributed_testing.bundles import manifest as mf
from distributed_testing.worker.pyenv import _copy_local, env_digest


def _tree(root: Path, example: bytes, code: str = "VALUE = 1\n") -> mf.Manifest:
    (root / "pkg").mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text("[project]\nname = 'pkg'\nversion = '1'\n")
    (root / "pkg" / "__init__.py").write_text(code)
    (root / ".hypothesis" / "examples" / "ab").mkdir(parents=True, exist_ok=True)
    (root / ".hypothesis" / "examples" / "ab" / "cd").write_bytes(example)
    m, _ = mf.scan(root)
    return m


def test_a_bundle_that_differs_only_in_its_run_state_keeps_its_environment_and_byte_code(tmp_path: Path) -> None:
    a = _tree(tmp_path / "a", b"first run")
    b = _tree(tmp_path / "b", b"a later local run's example")
    c = _tree(tmp_path / "c", b"first run", code="VALUE = 2\n")
    assert ".hypothesis/examples/ab/cd" in [f.path for f in a.files]  # it travels
    assert mf.encode(a) != mf.encode(b)
    for entries in (["./"], ["./pkg"]):
        assert env_digest(entries, a) == env_digest(entries, b)
    assert env_digest(["./"], a) != env_digest(["./"], c)
    assert mf.code_digest(a) == mf.code_digest(b) != mf.code_digest(c)


def test_the_build_copy_of_a_package_leaves_its_run_state_out(tmp_path: Path) -> None:
    _tree(tmp_path / "tree", b"x")
    [copy] = _copy_local(tmp_path / "tree", ["./"], tmp_path / "pip-src")
    assert (Path(copy) / "pkg" / "__init__.py").exists()
    assert not (Path(copy) / ".hypothesis").exists()
