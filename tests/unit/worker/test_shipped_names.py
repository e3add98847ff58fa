"""What a bundle task may name: the top-level modules of a built tree, and a custom handler's
``module:function`` inside them."""

from __future__ import annotations

from pathlib import Path

from distributed_testing.bundles.tree import top_level_modules
from distributed_testing.tasks.usercode import bundle_modules, shipped_handler_error


def test_top_level_modules_are_py_files_and_directories_named_as_identifiers(tmp_path: Path) -> None:
    for name in ("probe.py", "data.txt", "not-a-module.py", "setup.cfg"):
        (tmp_path / name).write_text("")
    for name in ("pkg", "ns", "my-dir", "x.py"):  # a directory named x.py is no module file
        (tmp_path / name).mkdir()
    assert top_level_modules(tmp_path) == ("ns", "pkg", "probe")


def test_a_shipped_handler_is_module_function_inside_the_bundle() -> None:
    assert shipped_handler_error("probe:run", ["probe"]) is None
    assert shipped_handler_error("pkg.sub:run", ["pkg"]) is None
    assert "names its handler as 'module:function'" in str(shipped_handler_error("noop", ["probe"]))
    assert "module 'os' is not in the bundle (its top-level modules: probe)" in str(
        shipped_handler_error("os:system", ["probe"]))
    assert "must be one name" in str(shipped_handler_error("probe:a.b", ["probe"]))
    assert str(shipped_handler_error("probe:a.b", ["probe"])).startswith("custom handler 'probe:a.b'")


def test_the_coordinator_reads_the_same_modules_from_a_manifest_as_the_worker_from_the_tree(tmp_path: Path) -> None:
    files = ["probe.py", "pkg/__init__.py", "ns/sub/mod.py", "data.txt", "9bad.py", "bad-name/x.py", "README",
             "tests/test_a.py", "x.py.txt"]
    for rel in files:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert bundle_modules(files) == top_level_modules(tmp_path) == ("ns", "pkg", "probe", "tests")
