"""What of the submitter's environment travels (bundles/environment.py), read from real
dist-info folders: ``name==version`` per installed distribution, ``distributed_testing`` left
out, a local install inside the shipped tree as ``./dir``, one outside refused naming it; and the
precedence ``dt submit --bundle`` gives it (cli/submit.py): a test task's own list or the
bundle's requirements.txt wins, ``--no-env`` sends none, other kinds get none."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from distributed_testing.bundles.environment import LocalInstallError, capture
from distributed_testing.cli.submit import bundle_environment, with_environment


def _dist(site: Path, name: str, version: str, local: Path | None = None, editable: bool = True) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if local is not None:
        (info / "direct_url.json").write_text(json.dumps({"url": local.as_uri(), "dir_info": {"editable": editable}}))


def test_installed_distributions_travel_pinned_and_local_ones_inside_the_tree_as_dirs(tmp_path: Path) -> None:
    site, tree = tmp_path / "site", tmp_path / "tree"
    (tree / "pkgs" / "mine").mkdir(parents=True)
    _dist(site, "cloudpickle", "3.1.2")
    _dist(site, "pytest", "9.1.1")
    _dist(site, "odd", "r2.x-final")  # not PEP 440: arbitrary equality
    _dist(site, "distributed_testing", "0.1.0", local=tmp_path / "elsewhere")  # the plugin: left out
    _dist(site, "mine", "0.1", local=tree / "pkgs" / "mine")
    _dist(site, "whole", "1.0", local=tree, editable=False)
    assert capture(tree, [str(site)]) == ["./", "./pkgs/mine", "cloudpickle==3.1.2", "odd===r2.x-final", "pytest==9.1.1"]


def test_a_local_install_outside_the_tree_is_refused_naming_it(tmp_path: Path) -> None:
    site, tree = tmp_path / "site", tmp_path / "tree"
    tree.mkdir()
    _dist(site, "helper", "0.1", local=tmp_path / "helper")
    _dist(site, "cloudpickle", "3.1.2")
    with pytest.raises(LocalInstallError, match=r"outside the shipped tree .*helper \(.*/helper\)"):
        capture(tree, [str(site)])


def test_the_first_of_one_name_on_the_path_wins(tmp_path: Path) -> None:
    _dist(tmp_path / "a", "cloudpickle", "3.1.2")
    _dist(tmp_path / "b", "cloudpickle", "2.0.0")
    assert capture(tmp_path, [str(tmp_path / "a"), str(tmp_path / "b")]) == ["cloudpickle==3.1.2"]


def test_dt_submit_gives_the_set_to_test_tasks_without_a_choice_of_their_own(tmp_path: Path) -> None:
    python = ["cloudpickle==3.1.2", "pytest==9.1.1"]
    doc = [{"type": "test", "config": {}}, {"type": "test", "requirements": {"python": ["numpy"], "tags": ["x"]}},
           {"type": "test", "requirements": {"tags": ["x"]}}, {"type": "custom", "config": {}}]
    assert with_environment(doc, python) == [
        {"type": "test", "config": {}, "requirements": {"python": python}},
        {"type": "test", "requirements": {"python": ["numpy"], "tags": ["x"]}},  # its own list
        {"type": "test", "requirements": {"tags": ["x"], "python": python}},
        {"type": "custom", "config": {}}]  # runs this package's runner beside the worker's packages
    assert with_environment({"type": "test"}, []) == {"type": "test"}
    (tmp_path / "requirements.txt").write_text("numpy\n")
    assert bundle_environment(tmp_path, no_env=False) == []  # the bundle's file chooses; the worker reads it
    assert bundle_environment(tmp_path / "requirements.txt", no_env=True) == []


@pytest.mark.parametrize("module", ["distributed_testing.worker.executors.pytest_report",
                                    "distributed_testing.tasks.pytest_marker"])
def test_the_plugins_a_shipped_run_loads_import_only_the_standard_library_and_pytest(module: str) -> None:
    """They load where this package and its dependencies are absent (worker/executors/test.py)."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{module}: a relative import"
            roots.add((node.module or "").split(".")[0])
    assert roots - set(sys.stdlib_module_names) - {"__future__", "pytest"} == set(), roots
